"""Programmatic dependent launch (PDL) for the Triton kernels of a step (imported by kernel
modules only: a CPU server never loads Triton).

Back-to-back kernels on one stream normally run strictly one after the other: the next grid
launches only once the last program of the previous one has finished and its writes are
flushed. A decode step at batch 1 is ~350 such kernels, most of them a few microseconds long,
so the launch latency and each kernel's ramp-up and tail add up to a tenth of the step. With
PDL (Hopper and later), a kernel launched with ``launch_pdl`` may start while its predecessor
still runs: its programs do the work that reads nothing the predecessor writes (loading a
layer's weights, computing addresses), then wait (:func:`pdl_wait`, ``griddepcontrol.wait``)
for the predecessor to complete and flush before they read its outputs or write anything.
:func:`pdl_trigger` (``griddepcontrol.launch_dependents``) lets the successor launch as soon as
every program of this kernel has issued it, instead of when they exit.

The contract for a kernel launched with :func:`launch_options`:

- every program calls :func:`pdl_wait` exactly once on every path, before its first read of
  anything an earlier kernel of the stream may write and before its first store (so a
  kernel never completes before its predecessor does, which keeps the ordering transitive:
  kernel N+2 waiting for N+1 also waits for N);
- before the wait it may only read memory that nothing writes once the step's kernels have
  started: weights, constant tables, and the batch's own inputs (positions, lengths, the slot
  table, the cache rows to write), which the host copies in before the step's first kernel.
  A kernel that never calls :func:`pdl_trigger` (any torch kernel) lets its successor start
  only when it has completed, so what earlier torch kernels wrote is complete too. One
  pattern goes further: a kernel that calls :func:`pdl_trigger` only *after* its own wait
  lets its successor launch only once every kernel before it has completed, so the successor
  may read what those kernels wrote before its wait. It must read it again after the wait if
  it computes with it (the MoE down projection reads the router's expert ids early only to
  ask that expert's weights into L2: a prefetch is a hint, so nothing but speed depends on
  the early read).

Kernels take the flag as a ``PDL: tl.constexpr`` argument (``pdl_enabled(device)``); where it is
off, both helpers compile to nothing and the launch is the usual one. ``ENGINE_PDL=0`` turns it
off everywhere (for comparisons).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@functools.lru_cache(maxsize=None)
def _supported(index: int) -> bool:
    """Device ``index`` is Hopper or later and this Triton can launch with PDL."""
    if torch.cuda.get_device_capability(index)[0] < 9:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return ("launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})
            and hasattr(tl.extra.cuda, "gdc_wait"))


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with PDL (a CUDA device of compute capability 9
    or more, unless ``ENGINE_PDL=0``; never under the Triton interpreter)."""
    if device.type != "cuda" or os.environ.get("ENGINE_PDL", "1") == "0":
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _supported(device.index if device.index is not None else torch.cuda.current_device())


def launch_options(device: torch.device) -> dict:
    """Keyword arguments of a launch: ``PDL`` (the kernel's constexpr) and, where it is on,
    ``launch_pdl``."""
    if pdl_enabled(device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait until the previous kernel of the stream has completed and its writes are visible
    (nothing without PDL)."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_trigger(PDL: tl.constexpr):
    """Let the next kernel of the stream launch once every program has got here (nothing
    without PDL)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs, PDL: tl.constexpr, KEEP: tl.constexpr = False):
    """Ask for the 128-byte lines at ``ptrs`` (any shape; one address per line is enough) to be
    brought into the L2 cache, without waiting for them: a kernel's first weight tiles, issued
    before :func:`pdl_wait` so that their reads overlap the previous kernel's tail (nothing
    without PDL). KEEP: with the eviction priority ``evict_last`` (the last lines the L2 lets
    go), for lines asked for well ahead of their use."""
    if PDL:
        if KEEP:
            tl.inline_asm_elementwise("mov.b32 $0, 0;\n\tprefetch.global.L2::evict_last [$1];",
                                      "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise("mov.b32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l",
                                      [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def line_offsets(ptr, N: tl.constexpr):
    """Element offsets of the 128-byte lines that cover ``N`` elements of ``ptr``'s type from
    a line's start: one address per line for :func:`prefetch_l2`."""
    LINE: tl.constexpr = 1024 // ptr.dtype.element_ty.primitive_bitwidth
    return tl.arange(0, max(1, N // LINE)) * LINE


# ---------------------------------------------------------------- weights into L2 ahead of use

#: bytes one bulk prefetch asks for, and bulk prefetches one program issues (one a thread of
#: its one warp): 512 KiB a program, so a 32 MiB weight is asked for by 64 programs
PREFETCH_CHUNK = 16384
PREFETCH_PER_PROGRAM = 32


@triton.jit
def _l2_prefetch(ptr, nbytes, CHUNK: tl.constexpr, PER_PROGRAM: tl.constexpr,
                 PDL: tl.constexpr):
    """Ask the L2 cache for bytes ``[0, nbytes)`` of ``ptr`` (16-byte aligned, ``nbytes`` a
    multiple of 16), CHUNK bytes per bulk prefetch (``cp.async.bulk.prefetch.L2``), without
    waiting for them; then wait for the previous kernel (the PDL contract: this kernel never
    completes before its predecessor, so the ordering of the stream stays transitive)."""
    pdl_trigger(PDL)
    offs = (tl.program_id(0) * PER_PROGRAM + tl.arange(0, PER_PROGRAM)).to(tl.int64) * CHUNK
    size = tl.minimum(nbytes - offs, CHUNK).to(tl.int32)
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.gt.s32 p, $2, 0;\n\tmov.b32 $0, 0;\n\t"
        "@p cp.async.bulk.prefetch.L2.global [$1], $2;\n\t}",
        "=r,l,r", [ptr + offs, size], dtype=tl.int32, is_pure=False, pack=1)
    pdl_wait(PDL)


def l2_prefetch_enabled(device: torch.device) -> bool:
    """Whether :func:`l2_prefetch` launches anything on ``device``: with PDL on (Hopper: the
    bulk prefetch is an sm_90 instruction, and only a kernel that starts while its predecessor
    runs overlaps anything) and ``ENGINE_L2_PREFETCH=1``."""
    return os.environ.get("ENGINE_L2_PREFETCH") == "1" and pdl_enabled(device)


def l2_prefetch(tensors) -> None:
    """Ask the L2 cache for ``tensors`` (weights a later kernel of the stream reads: constants
    of the step), in one small kernel each, launched with PDL so that it runs beside the
    kernels before it. A decode step's attention reads little memory; the output projection's
    weights asked for before it arrive while it runs, and the projection then reads them from
    L2. A hint: nothing but speed depends on it. Nothing is launched unless
    :func:`l2_prefetch_enabled` (the caller may ask first, before it gathers the tensors);
    tensors under 1 MiB are skipped."""
    for t in tensors:
        if not l2_prefetch_enabled(t.device):
            return  # (one device: the step's weights)
        nbytes = (t.numel() * t.element_size()) // 16 * 16
        if nbytes < (1 << 20) or t.data_ptr() % 16 or not t.is_contiguous():
            continue
        per = PREFETCH_CHUNK * PREFETCH_PER_PROGRAM
        _l2_prefetch[(triton.cdiv(nbytes, per),)](
            t.view(-1).view(torch.uint8) if t.dtype != torch.uint8 else t.view(-1), nbytes,
            CHUNK=PREFETCH_CHUNK, PER_PROGRAM=PREFETCH_PER_PROGRAM, num_warps=1,
            **launch_options(t.device))
