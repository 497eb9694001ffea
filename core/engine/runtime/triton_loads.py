"""Loads a Triton kernel issues itself, outside the software pipeliner (imported by kernel
modules only: a CPU server never loads Triton).

A loop whose tiles are read at addresses taken from a table (the paged KV pool: a key tile's
slot comes from ``req_to_token``) gives the pipeliner two chained loads per iteration. It then
spends a stage of the pipeline on the table entry and keeps the tile loads only one iteration
ahead, with two buffers, whatever ``num_stages`` asks for: the sm_90 TTGIR of the extend kernel
showed double-buffered K/V where the same loop over contiguous K/V gets three buffers.
:func:`index_load` reads the table entry with an inline non-coherent load that the pipeliner
does not treat as a load: the entry is read where the tile load needs it (after the
iteration's last matrix product is issued, so its latency overlaps that product), and the
tile loads are pipelined ``num_stages - 1`` iterations ahead as for a contiguous tensor.

Only for memory that nothing writes while the kernel runs (a slot table the host filled
before the step); under PDL, only after :func:`engine.runtime.triton_pdl.pdl_wait`.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def index_load(ptrs, ASM: tl.constexpr):
    """The 32- or 64-bit integers at ``ptrs`` (any shape, no mask: every address valid). ASM:
    inline ``ld.global.nc``, invisible to the pipeliner (a CUDA device); else ``tl.load`` (the
    interpreter)."""
    if ASM:
        if ptrs.dtype.element_ty.primitive_bitwidth == 64:
            return tl.inline_asm_elementwise("ld.global.nc.b64 $0, [$1];", "=l,l", [ptrs],
                                             dtype=tl.int64, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise("ld.global.nc.b32 $0, [$1];", "=r,l", [ptrs],
                                             dtype=tl.int32, is_pure=True, pack=1)
    else:
        return tl.load(ptrs)
