"""Triton helpers for plugins' kernels (imported by a plugin's kernel module only: a CPU server
never loads Triton).

``fp8_from_bits(x, FP8)``: fp8 tensors travel to kernels as their uint8 bit patterns (so masked
loads can fill zeros, which Triton cannot cast to fp8); this turns loaded bits back into the fp8
type ``FP8`` names (1: e4m3, 2: e5m2; 0: ``x`` unchanged). ``fp8_kind(dtype)`` is that flag for a
torch dtype.

Programmatic dependent launch (:mod:`engine.runtime.triton_pdl`, whose docstring states the
contract): a kernel that takes ``PDL: tl.constexpr`` calls ``pdl_trigger(PDL)`` early and
``pdl_wait(PDL)`` once on every path before it reads what earlier kernels write or stores
anything, and is launched with ``**launch_options(device)``; ``prefetch_l2(ptrs, PDL)`` asks
for weight lines ahead of the wait, ``line_offsets(ptr, N)`` the offsets of the lines that
cover N elements (one address each).

``store_group_codes(v, q_ptrs, ok, s_ptrs, s_ok, FP8, QMAX, MANT, EMIN, GRID)`` quantizes float32
``v`` [groups, group] per row into fp8 codes and scales as ``quant_triton.quant_groups`` does (bit
for bit: the kernel writing a layer's input as :class:`engine.api.attention.GroupCodes`);
``group_code_buffers(m, k, dtype, group, device)`` allocates its codes and scales and gives those
constexprs for a launch.

``mma_layout(warps)``: the accumulator layout of ``mma.sync`` m16n8k16 with the warps over its
rows; ``words_layout(warps, mr)``: the Gluon layout in which a
thread's two 16-byte loads of a row block are the weight operand of ``mma.sync`` m16n8k16 as
loaded (:mod:`engine.runtime.affine_mma`): [16 warps mr rows, 4, 8], lane ``4 g + t`` holding
rows g and g + 8 of its warp's 16-row block, elements 8 t .. 8 t + 7 of a 32-element chunk
(both None where this Triton has no Gluon).

``index_load(ptrs, ASM)`` (:mod:`engine.runtime.triton_loads`): a table entry that a pipelined
loop's tile loads take their addresses from, read outside the software pipeliner so that the
tile loads keep ``num_stages - 1`` iterations ahead.
"""

from engine.runtime.affine_mma import mma_layout, words_layout
from engine.runtime.quant_triton import _store_group_codes as store_group_codes
from engine.runtime.quant_triton import fp8_from_bits, fp8_kind, group_code_buffers
from engine.runtime.triton_loads import index_load
from engine.runtime.triton_pdl import (launch_options, line_offsets, pdl_enabled, pdl_trigger,
                                       pdl_wait, prefetch_l2)

__all__ = ["fp8_from_bits", "fp8_kind", "group_code_buffers", "index_load", "launch_options",
           "line_offsets", "mma_layout", "pdl_enabled", "pdl_trigger", "pdl_wait", "prefetch_l2",
           "store_group_codes", "words_layout"]
