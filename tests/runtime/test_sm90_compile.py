"""The GPU kernels compiled for sm_90 (Hopper) without a GPU: Triton's NVIDIA backend and its
bundled ptxas build them here exactly as they are built on the H200 (the same front end, the
same software pipeliner), so an error that the interpreter never sees (a constexpr argument
that does not reach a nested ``@triton.jit`` call, a type the code generator refuses) fails
here, and properties of the compiled loop (how many K/V tiles the extend kernel keeps in
flight) are checked on the TTGIR. Skipped where the installed Triton lacks the NVIDIA backend.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import pytest

triton = pytest.importorskip("triton")
compiler = pytest.importorskip("triton.compiler")
try:
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    TOOLS = (triton.knobs.nvidia.ptxas.path, triton.knobs.nvidia.cuobjdump.path)
except Exception as exc:  # noqa: BLE001 - any missing piece: no sm_90 build here
    pytest.skip(f"no NVIDIA backend in this Triton: {exc}", allow_module_level=True)
if not all(tool and shutil.which(tool) for tool in TOOLS):
    pytest.skip("Triton's bundled ptxas or cuobjdump is missing", allow_module_level=True)

SM90 = GPUTarget("cuda", 90, 32)
#: pointer arguments' types; any other non-constexpr argument is an i32 (strides, sizes)
#: or, for these names, an fp32
FLOATS = {"scale", "v_scale", "eps"}


def build(kernel, types: dict[str, str], constexprs: dict, warps: int = 4, stages: int = 3):
    """``kernel`` compiled for sm_90 with launch-time PDL (the compiled kernel)."""
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = types.get(name, "fp32" if name in FLOATS else "i32")
    src = compiler.ASTSource(fn=kernel, signature=sig, constexprs=constexprs)
    compiled = triton.compile(src, target=SM90, options={
        "num_warps": warps, "num_stages": stages, "launch_pdl": True})
    return compiled


def stack_bytes(compiled) -> int:
    """Bytes of local memory (register spills) a thread of the compiled kernel uses."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(compiled.asm["cubin"])
        usage = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage",
                                path], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"STACK:(\d+)", usage).group(1))


def kv_buffers(compiled, rows: int, dim: int) -> list[int]:
    """Depths of the shared-memory rings of [rows, dim] bf16 tiles the pipeliner made."""
    ring = rf"local_alloc : \(\) -> !ttg.memdesc<(\d+)x{rows}x{dim}xbf16"
    return [int(n) for n in re.findall(ring, compiled.asm["ttgir"])]


@pytest.fixture(scope="module")
def attention():
    from engine_attention_triton import kernels

    return kernels


ATTN_PTRS = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*bf16",
             "req_to_token_ptr": "*i64", "req_pool_ptr": "*i64", "seq_lens_ptr": "*i64",
             "prefix_lens_ptr": "*i64", "extend_lens_ptr": "*i64", "qo_start_ptr": "*i64",
             "tile_req_ptr": "*i32", "tile_start_ptr": "*i32", "tree_ptr": "*u8",
             "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "cnt_ptr": "*i32",
             "k_desc": "*bf16", "v_desc": "*bf16"}


@pytest.mark.parametrize("fused, fp8", [(False, 0), (True, 0), (False, 1)])
def test_decode_kernels_build(attention, fused, fp8):
    kv = "*u8" if fp8 else "*bf16"
    build(attention._decode_split_kernel, {**ATTN_PTRS, "k_ptr": kv, "v_ptr": kv}, dict(
        GROUP=4, HEAD_DIM=128, NUM_SPLITS=8, BLOCK_H=16, BLOCK_D=128, BLOCK_N=64,
        FIXED_TILE=False, DOT_PREC=None, KV_FP8=fp8, FUSED_MERGE=fused, PDL=True))
    build(attention._decode_merge_kernel, ATTN_PTRS, dict(
        GROUP=4, HEAD_DIM=128, NUM_SPLITS=8, BLOCK_G=16, BLOCK_D=128, BLOCK_N=64,
        FIXED_TILE=False, PDL=True))


def _extend(attention, page: int, tma: bool, heads: int, index_asm: bool, tree: bool = False,
            splits: int = 1, bm: int = 64, bn: int = 64, off32: bool = True):
    types = dict(ATTN_PTRS)
    if tma:
        types["k_desc"] = types["v_desc"] = f"tensordesc<bf16[{bn}, 128]>"
    return build(attention._extend_kernel, types, dict(
        GROUP=4, HEAD_DIM=128, TILE_TOKENS=bm // (heads or 4), BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_D=128, DOT_PREC=None, HAS_TREE=tree, KV_FP8=0, NUM_SPLITS=splits, PAGE=page,
        TMA=tma, ROW_HEADS=heads, LAZY=False, INDEX_ASM=index_asm, OFF32=off32,
        PDL=True))


def test_extend_keeps_num_stages_key_tiles_in_flight(attention):
    """The default launch of 64-key pages (tensor descriptors): a whole key tile takes its slot
    from the page table; read by ``index_load`` the pipeliner keeps 3 K and 3 V tiles (3
    stages) in flight, as over contiguous K/V; read by ``tl.load`` it spends a stage on the
    table entry and keeps 2. The pointer launches build either way."""
    inline = kv_buffers(_extend(attention, 64, True, 1, True), 64, 128)
    plain = kv_buffers(_extend(attention, 64, True, 1, False), 64, 128)
    assert inline and max(inline) == 3, inline
    assert plain and max(plain) == 2, plain
    for page in (64, 16):
        for index_asm in (True, False):
            _extend(attention, page, False, 0, index_asm, off32=index_asm)


def test_extend_offsets_in_32_bits_keep_the_default_page_64_launch_in_registers(attention):
    """Offsets of 32 bits (buffers under 2^31 elements) for the query rows and gathered K/V
    rows: the page-64 default launch (64 x 64, one head, descriptors, masked diagonal tiles
    through descriptors too) spills next to nothing, against hundreds of bytes with 64-bit
    offsets."""
    short = stack_bytes(_extend(attention, 64, True, 1, True))
    wide = stack_bytes(_extend(attention, 64, True, 1, True, off32=False))
    assert short <= 32 < wide, (short, wide)


def test_extend_tree_and_split_kernels_build(attention):
    _extend(attention, 16, False, 0, True, tree=True, splits=2, bm=16, bn=32)
    build(attention._extend_merge_kernel, ATTN_PTRS, dict(
        GROUP=4, HEAD_DIM=128, NUM_SPLITS=4, BLOCK_G=4, BLOCK_D=128, PDL=True))


@pytest.mark.parametrize("prefetch", [False, True])
def test_moe_pair_kernels_build(prefetch):
    from engine_moe_triton import kernels

    types = {"x_ptr": "*bf16", "gu_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16",
             "ids_ptr": "*i32", "weights_ptr": "*fp32", "down_ptr": "*bf16"}
    build(kernels._pair_gemv_up, types, dict(TOP_K=8, BLOCK_N=16, BLOCK_K=256, ACC2D=False,
                                             PDL=True))
    build(kernels._pair_gemv_down, types, dict(BLOCK_N=16, BLOCK_K=256, ACC2D=False,
                                               PREFETCH=prefetch, PDL=True))
    build(kernels._combine_pairs, types, dict(TOP_K=8, BLOCK=1024, PDL=True))
