"""The swapped-operand affine product :func:`engine.runtime.swap_affine.affine_swap` equals the
float64 product of its dequantized weights and :func:`engine.runtime.quant_triton.affine_mm`
(whichever path it routes the rows to) on the same inputs: 2-, 4- and 8-bit codes, groups 16 to
128, 1 to 200 rows (one block of 16, 32, 64 or 128 rows; several blocks), N and K not multiples
of the tiles, act-order permutation, bias, K split over several programs, bfloat16 and float16
activations, both ways of summing the rows. Under the Triton interpreter here (a child process:
the interpreter must be chosen before Triton is imported), on the GPU where there is one. The
inline PTX that turns packed words into 16-bit floats on the GPU (the interpreter takes the
elementwise form) is checked against that form by a small emulation of its three instructions.

Run as a script (``python tests/runtime/test_swap_affine.py cpu|cuda``) it prints one JSON
object: case name -> failures.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

BF16, F16 = "bfloat16", "float16"
#: launches (BLOCK_N, SPLIT_K, warps, stages, XSUM) small enough for the interpreter
ONE = (64, 1, 4, 2, 0)


def _case(name: str, m: int, bits: int = 4, group: int = 128, n: int = 100, k: int = 512,
          dtype: str = BF16, perm: bool = False, bias: bool = False, config: tuple | None = ONE):
    """(name, parameters) of one case: ``m`` rows of ``dtype``, ``bits``-bit codes in groups of
    ``group`` of a weight [n, k], launch ``config`` (None: the default table's)."""
    return name, dict(m=m, bits=bits, group=group, n=n, k=k, dtype=dtype, perm=perm, bias=bias,
                      config=config)


CASES = dict(
    [_case(f"int4 g128 m={m} {dt}", m, dtype=dt) for m in (1, 3, 16) for dt in (BF16, F16)]
    + [_case(f"int4 g{g} m={m}", m, group=g, k=320) for g in (32, 64) for m in (1, 16)]
    + [_case("int4 g16 (slices of 16) m=4", 4, group=16, k=96),
       _case("int4 ragged N=37 m=2", 2, n=37, k=256),
       _case("int4 K=320 (a partial tile) m=5 half", 5, k=320, dtype=F16),
       _case("int4 act-order m=1 bias", 1, group=64, perm=True, bias=True),
       _case("int4 act-order K=320 m=16 half", 16, group=64, k=320, perm=True, dtype=F16),
       _case("int4 bias m=3 half", 3, bias=True, dtype=F16),
       _case("int4 row sums by the matrix unit m=1", 1, config=(64, 1, 4, 2, 1)),
       _case("int4 row sums by the matrix unit m=7 half", 7, dtype=F16, config=(64, 1, 4, 2, 1)),
       _case("int4 BLOCK_N 128 m=4", 4, n=200, config=(128, 1, 4, 2, 0)),
       _case("int4 BLOCK_N 128, 8 warps, split 2 m=1 half", 1, n=200, dtype=F16,
             config=(128, 2, 8, 2, 0)),
       _case("int4 split 3 m=1", 1, k=768, config=(64, 3, 4, 2, 0)),
       # the synchronous matrix instructions' launches (fewer than 64 outputs a program)
       _case("int4 BLOCK_N 32, one warp, split 2 m=1", 1, k=768, config=(32, 2, 1, 2, 0)),
       _case("int4 BLOCK_N 16, one warp m=1 half", 1, n=37, dtype=F16, config=(16, 1, 1, 2, 0)),
       _case("int4 BLOCK_N 32, two warps, row sums by the matrix unit m=3", 3,
             config=(32, 1, 2, 2, 1)),
       _case("int4 split 4 (an empty slice) m=16 bias", 16, k=768, bias=True,
             config=(64, 4, 4, 2, 0)),
       _case("int4 split 2 K=320 m=2 half", 2, k=320, dtype=F16, config=(64, 2, 4, 2, 1)),
       # one row with the slice's groups in the product's columns (XSUM 2)
       _case("int4 groups in columns m=1", 1, k=768, config=(64, 1, 4, 2, 2)),
       _case("int4 groups in columns g32 K=320 split 2 m=1 half bias", 1, group=32, k=320,
             dtype=F16, bias=True, config=(64, 2, 4, 2, 2)),
       _case("int4 groups in columns act-order g64 m=1", 1, group=64, k=1024, perm=True,
             config=(64, 1, 4, 2, 2)),
       _case("int4 groups in columns g16 (split raised to 3) m=1", 1, group=16, k=768,
             config=(64, 1, 4, 2, 2)),
       _case("int4 groups in columns, one group of 512 split 3 m=1", 1, group=512, k=1024,
             config=(64, 3, 4, 2, 2)),
       _case("int8 groups in columns g64 m=1", 1, bits=8, group=64, config=(64, 2, 4, 2, 2)),
       _case("int4 groups in columns asked for m=3 (folds instead)", 3,
             config=(64, 1, 4, 2, 2)),
       # one row with the groups in eight columns (XSUM 3: slices of at most 8 groups)
       _case("int4 groups in 8 columns (split raised to 2) m=1", 1, k=2048,
             config=(64, 1, 4, 2, 3)),
       _case("int4 groups in 8 columns g32 K=320 split 2 m=1 half bias", 1, group=32, k=320,
             dtype=F16, bias=True, config=(64, 2, 4, 2, 3)),
       _case("int4 groups in 8 columns act-order g64 BLOCK_N 128 m=1", 1, group=64, k=1024,
             n=200, perm=True, config=(128, 1, 4, 3, 3)),
       _case("int8 groups in 8 columns g64 m=1 half", 1, bits=8, group=64, dtype=F16,
             config=(64, 1, 4, 2, 3)),
       _case("int4 groups in 8 columns asked for m=2 (folds instead)", 2,
             config=(64, 1, 4, 2, 3)),
       _case("int8 g128 m=1", 1, bits=8),
       _case("int8 g64 m=5 half", 5, bits=8, group=64, dtype=F16),
       _case("int8 g32 act-order m=16 bias", 16, bits=8, group=32, k=192, perm=True, bias=True),
       _case("int2 g64 m=3", 3, bits=2, group=64, k=1024),
       _case("default launch m=1 wide", 1, n=512, k=128, config=None),
       _case("default launch m=4 deep half", 4, n=64, k=768, dtype=F16, config=None),
       _case("default launch m=16 square", 16, n=128, k=256, config=None),
       _case("int4 a block of 32 rows m=20 half", 20, k=256, dtype=F16),
       _case("int4 a block of 64 rows m=33 split 2 bias", 33, k=512, bias=True,
             config=(64, 2, 4, 2, 0)),
       _case("int4 a block of 128 rows m=100 act-order half", 100, group=64, k=256, perm=True,
             dtype=F16),
       _case("int4 two blocks of 128 rows m=200 (split refused) bias", 200, k=256, bias=True,
             config=(64, 2, 4, 2, 0)),
       _case("int8 a block of 64 rows m=40 half", 40, bits=8, k=256, dtype=F16),
       _case("int4 BLOCK_N 256, 8 warps, a block of 64 rows m=50", 50, n=300, k=256,
             config=(256, 1, 8, 2, 0)),
       _case("int4 row sums by the matrix unit, a block of 32 rows m=30", 30, k=256,
             config=(64, 1, 4, 2, 1)),
       _case("default launch m=70 wide half", 70, n=512, k=128, dtype=F16, config=None)])


# ---------------------------------------------------------------- the checks (child process)

def _inputs(p: dict, gen: torch.Generator):
    """Codes, scales and biases [groups, n] (float32), the float64 weights they stand for,
    activations, permutation (int32) and bias of one case."""
    n, k, group, bits = p["n"], p["k"], p["group"], p["bits"]
    groups = -(-k // group)
    codes = torch.randint(0, 1 << bits, (n, k), generator=gen)
    scale = torch.rand(groups, n, generator=gen) * 0.02 + 0.001
    bias_ = torch.randn(groups, n, generator=gen) * 0.05
    expand = lambda t: t.double().t().repeat_interleave(group, 1)[:, :k]  # noqa: E731
    w = codes.double() * expand(scale) + expand(bias_)
    dtype = getattr(torch, p["dtype"])
    x = torch.randn(p["m"], k, generator=gen).to(dtype)
    perm = torch.randperm(k, generator=gen).to(torch.int32) if p["perm"] else None
    bias = torch.randn(n, generator=gen).to(dtype) if p["bias"] else None
    return codes, scale, bias_, w, expand(scale), x, perm, bias


def check(name: str, p: dict, device: str, gen: torch.Generator) -> list[str]:
    """One case: ``affine_swap`` against the float64 product of the dequantized weights, and
    against the current path on the same inputs (not for bfloat16 beyond 4 rows under the
    interpreter: its ``tl.dot`` of bfloat16 is wrong)."""
    from engine.runtime import quant_triton as qt
    from engine.runtime import swap_affine as sa

    codes, scale, bias_, w, s_full, x, perm, bias = _inputs(p, gen)
    sub = qt.affine_sub(p["group"])
    packed = qt.pack_affine(codes, p["bits"], sub)
    dev = lambda t: t.to(device) if t is not None else None  # noqa: E731
    args = (dev(x), dev(packed), dev(scale), dev(bias_), p["bits"], p["group"], sub)
    y = sa.affine_swap(*args, perm=dev(perm), bias=dev(bias), config=p["config"]).cpu()
    if y.shape != (p["m"], p["n"]) or y.dtype != x.dtype or not torch.isfinite(y).all():
        return [f"{name}: shape {tuple(y.shape)} dtype {y.dtype}, or not finite"]
    xs = x.double()[:, perm.long()] if perm is not None else x.double()
    want = xs @ w.t() + (bias.double() if bias is not None else 0.0)
    # the output's rounding (the interpreter truncates bfloat16: one unit), plus float32 sums
    # of exact products x (OFFSET + q) whose order differs: bounded by their magnitudes
    unit = 2.0 ** -7 if x.dtype == torch.bfloat16 else 2.0 ** -10
    offset = sa.code_offset(p["bits"], x.dtype)
    size = xs.abs() @ (w.abs() + 2 * offset * s_full).t()
    bound = unit * want.abs() + 2.0 ** -18 * size
    failures = []
    excess = ((y.double() - want).abs() - bound).max().item()
    if excess > 0:
        failures.append(f"{name}: exceeds the float64 bound by {excess:.3g} "
                        f"(largest output {want.abs().max().item():.3g})")
    if device == "cpu" and x.dtype == torch.bfloat16 and p["m"] > 4:
        return failures
    cur = qt.affine_mm(*args, perm=dev(perm), bias=dev(bias)).cpu().double()
    # from 5 rows the current path is affine_mm's tl.dot kernel: a unit more on the magnitudes
    rounded = (unit * (xs.abs() @ w.abs().t())) if p["m"] > 4 else 0.0
    excess = ((y.double() - cur).abs() - 2 * bound - rounded).max().item()
    if excess > 0:
        failures.append(f"{name}: differs from affine_mm beyond the bounds by {excess:.3g}")
    return failures


def _refusals(device: str) -> list[str]:
    """float32 activations are refused."""
    from engine.runtime import quant_triton as qt
    from engine.runtime import swap_affine as sa

    q = qt.pack_affine(torch.zeros(64, 256, dtype=torch.int64), 4, 32).to(device)
    s = torch.ones(2, 64, device=device)
    failures = []
    for rows, dtype in ((2, torch.float32),):
        try:
            sa.affine_swap(torch.zeros(rows, 256, dtype=dtype, device=device), q, s, s, 4, 128,
                           32)
            failures.append(f"{rows} rows of {dtype}: no ValueError")
        except ValueError:
            pass
    return failures


#: (name, rows, bits, group, n, k, path, launch) of the compact constants' checks: each
#: path that reads a packed weight's scales and biases, at launches that read them each way
COMPACT = [("swap, sums folded", 3, 4, 64, 100, 320, "swap", (64, 2, 4, 2, 0)),
           ("swap, groups in columns", 1, 4, 32, 64, 512, "swap", (64, 2, 4, 2, 2)),
           ("swap, int8", 2, 8, 64, 64, 256, "swap", (64, 1, 4, 2, 1)),
           ("gemv, factored, subnormal codes", 1, 4, 128, 40, 320, "gemv", (16, 1, 4, 1, 1, 4,
                                                                              1)),
           ("gemv, no masks", 2, 4, 64, 64, 512, "gemv", (16, 2, 4, 2, 2, 0, 0)),
           ("gemv, each weight", 3, 4, 64, 40, 320, "gemv", (16, 2, 4, 2, 0, 0, 0)),
           ("tl.dot", 20, 8, 64, 48, 256, "mm", None),
           ("dequantized", 0, 4, 64, 48, 320, "dequant", None)]


def _compact(device: str, gen: torch.Generator) -> list[str]:
    """Each path's output from the compact constants (16-bit scales, 16-bit ``b / s``;
    :func:`engine.runtime.quant_methods.compact_constants`) is bit for bit the float32 form's,
    on constants of an integer format (16-bit scales, ``b = -z s``: GPTQ's, AWQ's)."""
    from engine.runtime import gemv_triton as gt
    from engine.runtime import quant_triton as qt
    from engine.runtime import swap_affine as sa
    from engine.runtime.quant_methods import compact_constants

    failures = []
    for name, m, bits, group, n, k, path, launch in COMPACT:
        groups = -(-k // group)
        codes = torch.randint(0, 1 << bits, (n, k), generator=gen)
        scale = (torch.rand(groups, n, generator=gen) * 0.02 + 0.001).half().float()
        zero = torch.randint(0, 1 << bits, (groups, n), generator=gen).float()
        bias_ = -(zero * scale)
        s16, r16 = compact_constants(scale, bias_)
        if s16.dtype != torch.float16 or r16.dtype != torch.float16:
            failures.append(f"{name}: constants not compacted ({s16.dtype}, {r16.dtype})")
            continue
        sub = qt.affine_sub(group)
        q = qt.pack_affine(codes, bits, sub).to(device)
        x = torch.randn(max(m, 1), k, generator=gen).to(torch.float16).to(device)
        outs = []
        for s, b in ((scale, bias_), (s16, r16)):
            s, b = s.to(device), b.to(device)
            if path == "swap":
                y = sa.affine_swap(x, q, s, b, bits, group, sub, config=launch)
            elif path == "gemv":
                y = gt.gemv_affine(x, q, s, b, bits, group, sub, config=launch)
            elif path == "mm":
                y = qt.affine_mm(x, q, s, b, bits, group, sub)
            else:
                y = qt.dequant_affine(q, s, b, bits, group, sub, k, torch.float32)
            outs.append(y.cpu())
        if not torch.equal(outs[0], outs[1]):
            diff = (outs[0].double() - outs[1].double()).abs().max().item()
            failures.append(f"{name}: differs from the float32 constants' by {diff:.3g}")
    return failures


def main(device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    results = {name: check(name, p, device, gen) for name, p in CASES.items()}
    results["refusals"] = _refusals(device)
    results["compact"] = _compact(device, gen)
    print(json.dumps(results))


# ---------------------------------------------------------------- the inline PTX, emulated

def _emulate(asm: str, a: int, b: int) -> int:
    """The result of :func:`engine.runtime.swap_affine._field_asm`'s PTX for the 32-bit words
    ``a`` ($1) and ``b`` ($2): its prmt, shr.u32 and lop3 steps on Python integers."""
    regs = {"$1": a, "$2": b}
    val = lambda tok: regs[tok] if tok in regs else int(tok, 0)  # noqa: E731
    body = asm.strip()[1:-1].split(";")
    for step in body:
        words = step.replace(",", " ").split()
        if not words or words[0] == ".reg":
            continue
        op, dst, *src = words
        if op == "prmt.b32":
            pool = (val(src[1]) << 32) | val(src[0])  # bytes of a then b
            sel = val(src[2])
            out = 0
            for i in range(4):
                out |= ((pool >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i)
        elif op == "shr.u32":
            out = val(src[0]) >> val(src[1])
        elif op == "lop3.b32":
            x0, x1, x2, lut = (val(t) for t in src)
            out = 0
            for bit in range(32):
                i = (((x0 >> bit) & 1) << 2) | (((x1 >> bit) & 1) << 1) | ((x2 >> bit) & 1)
                out |= ((lut >> i) & 1) << bit
        else:
            raise AssertionError(f"unexpected instruction {op}")
        regs[dst] = out & 0xFFFFFFFF
    return regs["$0"]


def test_groups_in_columns_split_covers_at_most_the_columns():
    """The split the one-row columns form takes: the least, from the launch's, whose slices (as
    the kernel cuts whole tiles) each span at most 16 groups; None where one tile spans more."""
    pytest.importorskip("triton")
    from engine.runtime.swap_affine import _cols_split

    def widest(k, pack, group, split):
        tiles = -(-k // pack)
        steps = -(-tiles // split)
        spans = [(min(tiles * pack, lo + steps * pack) - 1) // group - lo // group + 1
                 for lo in range(0, tiles * pack, steps * pack)]
        return max(spans)

    for k, group, split in ((4096, 128, 1), (4096, 128, 4), (14336, 128, 8), (768, 16, 1),
                            (1024, 512, 3), (320, 32, 2), (4096, 4096, 1), (14336, 64, 2)):
        got = _cols_split(k, 256, group, split, 16)
        assert got is not None and got >= split and widest(k, 256, group, got) <= 16
        assert got == split or widest(k, 256, group, got - 1) > 16, (k, group, split, got)
    assert _cols_split(4096, 256, 128, 1, 16) == 2  # 32 groups: two slices of 16
    assert _cols_split(4096, 256, 8, 1, 16) is None  # one tile alone spans 32 groups


@pytest.mark.parametrize("form", [(4, 0x4300), (4, 0x6400), (2, 0x4300), (8, 0x6400),
                                  (8, 0x4300)])
def test_inline_ptx_matches_the_elementwise_form(form):
    """For every field position of a code form (bits, magic; 8-bit with bfloat16: the two
    nibbles of each byte with 0x4300 and 0x4500), the PTX of two words gives the elementwise
    form's 16-bit patterns of the first word (low half) and the second (high half)."""
    pytest.importorskip("triton")
    from engine.runtime import swap_affine as sa

    if not hasattr(sa, "_field_asm"):
        pytest.skip("this Triton has no constexpr functions (no inline PTX either)")
    bits, magic = form
    fields = ([(p, 4, 0x4300 if p % 8 == 0 else 0x4500) for p in range(0, 32, 4)]
              if (bits, magic) == (8, 0x4300) else
              [(p, bits, magic) for p in range(0, 32, bits)])
    gen = torch.Generator().manual_seed(1)
    words = torch.randint(-2 ** 31, 2 ** 31, (64, 2), generator=gen, dtype=torch.int64)
    for pos, width, mag in fields:
        asm = sa._field_asm(pos, width, mag)
        assert re.search(r"lop3\.b32 \$0", asm)
        for a, b in words.tolist():
            a, b = a & 0xFFFFFFFF, b & 0xFFFFFFFF
            want = [((v >> pos) & ((1 << width) - 1)) | mag for v in (a, b)]
            got = _emulate(asm, a, b)
            assert (got & 0xFFFF, got >> 16) == tuple(want), (pos, width, hex(a), hex(b))


# ---------------------------------------------------------------- the tests

def _run(device: str, env: dict) -> dict:
    from child_checks import run_checks  # (this file is the child's script too)

    return run_checks(__file__, device, env=env, timeout=600)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")
    return _run("cpu", {"TRITON_INTERPRET": "1"})


@pytest.mark.parametrize("name", list(CASES) + ["refusals", "compact"])
def test_under_the_interpreter(interpreted, name):
    assert interpreted[name] == []


def test_launch_overrides_replace_table_entries():
    """``ENGINE_AFFINE_LAUNCHES`` entries parse into the launch table's keys and launches."""
    from engine.runtime import swap_affine as sa

    got = sa._launch_overrides("wide:1=128,2,4,3,2; square:16=64,4,4,3,0;")
    assert got == {("wide", 1): (128, 2, 4, 3, 2), ("square", 16): (64, 4, 4, 3, 0)}
    assert set(got) <= set(sa.CONFIGS) and sa._launch_overrides("") == {}
    with pytest.raises(ValueError, match="ENGINE_AFFINE_LAUNCHES: 'wide=128,2' is not CLASS"):
        sa._launch_overrides("wide=128,2")


@pytest.mark.gpu
def test_on_the_gpu():
    from child_checks import gpu_failures

    failures = gpu_failures(__file__)
    assert not failures, failures


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
