"""The GPU kernels compiled for sm_90 (Hopper) without a GPU: Triton's NVIDIA backend and its
bundled ptxas build them here exactly as they are built on the H200 (the same front end, the
same software pipeliner), so an error that the interpreter never sees (a constexpr argument
that does not reach a nested ``@triton.jit`` call, a type the code generator refuses) fails
here, and properties of the compiled loop (how many K/V tiles the extend kernel keeps in
flight, how much it spills) are checked on the TTGIR and the cubin. The plugins' kernels are
built from stated argument types; the core's through their Python wrappers, called on CPU
tensors with every launch recorded instead of run and then built with PDL on (as on the
H200). Skipped where the installed Triton lacks the NVIDIA backend.
"""

from __future__ import annotations

import inspect
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


def build(kernel, types: dict[str, str], constexprs: dict, warps: int = 4, stages: int = 3,
          aligned: set[str] | None = None):
    """``kernel`` compiled for sm_90 with launch-time PDL (the compiled kernel; constexprs not in
    ``constexprs`` at their defaults). The arguments
    ``aligned`` names (by default the pointers and the ``stride*`` integers) are marked
    multiples of 16, as a launch on the GPU specializes them (torch's allocations are
    aligned, and the strides of these layouts are multiples of 16): without that, stores and
    loads are built one element at a time."""
    sig, attrs = {}, {}
    # constexprs not given take the kernel's defaults, as a launch that leaves them out does
    constexprs = {**{p.name: p.default for p in kernel.params
                     if p.is_constexpr and p.default is not inspect.Parameter.empty},
                  **constexprs}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        sig[name] = types.get(name, "fp32" if name in FLOATS else "i32")
        if aligned is None:
            marked = sig[name].startswith("*") or (sig[name] == "i32"
                                                   and name.startswith("stride"))
        else:
            marked = name in aligned
        if marked:
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = compiler.ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=SM90, options={
        "num_warps": warps, "num_stages": stages, "launch_pdl": True})


def cuobjdump(compiled, flag: str) -> str:
    """What ``cuobjdump flag`` prints for the compiled kernel's cubin."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(compiled.asm["cubin"])
        return subprocess.run([triton.knobs.nvidia.cuobjdump.path, flag, path],
                              capture_output=True, text=True, check=True).stdout


def stack_bytes(compiled) -> int:
    """Bytes of local memory (register spills) a thread of the compiled kernel uses."""
    usage = cuobjdump(compiled, "--dump-resource-usage")
    return int(re.search(r"STACK:(\d+)", usage).group(1))


def sass_ops(compiled) -> list[str]:
    """The opcodes (with their modifiers) of the compiled kernel's SASS, in order."""
    text = cuobjdump(compiled, "--dump-sass")
    return re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text,
                      re.M)


def sass_loops(compiled) -> list[list[str]]:
    """The opcodes (with their modifiers) of each loop of the compiled kernel's SASS (the
    instructions from a backward branch's target to the branch), in the order of the
    branches."""
    text = cuobjdump(compiled, "--dump-sass")
    lines = [line for line in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", line).group(1), 16) for line in lines]
    ops = [re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", q).group(1) for q in lines]
    loops = []
    for i, line in enumerate(lines):
        jump = re.search(r"BRA\s+(?:!?U?P\w+,\s*)?(0x[0-9a-f]+)", line)
        if jump and int(jump.group(1), 16) < addr[i]:
            loops.append(ops[addr.index(int(jump.group(1), 16)):i + 1])
    return loops


def loop_ops(compiled, product: str = "GMMA") -> list[str]:
    """The opcodes (with their modifiers) of the compiled kernel's longest loop that holds
    warp-group products (the K loop of the swapped 8-bit kernel; ``product="MMA"``: any
    matrix product, the synchronous ones too)."""
    loops = [body for body in sass_loops(compiled) if any(product in op for op in body)]
    return max(loops, key=len, default=[])


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
             "k_desc": "*bf16", "v_desc": "*bf16", "codes_ptr": "*u8", "scales_ptr": "*fp32"}


@pytest.mark.parametrize("fused, fp8, fp4, preload", [
    (False, 0, False, True), (False, 0, False, False), (True, 0, False, True),
    (False, 1, False, True), (False, 0, True, False)])
def test_decode_kernels_build(attention, fused, fp8, fp4, preload):
    """The decode kernels build for sm_90; with the first key tile read before the wait
    (PRELOAD, the default) without register spills."""
    kv = "*u8" if fp8 or fp4 else "*bf16"
    split = build(attention._decode_split_kernel, {**ATTN_PTRS, "k_ptr": kv, "v_ptr": kv}, dict(
        GROUP=4, HEAD_DIM=128, NUM_SPLITS=8, BLOCK_H=16, BLOCK_D=128, BLOCK_N=64,
        FIXED_TILE=False, DOT_PREC=None, KV_FP8=fp8, FUSED_MERGE=fused, PDL=True,
        KV_FP4=fp4, PRELOAD=preload))
    if preload:
        assert stack_bytes(split) == 0
    build(attention._decode_merge_kernel, ATTN_PTRS, dict(
        GROUP=4, HEAD_DIM=128, NUM_SPLITS=8, BLOCK_G=16, BLOCK_D=128, BLOCK_N=64,
        FIXED_TILE=False, PDL=True))


def test_decode_merge_writing_fp8_codes_builds(attention):
    """The decode merge writing its output as fp8 codes per head (a block fp8 output
    projection's input) builds for sm_90 without spills, and still has no loop."""
    compiled = build(attention._decode_merge_kernel, ATTN_PTRS, dict(
        GROUP=4, HEAD_DIM=128, NUM_SPLITS=8, BLOCK_G=16, BLOCK_D=128, BLOCK_N=64,
        FIXED_TILE=False, PDL=True, CODES=True, FP8=1, QMAX=448.0, MANT=3, EMIN=-6,
        GRID=False))
    assert stack_bytes(compiled) == 0 and not sass_loops(compiled)


def test_decode_merge_asks_for_every_split_at_once(attention):
    """The decode merge (8 splits, a GQA group of 8) reads the request's length before its
    wait and has no loop: every split's partials are asked for before the first is folded."""
    compiled = build(attention._decode_merge_kernel, ATTN_PTRS, dict(
        GROUP=8, HEAD_DIM=128, NUM_SPLITS=8, BLOCK_G=8, BLOCK_D=128, BLOCK_N=64,
        FIXED_TILE=False, PDL=True))
    ops = sass_ops(compiled)
    wait = ops.index("ACQBULK")
    assert any(op.startswith("LDG") for op in ops[:wait])  # the length, over the wait
    assert not sass_loops(compiled)
    first_exp = next(i for i, op in enumerate(ops) if op.startswith("MUFU.EX2"))
    assert sum(op.startswith("LDG") for op in ops[wait:first_exp]) >= 8


def _extend(attention, page: int, tma: bool, heads: int, index_asm: bool, tree: bool = False,
            splits: int = 1, bm: int = 64, bn: int = 64, off32: bool = True,
            new_kv: bool = False, q_desc: bool = False,
            fp4: bool = False):
    types = dict(ATTN_PTRS)
    if fp4:
        types["k_ptr"] = types["v_ptr"] = "*u8"
    if tma:
        types["k_desc"] = types["v_desc"] = f"tensordesc<bf16[{bn}, 128]>"
    types["kn_desc"] = types["vn_desc"] = (f"tensordesc<bf16[{bn}, 128]>" if new_kv
                                           else "*bf16")
    rows = heads or 4
    box = f"tensordesc<bf16[{bm // rows}, {rows}, 128]>"
    types["qn_desc"] = box if q_desc else "*bf16"
    return build(attention._extend_kernel, types, dict(
        GROUP=4, HEAD_DIM=128, TILE_TOKENS=bm // (heads or 4), BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_D=128, DOT_PREC=None, HAS_TREE=tree, KV_FP8=0, NUM_SPLITS=splits, PAGE=page,
        TMA=tma, ROW_HEADS=heads, LAZY=False, INDEX_ASM=index_asm, OFF32=off32,
        NEW_KV=new_kv, Q_DESC=q_desc, PDL=True, KV_FP4=fp4))


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


def test_extend_default_page_64_launch_stays_in_registers(attention):
    """The page-64 default launch (64 x 64, one head, descriptors, masked diagonal tiles
    through descriptors too) spills nothing, with offsets of 32 bits (buffers under 2^31
    elements) or of 64."""
    assert stack_bytes(_extend(attention, 64, True, 1, True)) == 0
    assert stack_bytes(_extend(attention, 64, True, 1, True, off32=False)) == 0


@pytest.mark.parametrize("page, tma", [(1, False), (16, False), (64, True)])
def test_extend_reading_the_new_kv_as_rows_builds_and_pipelines(attention, page, tma):
    """This forward's K/V through row descriptors (any page size; the prefix through the
    pool): the new keys' loop keeps 3 K/V tiles in flight, like the contiguous kernel."""
    compiled = _extend(attention, page, tma, 1, True, new_kv=True)
    assert 3 in kv_buffers(compiled, 64, 128)


@pytest.mark.parametrize("heads, bn", [(1, 64), (0, 32)])
def test_extend_loading_the_query_tile_through_a_descriptor_builds(attention, heads, bn):
    """The query tile as one [tokens, heads, D] box of q (one head a tile, and the GQA group's
    four): builds, keeps 3 new K/V tiles in flight, and spills no more than the pointer
    load of the tile does (one head a tile over pages of 16: 32 bytes against 80 with
    Triton 3.9)."""
    compiled = _extend(attention, 16, False, heads, True, bn=bn, new_kv=True, q_desc=True)
    assert 3 in kv_buffers(compiled, bn, 128)
    pointers = _extend(attention, 16, False, heads, True, bn=bn, new_kv=True)
    assert stack_bytes(compiled) <= stack_bytes(pointers)


def test_extend_stores_its_output_tile_whole_rows_at_a_time(attention):
    """The page-16 default launch (the group's heads, new K/V as rows, the query tile through
    a descriptor) stores its output in 16-byte pieces (built as the GPU specializes aligned
    pointers and strides: one element a store otherwise)."""
    ops = sass_ops(_extend(attention, 16, False, 0, True, bn=32, new_kv=True, q_desc=True))
    stores = [op for op in ops if op.startswith("STG")]
    assert stores and set(stores) == {"STG.E.128"}, sorted(set(stores))


def test_extend_tree_and_split_kernels_build(attention):
    _extend(attention, 16, False, 0, True, tree=True, splits=2, bm=16, bn=32)
    # an fp4_mx_block16 pool (rows unpacked in registers): slot by slot, whole pages a tile
    for page, bn in ((1, 32), (64, 64)):
        _extend(attention, page, False, 0, True, bn=bn, fp4=True)
    build(attention._extend_merge_kernel, ATTN_PTRS, dict(
        GROUP=4, HEAD_DIM=128, NUM_SPLITS=4, BLOCK_G=4, BLOCK_D=128, PDL=True))


def test_sampling_passes_ask_for_several_blocks_at_once():
    """The sampling kernel at a large vocabulary (2048-column blocks, 8 warps, float32
    logits): with UNROLL 8 (the default) each of its passes' loops asks for 8 blocks a trip
    (8 times the loads of one block a trip), without spilling registers."""
    from engine.runtime import sample_triton

    types = {"logits_ptr": "*fp32", "temp_ptr": "*i64", "topk_ptr": "*i64", "topp_ptr": "*i64",
             "minp_ptr": "*i64", "seed_ptr": "*i64", "pos_ptr": "*i64", "out_ptr": "*i64"}
    loads = {}
    for unroll in (1, sample_triton.UNROLL):
        compiled = build(sample_triton._sample_rows, types, dict(
            GREEDY=sample_triton.GREEDY_TEMPERATURE, BLOCK=2048, UNROLL=unroll), warps=8)
        assert stack_bytes(compiled) == 0
        loads[unroll] = [sum(op.startswith("LDG") for op in body)
                         for body in sass_loops(compiled)]
    assert sample_triton.UNROLL == 8 and len(loads[8]) == len(loads[1]) >= 4
    assert all(n == 8 * m for n, m in zip(loads[8], loads[1]))


def test_moe_down_over_whole_tiles_is_shorter():
    """The one-token down projection of Qwen3-30B-A3B's shape (768 inputs) over six unrolled
    [16, 128] tiles with no masks (``TILES``, the ``even_down`` launch: no prefetch) builds
    without spills, with no loop, in well under half the instructions per weight of the
    whole-row launch (8 outputs, a [8, 1024] tile with the columns past 768 masked, its rows
    prefetched before the wait)."""
    from engine_moe_triton import kernels

    types = {"gu_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "ids_ptr": "*i32",
             "weights_ptr": "*fp32"}
    common = dict(ACC2D=False, NEXT=False, EVICT="evict_first", KEEP=False, PDL=True)
    tiles = build(kernels._pair_gemv_down, types, dict(BLOCK_N=16, BLOCK_K=128, TILES=6,
                                                       PREFETCH=False, **common))
    rows = build(kernels._pair_gemv_down, types, dict(BLOCK_N=8, BLOCK_K=1024, PREFETCH=True,
                                                      **common))
    assert stack_bytes(tiles) == 0
    body = [op for op in sass_ops(tiles) if op != "NOP"]
    assert sass_loops(tiles) == []
    per_weight = len(body) / (16 * 768)
    before = len([op for op in sass_ops(rows) if op != "NOP"]) / (8 * 768)
    assert per_weight < 0.45 * before, (per_weight, before)


def _build_gluon(kernel, consts: dict, warps: int, floats: tuple[str, ...] = ()):
    """A Gluon ``kernel`` compiled for sm_90: pointers bf16 (``ids_ptr`` int32, ``floats``
    float32), other arguments i32, all marked multiples of 16 as a launch specializes them
    (``consts``: the constexprs)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {name: "constexpr" if name in consts else "*bf16" if name.endswith("_ptr") else "i32"
           for name in kernel.arg_names}
    sig.update({name: "*fp32" for name in floats})
    if "ids_ptr" in sig:
        sig["ids_ptr"] = "*i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if name not in consts}
    return triton.compile(GluonASTSource(fn=kernel, signature=sig, constexprs=consts,
                                         attrs=attrs), target=SM90, options={"num_warps": warps})


def _prefetched_first(ops: list[str], lines: int) -> None:
    """``lines`` L2 prefetches (``CCTL...PF2``), all before the first weight load (ptxas puts
    each chunk's loads next to its products, so the later chunks' lines are asked for
    first)."""
    prefetches = [i for i, op in enumerate(ops) if op.startswith("CCTL") and "PF2" in op]
    assert len(prefetches) == lines, [op for op in ops if op.startswith("CCTL")]
    first_load = next(i for i, op in enumerate(ops) if op.startswith("LDG.E.EF.128"))
    assert all(i < first_load for i in prefetches)


@pytest.mark.parametrize("mr,warps", [(1, 4), (2, 8), (1, 1)])
def test_moe_down_on_the_matrix_unit_builds(mr, warps):
    """The one-token down projection on the matrix unit (``token_mma._down_mma``, Gluon) at
    Qwen3-30B-A3B's 2048 x 768 experts: its changes of layout from the 16-byte loads to both
    operands are free (the build fails otherwise), the chunks are unrolled (no loop), nothing
    spills, each warp's slice of the 768 inputs is 2 matrix instructions a chunk for each of
    its 16-row blocks, the weights come by 16-byte loads with the eviction policy (the lines
    past a row's first two chunks asked into L2 before any of them), and the
    kernel spends under 60 % of the warp instructions a weight of the CUDA-core launch it would
    replace (``_pair_gemv_down`` over six unrolled [16, 128] tiles, 4 warps)."""
    from engine_moe_triton import kernels, token_mma

    if not token_mma.available():
        pytest.skip("this Triton has no Gluon")
    compiled = _build_gluon(token_mma._down_mma, {"I": 768, "MR": mr, "EVICT": "evict_first",
                                                  "PF": True, "PDL": True}, warps, ("wts_ptr",))
    assert stack_bytes(compiled) == 0 and sass_loops(compiled) == []
    ops = [op for op in sass_ops(compiled) if op != "NOP"]
    chunks = 768 // 32 // warps
    assert sum(op.startswith("HMMA.16816.F32.BF16") for op in ops) == 2 * mr * chunks
    assert sum(op.startswith("LDG.E.EF.128") for op in ops) == 2 * mr * chunks
    _prefetched_first(ops, 2 * mr * len(range(2, chunks, 2)))
    assert "griddepcontrol.wait" in compiled.asm["ptx"]
    types = {"gu_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "ids_ptr": "*i32",
             "weights_ptr": "*fp32"}
    tiles = build(kernels._pair_gemv_down, types, dict(
        BLOCK_N=16, BLOCK_K=128, TILES=6, PREFETCH=False, ACC2D=False, NEXT=False,
        EVICT="evict_first", KEEP=False, PDL=True))
    # warp instructions a weight (a program's instructions run once a warp)
    before = len([op for op in sass_ops(tiles) if op != "NOP"]) * 4 / (16 * 768)
    per_weight = len(ops) * warps / (16 * mr * 768)
    assert per_weight < 0.6 * before, (per_weight, before)


@pytest.mark.parametrize("mr,warps", [(2, 8), (2, 16), (4, 8)])
def test_moe_up_on_the_matrix_unit_builds(mr, warps):
    """The one-token up projection on the matrix unit (``token_mma._up_mma``) at
    Qwen3-30B-A3B's 2048 inputs: free changes of layout, no loop, no spills, 2 matrix
    instructions a chunk for each 16-row block of a warp's slice, 16-byte loads of the weights
    with the eviction policy (the later lines asked into L2 first); the activation's SiLU
    takes one exponential and one reciprocal for each feature a thread holds (at most MR / 2
    of them)."""
    from engine_moe_triton import token_mma

    if not token_mma.available():
        pytest.skip("this Triton has no Gluon")
    compiled = _build_gluon(token_mma._up_mma, {"H": 2048, "I": 768, "TOP_K": 8, "MR": mr,
                                                "EVICT": "evict_first", "PF": True,
                                                "PDL": True}, warps)
    assert stack_bytes(compiled) == 0 and sass_loops(compiled) == []
    ops = sass_ops(compiled)
    chunks = 2048 // 32 // warps
    assert sum(op.startswith("HMMA.16816.F32.BF16") for op in ops) == 2 * mr * chunks
    assert sum(op.startswith("LDG.E.EF.128") for op in ops) == 2 * mr * chunks
    _prefetched_first(ops, 2 * mr * len(range(2, chunks, 2)))
    exps = sum(op.startswith("MUFU.EX2") for op in ops)
    assert exps == sum(op.startswith("MUFU.RCP") for op in ops) and 0 < exps <= mr


@pytest.mark.parametrize("launch,prefetch", [((4, 256, 4), False), ((2, 256, 4), False),
                                            ((8, 128, 4), False), ((4, 256, 4), True)])
def test_moe_token_down_builds_without_loops_or_spills(launch, prefetch):
    """One token's down projection through its 8 pairs with their combine and the residual
    (``_token_down``, Qwen3-30B-A3B's 2048 x 768 experts): unrolled (no loop), no spills; each
    pair's weights and activation are one 16-byte load a thread a [4, 256] tile (24 tiles);
    the up projection's GLU form (gate and up rows side by side, the activation stored) builds
    too."""
    from engine_moe_triton import kernels

    types = {"act_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "ids_ptr": "*i32",
             "weights_ptr": "*fp32", "res_ptr": "*bf16", "ss_ptr": "*fp32", "x_ptr": "*bf16"}
    bn, bk, warps = launch
    down = build(kernels._token_down, types, dict(
        TOP_K=8, I=768, BLOCK_N=bn, BLOCK_K=bk, RES=True, EVICT="evict_first",
        PREFETCH=prefetch, PDL=True), warps=warps)
    assert stack_bytes(down) == 0 and sass_loops(down) == []
    ops = sass_ops(down)
    if launch == (4, 256, 4) and not prefetch:
        assert sum(op.startswith("LDG.E.128") or op.startswith("LDG.E.EF.128")
                   for op in ops) >= 24
    if prefetch:
        assert "prefetch.global.L2" in down.asm["ptx"]
    up = build(kernels._pair_gemv_up, types, dict(
        TOP_K=8, BLOCK_N=2, BLOCK_K=2048, ACC2D=False, NEXT=False, EVICT="evict_first",
        PDL=True, GLU=True))
    assert stack_bytes(up) == 0


@pytest.mark.parametrize("prefetch,nxt,hints", [
    (False, False, 0), (True, False, 0), (True, True, 0), (True, True, 1), (True, True, 2)])
def test_moe_pair_kernels_build(prefetch, nxt, hints):
    """The matrix-vector path's kernels; with L2 hints every weight load of both projections
    carries the policy "evict_first" (a ``createpolicy`` and ``.L2::cache_hint`` loads), and
    at 2 the down projection's prefetch asks for its rows "evict_last"."""
    from engine_moe_triton import kernels

    types = {"x_ptr": "*bf16", "gu_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16",
             "ids_ptr": "*i32", "weights_ptr": "*fp32", "down_ptr": "*bf16", "res_ptr": "*bf16",
             "ss_ptr": "*fp32"}
    evict = "evict_first" if hints else ""
    up = build(kernels._pair_gemv_up, types, dict(TOP_K=8, BLOCK_N=16, BLOCK_K=256,
                                                  ACC2D=False, NEXT=nxt, EVICT=evict, PDL=True))
    down = build(kernels._pair_gemv_down, types, dict(
        BLOCK_N=16, BLOCK_K=256, ACC2D=False, PREFETCH=prefetch, NEXT=nxt, EVICT=evict,
        KEEP=hints >= 2, PDL=True))
    for res in (False, True):  # (with the residual added and the sums of squares)
        build(kernels._combine_pairs, types, dict(TOP_K=8, BLOCK=1024, RES=res, PDL=True))
    for compiled in (up, down):
        ptx = compiled.asm["ptx"]
        hinted = re.findall(r"ld\.global[^ ]*L2::cache_hint[^ ]*", ptx)
        assert ("createpolicy.fractional.L2::evict_first" in ptx) == bool(hints)
        assert bool(hinted) == bool(hints)
    assert ("prefetch.global.L2::evict_last" in down.asm["ptx"]) == (hints >= 2)
    if prefetch:
        assert "prefetch.global.L2" in down.asm["ptx"]


def test_route_topk_takes_one_warp_reduction_a_pass():
    """The router's top-k (E = 128, k = 8, one warp): each pass is one reduction of the packed
    key (Triton 3.9: a warp ``REDUX`` of each half, so the only shuffles are the softmax's two
    ladders of 5; Triton 3.6: one ladder of 5 paired shuffles a pass, 90 in all), and the k
    weights and ids leave in one store each, with nothing read back."""
    from engine.runtime import fused_triton

    compiled = build(fused_triton._route_topk, {"logits_ptr": "*bf16", "w_ptr": "*fp32",
                                                "ids_ptr": "*i32"},
                     dict(K=8, RENORM=True, BLOCK_E=128, BLOCK_K=8, PDL=True), warps=1)
    ops = sass_ops(compiled)
    assert stack_bytes(compiled) == 0
    shuffles = sum(op.startswith("SHFL") for op in ops)
    assert (shuffles, sum(op.startswith("REDUX.MAX") for op in ops)) in {(10, 16), (90, 0)}
    stores = [i for i, op in enumerate(ops) if op.startswith("STG")]
    assert len(stores) == 2
    assert not any(op.startswith("LDG") for op in ops[stores[0]:])


# ------------------------------------------------------------- the core's kernels, by launch

DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int64": "i64",
          "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1",
          "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}


def _launches(call) -> list[tuple]:
    """Run ``call`` (a wrapper over CPU tensors) with every Triton launch recorded instead of
    run: (kernel, bound arguments, launch options)."""
    from unittest import mock

    from triton.runtime.jit import JITFunction

    seen = []

    def getitem(kernel, grid):
        def launch(*args, **kwargs):
            names = kernel.arg_names
            bound = {p.name: p.default for p in kernel.params}
            bound.update(zip(names, args))
            options = {k: v for k, v in kwargs.items() if k not in names}
            bound.update({k: v for k, v in kwargs.items() if k in names})
            seen.append((kernel, bound, options))
        return launch

    with mock.patch.object(JITFunction, "__getitem__", getitem):
        call()
    return seen


def _build_launch(kernel, bound: dict, options: dict):
    """One recorded launch compiled for sm_90 as the GPU's wrapper launches it: PDL on, and
    GRID off (the conversion instruction rounds fp8 codes), where the kernel takes them."""
    import torch

    types, constexprs, aligned = {}, {}, set()
    for param in kernel.params:
        value = bound[param.name]
        if param.is_constexpr or value is None:
            constexprs[param.name] = value
        elif isinstance(value, torch.Tensor):
            types[param.name] = "*" + DTYPES[str(value.dtype).removeprefix("torch.")]
            if value.data_ptr() % 16 == 0:  # (as the launch specializes its arguments)
                aligned.add(param.name)
        elif hasattr(value, "block_shape"):  # a host tensor descriptor
            dtype = DTYPES[str(value.base.dtype).removeprefix("torch.")]
            types[param.name] = f"tensordesc<{dtype}{list(value.block_shape)}>"
        elif isinstance(value, bool):
            types[param.name] = "i1"
        elif isinstance(value, int):
            types[param.name] = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
            if value % 16 == 0:
                aligned.add(param.name)
        else:
            types[param.name] = "fp32"
    if "PDL" in constexprs:
        constexprs["PDL"] = True
    if "GRID" in constexprs:  # (fp8 codes rounded by the conversion, as on the GPU)
        constexprs["GRID"] = False
    return build(kernel, types, constexprs, warps=options.get("num_warps", 4),
                 stages=options.get("num_stages", 3), aligned=aligned)


def _l2_prefetch_call():
    """``l2_prefetch`` of a 1 MiB weight, as if on a device where it launches."""
    from unittest import mock

    import torch

    from engine.runtime import triton_pdl

    with mock.patch.object(triton_pdl, "l2_prefetch_enabled", lambda device: True):
        triton_pdl.l2_prefetch([torch.zeros(1 << 19, dtype=torch.bfloat16)])


def _core_calls():
    import torch

    from engine.runtime import (fused_triton, gemv_triton, quant_triton, sample_triton,
                                swap_triton)

    bf = dict(dtype=torch.bfloat16)
    x, w = torch.randn(1, 256, **bf), torch.randn(128, 256, **bf)
    codes = torch.randn(128, 256).to(torch.float8_e4m3fn)
    qkv = torch.randn(3, (4 + 2 + 2) * 64, **bf)
    pos = torch.arange(3)
    cos, sin = torch.randn(16, 32), torch.randn(16, 32)
    norm = torch.ones(64, **bf)
    kv = torch.zeros(8, 2, 64, **bf)
    loc = torch.arange(3)
    params = [torch.zeros(2, dtype=torch.int64) for _ in range(6)]
    return {
        "gemv (bf16: one row, its weights loaded before the wait)":
            lambda: gemv_triton.gemv(x, w),
        "gemv (bf16, K in two slices)": lambda: gemv_triton.gemv_early(
            torch.randn(1, 2048, **bf), torch.randn(128, 2048, **bf), config=(8, 1024, 4)),
        "gemv (bf16, two rows)": lambda: gemv_triton.gemv(torch.randn(2, 256, **bf), w),
        "gemv (bf16, one row of a down projection: all 14336 columns a program)":
            lambda: gemv_triton.gemv(torch.randn(1, 14336, **bf), torch.randn(64, 14336, **bf)),
        "gemv (fp8 codes)": lambda: gemv_triton.gemv(x, codes, torch.ones(128)),
        "gemv_norm": lambda: gemv_triton.gemv_norm(x, x, torch.ones(256, **bf), 1e-6, w),
        "gemv_silu": lambda: gemv_triton.gemv_silu(torch.randn(1, 512, **bf), w),
        "w8_swap (fp8, per-token)": lambda: swap_triton.w8_swap(
            torch.randn(4, 256, **bf), codes, torch.ones(128), act="token"),
        "w8_swap (fp8, per-token, one row)": lambda: swap_triton.w8_swap(
            torch.randn(1, 2500, **bf), torch.randn(128, 2500).to(torch.float8_e4m3fn),
            torch.ones(128), act="token"),
        "w8_swap (fp8, per-token, 40 rows: a block of 64)": lambda: swap_triton.w8_swap(
            torch.randn(40, 256, **bf), codes, torch.ones(128), act="token"),
        "w8_swap (int8, per-token, 100 rows: a block of 128)": lambda: swap_triton.w8_swap(
            torch.randn(100, 256, **bf), torch.zeros(128, 256, dtype=torch.int8),
            torch.ones(128), act="token"),
        "w8_swap (block fp8, 32 rows)": lambda: swap_triton.w8_swap(
            torch.randn(32, 512, **bf), torch.randn(256, 512).to(torch.float8_e4m3fn),
            torch.ones(2, 4), act="group", block=(128, 128)),
        "w8_swap (block fp8, two scale blocks an iteration)": lambda: swap_triton.w8_swap(
            torch.randn(1, 512, **bf), torch.randn(256, 512).to(torch.float8_e4m3fn),
            torch.ones(2, 4), act="group", block=(128, 128), config=(128, 128, 1, 4, 3, 2)),
        "quant_groups (fp8, 1 x 128)": lambda: quant_triton.quant_groups(
            torch.randn(4, 512, **bf), torch.float8_e4m3fn, 128),
        "w8_swap (block fp8, one row from group codes made before)": lambda: swap_triton.w8_swap(
            *quant_triton.quant_groups(torch.randn(1, 512, **bf), torch.float8_e4m3fn, 128)[:1],
            torch.randn(256, 512).to(torch.float8_e4m3fn), torch.ones(2, 4), act="group_codes",
            x_scale=torch.ones(4, 1).t(), block=(128, 128), out_dtype=torch.bfloat16),
        "add_rms_norm_groups (fp8 codes, 4096 columns)": lambda: fused_triton.add_rms_norm_groups(
            torch.randn(1, 4096, **bf), torch.randn(1, 4096, **bf), torch.ones(4096, **bf), 1e-6,
            torch.float8_e4m3fn, 128),
        "silu_and_mul_groups (fp8 codes)": lambda: fused_triton.silu_and_mul_groups(
            torch.randn(1, 2 * 1536, **bf), torch.float8_e4m3fn, 128),
        "gemv_affine (4-bit, one row, float32 constants)": lambda: gemv_triton.gemv_affine(
            x, torch.zeros(128, 32, dtype=torch.int32), torch.ones(2, 128), torch.ones(2, 128),
            4, 128, 32),
        "gemv_affine (4-bit, one row, 16-bit constants)": lambda: gemv_triton.gemv_affine(
            x, torch.zeros(128, 32, dtype=torch.int32), torch.ones(2, 128).half(),
            torch.ones(2, 128).half(), 4, 128, 32),
        "l2_prefetch": _l2_prefetch_call,
        "add_rms_norm": lambda: fused_triton.add_rms_norm(x, x, torch.ones(256, **bf), 1e-6),
        "qk_norm_rope": lambda: fused_triton.qk_norm_rope(qkv, 4, 2, 64, pos, cos, sin, norm,
                                                          norm, 1e-6),
        "qk_norm_rope_store": lambda: fused_triton.qk_norm_rope_store(
            qkv, 4, 2, 64, pos, cos, sin, None, None, 0.0, kv, kv.clone(), loc),
        "qk_norm_rope_store (fp8 pool)": lambda: fused_triton.qk_norm_rope_store(
            qkv, 4, 2, 64, pos, cos, sin, norm, norm, 1e-6, kv.to(torch.float8_e4m3fn),
            kv.to(torch.float8_e4m3fn), loc, 0.5, 2.0),
        "silu_and_mul": lambda: fused_triton.silu_and_mul(torch.randn(2, 256, **bf)),
        "route_topk": lambda: fused_triton.route_topk(torch.randn(2, 64), 8, True),
        "sample": lambda: sample_triton.sample(torch.randn(2, 1000), *params[:6], params[0]),
    }


CORE = _core_calls()


def _swap_ab(monkeypatch, flag: str, n: int, k: int, config: tuple, act: str = "token",
             block: tuple | None = None, param: str | None = None) -> list:
    """``swap_triton.w8_swap`` of one bf16 row of width ``k`` by fp8 weights [n, k] at
    ``config``, with the environment variable ``flag`` at 0 and then 1: the two builds of
    its last launch (each checked: the kernel's ``param`` constexpr follows the flag, no
    register spills)."""
    import torch

    from engine.runtime import swap_triton

    kw = {"x_scale": torch.ones(1)} if act == "static" else {}
    scales = torch.ones(n // block[0], k // block[1]) if block else torch.ones(n)
    built = []
    for value in ("0", "1"):
        monkeypatch.setenv(flag, value)
        launches = _launches(lambda: swap_triton.w8_swap(
            torch.empty(1, k, dtype=torch.bfloat16), torch.zeros(n, k).to(torch.float8_e4m3fn),
            scales, act=act, block=block, config=config, **kw))
        if param:
            assert launches[-1][1][param] is (value == "1")
        compiled = _build_launch(*launches[-1])
        assert stack_bytes(compiled) == 0
        built.append((compiled, launches))
    return built


def test_one_row_swap_epilogue_on_the_row_alone_is_shorter(monkeypatch):
    """The one-row epilogue (the default; ``ENGINE_SWAP_ROW_EPILOGUE=0``: the padded block's):
    at o's one-row launch of Llama-3-8B (K in 4 slices) it takes the row out of the padded
    block first, which leaves the kernel at least 200 instructions shorter (about 350 in the
    Triton of the H200's image), without spills."""
    off, on = (len(sass_ops(c)) for c, _ in _swap_ab(
        monkeypatch, "ENGINE_SWAP_ROW_EPILOGUE", 4096, 4096, (128, 256, 4, 4, 4),
        param="ROW_EPILOGUE"))
    assert on < off - 200, (off, on)


@pytest.mark.parametrize("act", ["token", "static"])
def test_one_row_swap_stores_its_operand_rows_whole(act, monkeypatch):
    """At q/k/v's one-row launch of Llama-3-8B (64 outputs, 512 columns a tile, 4 warps) the
    row's codes go into the padded operand with matrix stores (a few contiguous codes a thread
    and row), not one byte a store: no byte-wide shared stores in the K loop, which stays under
    300 instructions (332 when the row was stored byte by byte, Triton 3.6), no spills. (With
    the dynamic scale taken before the loop: the late-scale form, the default for fp8, adds
    the first iteration's scale to the loop; its own test is below.)"""
    import torch

    from engine.runtime import swap_triton

    monkeypatch.setenv("ENGINE_SWAP_LATE_SCALE", "0")

    kw = {"x_scale": torch.ones(1)} if act == "static" else {}
    launches = _launches(lambda: swap_triton.w8_swap(
        torch.empty(1, 4096, dtype=torch.bfloat16),
        torch.zeros(6144, 4096).to(torch.float8_e4m3fn), torch.ones(6144), act=act,
        config=(64, 512, 1, 4, 4), **kw))
    compiled = _build_launch(*launches[0])
    assert stack_bytes(compiled) == 0
    ops = loop_ops(compiled)
    assert "STS.U8" not in ops and 0 < len(ops) < 300, (len(ops), ops.count("STS.U8"))


@pytest.mark.parametrize("act", ["token", "static"])
def test_one_row_swap_of_whole_tiles_loads_without_masks(act, monkeypatch):
    """``ENGINE_SWAP_EVEN=1``: at q/k/v's one-row launch of Llama-3-8B (6144 outputs, K 4096:
    whole tiles) the loads take no masks, which leaves the K loop at least 20 instructions
    shorter (33 in the Triton of the H200's image) and the kernel at least 60 (112), without
    spills (the dynamic scale taken before the loop, as above)."""
    monkeypatch.setenv("ENGINE_SWAP_LATE_SCALE", "0")
    (off, _), (on, _) = _swap_ab(monkeypatch, "ENGINE_SWAP_EVEN", 6144, 4096,
                                 (64, 512, 1, 4, 4), act=act, param="EVEN")
    assert len(loop_ops(on)) < len(loop_ops(off)) - 20
    assert len(sass_ops(on)) < len(sass_ops(off)) - 60


@pytest.mark.parametrize("scales", ["output", "block"])
def test_one_row_swap_through_tensor_descriptors(monkeypatch, scales):
    """Weight tiles through tensor descriptors (``ENGINE_SWAP_TMA``, where the GPU and weights
    allow; here as if on an H200): at q/k/v's one-row launch of Llama-3-8B (one scale an
    output), and at down's block fp8 launch of a 7168-wide model (two scale blocks an
    iteration), the tiles come by bulk copies (no 16-byte copies a thread left), which
    shortens the kernel, without spills (block fp8's activation codes, made by
    ``quant_groups``, still come by 16-byte copies: fewer of them are left)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from engine.runtime import swap_triton

    monkeypatch.setattr(swap_triton, "_w_descriptor",
                        lambda w, bn, bk: TensorDescriptor.from_tensor(w, [bn, bk]))
    if scales == "output":
        args = (6144, 4096, (64, 512, 1, 4, 4)), dict(act="static")
    else:
        args = (4096, 7168, (64, 128, 8, 4, 3, 2)), dict(act="group", block=(128, 128))
    off, on = (sass_ops(c) for c, _ in _swap_ab(
        monkeypatch, "ENGINE_SWAP_TMA", *args[0], param="TMA", **args[1]))
    copies = [sum(op.startswith("LDGSTS.E.BYPASS") for op in ops) for ops in (off, on)]
    assert copies[1] < copies[0] and (copies[1] == 0 or scales == "block"), copies
    assert any(op.startswith("UTMALDG") for op in on)
    assert len(on) < len(off), (len(on), len(off))


def test_one_row_block_fp8_from_group_codes(monkeypatch):
    """``ENGINE_SWAP_GROUP_CODES=1``: one row of block fp8 (down's launch of a 7168-wide
    model, two scale blocks an iteration) is quantized first (``quant_groups``), and the
    product's K loop, which then reads codes and group scales, is at least 100 instructions
    shorter (156 in the Triton of the H200's image), without spills."""
    (off, off_launches), (on, on_launches) = _swap_ab(
        monkeypatch, "ENGINE_SWAP_GROUP_CODES", 4096, 7168, (64, 128, 8, 4, 3, 2), act="group",
        block=(128, 128))
    assert [kernel.fn.__name__ for kernel, _, _ in off_launches] == ["_w8_swap"]
    assert [kernel.fn.__name__ for kernel, _, _ in on_launches] == ["_quant_groups", "_w8_swap"]
    assert (off_launches[-1][1]["ACT"], on_launches[-1][1]["ACT"]) == (2, 5)
    assert 0 < len(loop_ops(on)) < len(loop_ops(off)) - 100


@pytest.mark.parametrize("n, k, config", [(4096, 14336, (64, 128, 8, 4, 3, 2)),
                                           (28672, 4096, (128, 128, 2, 4, 3))])
def test_one_row_block_fp8_scales_an_iteration_ahead(monkeypatch, n, k, config):
    """``ENGINE_SWAP_SCALES_AHEAD=1``: one row of block fp8 from group codes (down's launch of
    a 7168-wide model, two scale blocks an iteration; gate/up's, one) loads the next
    iteration's block and group scales (each value then has an iteration to arrive, not the
    time between its load and its tile's product) before the iteration's first product waits,
    with no more barriers in the loop (no layout conversion through shared memory), a few
    more instructions at most, and no spills."""
    (off, _), (on, _) = _swap_ab(monkeypatch, "ENGINE_SWAP_SCALES_AHEAD", n, k, config,
                                 act="group", block=(128, 128), param="AHEAD")
    loops = [loop_ops(c) for c in (off, on)]
    loads = [i for i, op in enumerate(loops[1]) if op.startswith("LDG.")]
    assert loads and max(loads) < loops[1].index("WARPGROUP.DEPBAR.LE"), loads
    assert [ops.count("BAR.SYNC.DEFER_BLOCKING") for ops in loops] == [2, 2]
    assert len(loops[1]) < len(loops[0]) + 20, (len(loops[0]), len(loops[1]))


@pytest.mark.parametrize("n, k, config", [(6144, 4096, (64, 512, 1, 4, 4)),
                                           (4096, 14336, (128, 256, 4, 4, 4))])
def test_one_row_dynamic_scale_after_the_first_tiles_are_asked_for(monkeypatch, n, k, config):
    """``ENGINE_SWAP_LATE_SCALE=1``: one row with a dynamic scale (q/k/v's launch of
    Llama-3-8B, and down's, K in slices) asks for its first weight tiles (the pipeliner's
    copies) right after the wait and reads the row for its maximum after them; before, the
    copies waited for the row's maximum (its loads and two cross-warp reductions). No
    spills; the maximum's code sits in the loop behind a branch that only the first iteration
    takes (the loop's code about doubles, what a later iteration runs does not)."""
    (off, _), (on, _) = _swap_ab(monkeypatch, "ENGINE_SWAP_LATE_SCALE", n, k, config,
                                 act="token", param="LATE")

    def first(ops, prefix):
        return next(i for i, op in enumerate(ops) if op.startswith(prefix))

    before, after = sass_ops(off), sass_ops(on)
    assert first(before, "LDG.E.128") < first(before, "LDGSTS")
    assert first(after, "LDGSTS") < first(after, "LDG.E.128")
    loops = [loop_ops(c) for c in (off, on)]
    assert [ops.count("SHFL.BFLY") > 0 for ops in loops] == [False, True]
    assert "BRA" in loops[1][:4], loops[1][:4]  # (the first iteration's branch, at the top)


def test_one_row_swap_reads_a_static_scale_over_the_wait():
    """A static activation scale (a constant of the step) is read before the wait for the
    previous kernel, so the loop's first loads do not wait for it."""
    import torch

    from engine.runtime import swap_triton

    launches = _launches(lambda: swap_triton.w8_swap(
        torch.empty(1, 4096, dtype=torch.bfloat16),
        torch.zeros(6144, 4096).to(torch.float8_e4m3fn), torch.ones(6144), act="static",
        x_scale=torch.ones(1)))
    ptx = _build_launch(*launches[0]).asm["ptx"]
    before = ptx[:ptx.index("griddepcontrol.wait")]
    assert "ld.global" in before


@pytest.mark.parametrize("form", ["qkv (norm from sums of squares)", "o (residual add)",
                                  "gate/up (norm, SiLU-and-mul)", "down (residual add)",
                                  "router (norm, the normed row)"])
def test_chained_layer_products_build_without_spills(form):
    """The chained one-row layer (``gemv_triton.gemv_chain``) at the Llama-3-8B shapes, and a
    sparse layer's router at Qwen3-30B-A3B's (128 experts, 2,048 inputs): one ``_gemv_early``
    launch each, no register spills."""
    import torch

    from engine.runtime import gemv_triton

    bf = dict(dtype=torch.bfloat16)
    hidden, ss = torch.empty(1, 4096, **bf), torch.empty(2048)
    norm = dict(sumsq=ss, norm_w=torch.empty(4096, **bf), eps=1e-5)
    calls = {
        "qkv (norm from sums of squares)": lambda: gemv_triton.gemv_chain(
            hidden, torch.empty(6144, 4096, **bf), **norm),
        "o (residual add)": lambda: gemv_triton.gemv_chain(
            hidden, torch.empty(4096, 4096, **bf), residual=hidden),
        "gate/up (norm, SiLU-and-mul)": lambda: gemv_triton.gemv_chain(
            hidden, torch.empty(28672, 4096, **bf), glu=True, **norm),
        "down (residual add)": lambda: gemv_triton.gemv_chain(
            torch.empty(1, 14336, **bf), torch.empty(4096, 14336, **bf), residual=hidden),
        "router (norm, the normed row)": lambda: gemv_triton.gemv_chain(
            torch.empty(1, 2048, **bf), torch.empty(128, 2048, **bf), sumsq=ss,
            norm_w=torch.empty(2048, **bf), eps=1e-6, normed_out=torch.empty(1, 2048, **bf)),
    }
    launches = _launches(calls[form])
    assert [kernel.fn.__name__ for kernel, _, _ in launches] == ["_gemv_early"]
    for kernel, bound, options in launches:
        assert stack_bytes(_build_launch(kernel, bound, options)) == 0


def test_one_row_float_products_load_their_weights_before_the_wait(monkeypatch):
    """One row of float weights takes ``_gemv_early`` (all of a program's weights loaded before
    its wait for the previous kernel); ``ENGINE_GEMV_EARLY=0`` and more rows take ``_gemv``."""
    import torch

    from engine.runtime import gemv_triton

    bf = dict(dtype=torch.bfloat16)
    w = torch.randn(64, 256, **bf)

    def kernels(rows):
        return [k.fn.__name__ for k, _, _ in _launches(
            lambda: gemv_triton.gemv(torch.randn(rows, 256, **bf), w))]

    monkeypatch.delenv("ENGINE_GEMV_EARLY", raising=False)
    assert kernels(1) == ["_gemv_early"] and kernels(2) == ["_gemv"]
    monkeypatch.setenv("ENGINE_GEMV_EARLY", "0")
    assert kernels(1) == ["_gemv"]


@pytest.mark.parametrize("name", sorted(CORE))
def test_core_kernels_build(name):
    launches = _launches(CORE[name])
    assert launches, f"{name} launched no Triton kernel"
    for kernel, bound, options in launches:
        _build_launch(kernel, bound, options)


@pytest.mark.parametrize("compact", [False, True], ids=["float32", "16-bit"])
@pytest.mark.parametrize("layer", [(6144, 4096), (28672, 4096), (4096, 14336)])
def test_one_row_affine_groups_in_columns_loads_nothing_in_its_loop(layer, compact):
    """One row of 4-bit codes (Llama-3-8B's q/k/v, gate/up and down, groups of 128) at the
    swapped kernel's one-row launches, the groups in the product's columns (XSUM 2): the K loop
    waits on no global load (the packed words and the activation tiles come by the pipeliner's
    copies; no scale, offset or activation row loads there), and nothing spills; the folds'
    form of the same launch loads in its loop. Both with float32 scales and biases and with
    the compact 16-bit form."""
    import torch

    from engine.runtime import quant_triton, swap_affine

    n, k = layer
    q = torch.zeros(n, k // 8, dtype=torch.int32)
    s = torch.ones(k // 128, n, dtype=torch.float16 if compact else torch.float32)

    def ops(config):
        launches = _launches(lambda: swap_affine.affine_swap(
            torch.empty(1, k, dtype=torch.bfloat16), q, s, s, 4, 128,
            quant_triton.affine_sub(128), config=config))
        assert launches[-1][1]["XSUM"] == config[4]
        compiled = _build_launch(*launches[-1])
        assert stack_bytes(compiled) == 0
        return loop_ops(compiled)

    config = swap_affine.default_config(n, k, 1)
    assert config[4] == 2
    cols = ops(config)
    assert cols and not [op for op in cols if op.startswith("LDG.")], cols
    folds = ops(config[:4] + (0,))
    assert [op for op in folds if op.startswith("LDG.")]


@pytest.mark.parametrize("layer", [(6144, 4096, 128), (28672, 4096, 64), (4096, 14336, 128)])
def test_one_row_affine_groups_in_eight_columns_builds_a_shorter_loop(layer):
    """The same one-row products with the groups in eight columns (XSUM 3): the K loop loads
    nothing but through the pipeliner's copies, nothing spills, and the loop is shorter a
    weight than the sixteen-column form's at the same outputs a program. (Which instruction
    takes the narrower product is Triton's: 3.6, the GPU machine's, the synchronous m16n8k16;
    3.9 a warp-group product eight wide.)"""
    import torch

    from engine.runtime import quant_triton, swap_affine

    n, k, bn = layer
    q = torch.zeros(n, k // 8, dtype=torch.int32)
    s = torch.ones(k // 128, n, dtype=torch.float16)

    def build(xsum):
        launches = _launches(lambda: swap_affine.affine_swap(
            torch.empty(1, k, dtype=torch.bfloat16), q, s, s, 4, 128,
            quant_triton.affine_sub(128), config=(bn, 1, 4, 2, xsum)))
        assert launches[-1][1]["BLOCK_M"] == (8 if xsum == 3 else 16)
        compiled = _build_launch(*launches[-1])
        assert stack_bytes(compiled) == 0
        return compiled

    eight = build(3)
    loop = loop_ops(eight, "MMA")
    assert not [op for op in loop if op.startswith("LDG.")], loop
    sixteen = loop_ops(build(2))
    # (a loop of eight columns covers the same weights a trip as one of sixteen)
    assert len(loop) < len(sixteen), (len(loop), len(sixteen))


def _affine_mma_loop(group: int, ct: int, depth: int, f16: bool, stages: int = 0,
                     constants: str = "fp32"):
    """The SASS ops of the K loop of the Gluon one-row 4-bit kernel's sm_90 build (which
    must not spill); ``constants``: the scales' and biases' type."""
    from engine.runtime import affine_mma

    if not affine_mma.available():
        pytest.skip("this Triton has no Gluon")
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = affine_mma._affine_mma
    types = {"x_ptr": "*fp16" if f16 else "*bf16", "q_ptr": "*i32", "s_ptr": f"*{constants}",
             "b_ptr": f"*{constants}", "bias_ptr": "*bf16", "y_ptr": "*bf16", "part_ptr": "*fp32",
             "cnt_ptr": "*i32"}
    ce = dict(GROUP=group, CT=ct, F16=f16, HAS_BIAS=True, MR=1, D=depth, XA=depth < 3,
              WCACHE=".cg", S=stages, SPLIT=True, PDL=True)
    sig = {name: "constexpr" if name in ce else types.get(name, "i32")
           for name in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if sig[name].startswith("*") or name in ("K", "stride_qn")}
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=ce, attrs=attrs)
    compiled = triton.compile(src, target=SM90, options={"num_warps": 4, "launch_pdl": True})
    assert stack_bytes(compiled) == 0
    loops = [body for body in sass_loops(compiled) if any(op.startswith("HMMA") for op in body)]
    assert len(loops) == 1
    return loops[0]


@pytest.mark.parametrize("group, ct, depth, f16, constants", [
    (128, 4, 3, False, "fp32"), (32, 1, 1, True, "fp32"), (256, 8, 2, False, "fp32"),
    (128, 4, 3, False, "fp16"), (64, 2, 2, True, "bf16")])
def test_one_row_affine_on_registers_builds_a_loop_without_shared_memory(group, ct, depth, f16,
                                                                         constants):
    """The Gluon one-row 4-bit kernel (:mod:`engine.runtime.affine_mma`) builds for sm_90: the
    changes of layout between the loaded words and x and the matrix instruction's operands are
    proven free (``assert_trivial``: the build fails otherwise); its K loop holds 16
    synchronous matrix instructions a tile of 256 columns a warp, 16-byte loads, and no shared
    memory or barrier (the groups' sums too stay in registers); nothing spills. With float32
    scales and biases and with the compact 16-bit form."""
    body = _affine_mma_loop(group, ct, depth, f16, constants=constants)
    assert sum(op.startswith("HMMA.16816.F32") for op in body) == 16 * depth
    assert [op for op in body if op.startswith("LDG.E.128")]
    assert not [op for op in body if op.startswith(("LDS", "STS", "BAR"))], body


@pytest.mark.parametrize("stages", [2, 4])
def test_one_row_affine_stages_its_words_through_shared_memory(stages):
    """With S stages the words of a tile come by four 16-byte asynchronous copies a thread
    (through L2 only) and four 16-byte reads of shared memory, in place of four 16-byte loads
    into registers; the matrix instructions stay, nothing spills."""
    regs = _affine_mma_loop(128, 4, 1, False)
    staged = _affine_mma_loop(128, 4, 1, False, stages)
    assert sum(op.startswith("HMMA.16816.F32") for op in staged) == 16
    assert sum(op == "LDGSTS.E.BYPASS.128" for op in staged) == 4
    assert sum(op == "LDS.128" for op in staged) == 4
    loads = [sum(op.startswith("LDG.E.128") for op in body) for body in (regs, staged)]
    assert loads[0] - loads[1] == 4, loads


@pytest.mark.parametrize("layer", [(6144, 4096, None), (28672, 4096, None),
                                   (4096, 14336, None), (4096, 14336, (128, 2, 0, 4, 4, 0)),
                                   (4096, 14336, (128, 2, 0, 4, 4, 1))])
def test_nibbles_gemv_puts_a_warp_along_the_words_and_spills_nothing(layer):
    """One row of 4-bit codes through ``gemv_nibbles`` (Llama-3-8B's q/k/v, gate/up and down at
    their class launches, and down at 8 rows a thread, 16-bit constants): a warp's threads lie
    along a row's words, 16 bytes a thread (so one 128-byte line a row, and each activation
    shared by the thread's rows); the groups' sums are folded in the words' layout (the
    constants and results change layout as [BLOCK_N] vectors, never a [BLOCK_N, columns]
    tensor of sums); no register spills."""
    import torch

    from engine.runtime import nibbles_triton as nt

    n, k, config = layer
    launches = _launches(lambda: nt.gemv_nibbles(
        torch.randn(1, k, dtype=torch.bfloat16), torch.zeros(n, k // 8, dtype=torch.int32),
        torch.ones(k // 128, n).half(), torch.ones(k // 128, n).half(), 128, 32,
        config=config))
    kernel, bound, options = launches[-1]
    compiled = _build_launch(kernel, bound, options)
    ttgir = compiled.asm["ttgir"]
    words = re.findall(r"sizePerThread = \[1, 1, 4\], threadsPerWarp = \[([\d, ]+)\]", ttgir)
    assert words == ["4, 8, 1"]
    changes = re.findall(r"convert_layout %\S+ : tensor<(\d+)x(\d+)x\w+,", ttgir)
    assert all(rows == "1" for rows, _ in changes), changes  # (a [1, columns] x sum may)
    assert stack_bytes(compiled) == 0


@pytest.mark.parametrize("mr,ahead", [(1, 0), (2, 0), (1, 8)])
def test_one_row_bf16_on_the_matrix_unit_builds_without_layout_changes(mr, ahead):
    """The probe of ``benchmarks/gemv_mma_gpu.py`` (one row of bfloat16 weights through
    ``mma.sync`` with K permuted in each 32-column chunk) builds for sm_90: its changes of
    layout from the 16-byte loads to the two operands are proven free (the build fails
    otherwise), its K loop holds 2 matrix instructions a chunk for each 16 rows of a warp, the
    weights and x come by 16-byte loads (with ``ahead``, an L2 prefetch a row and chunk too),
    nothing goes through shared memory or spills, and every loop (the unrolled one and its
    remainder) spends fewer than two instructions a weight of a thread (a warp's chunk: 16 MR
    rows x 32 columns, 16 MR weights a thread; 2.5 with the prefetches)."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gemv_mma_gpu.py")
    spec = importlib.util.spec_from_file_location("gemv_mma_gpu", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    if probe.gluon is None:
        pytest.skip("this Triton has no Gluon")
    compiled = _build_gluon(probe._gemv_mma, {"MR": mr, "AHEAD": ahead}, 4)
    assert stack_bytes(compiled) == 0
    loops = [body for body in sass_loops(compiled) if any(op.startswith("HMMA") for op in body)]
    assert loops
    for body in loops:
        mmas = sum(op.startswith("HMMA.16816.F32.BF16") for op in body)
        chunks = mmas // (2 * mr)
        assert mmas == 2 * mr * chunks and chunks >= 1, body
        assert sum(op.startswith("LDG.E.128") for op in body) >= (2 * mr + 1) * chunks, body
        prefetches = sum(op.startswith("CCTL") and "PF2" in op for op in body)
        assert prefetches == (2 * mr * chunks if ahead else 0), body
        assert not [op for op in body if op.startswith(("LDS", "STS", "BAR"))], body
        bound = 2.5 if ahead else 2  # (the prefetch's address: its own few a chunk)
        assert len(body) < bound * 16 * mr * chunks, (len(body), 16 * mr * chunks)
