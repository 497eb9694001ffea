"""The swapped-operand 8-bit product :func:`engine.runtime.swap_triton.w8_swap` equals its
formats' float64 references and :func:`engine.runtime.quant_triton.w8_mm` on the same inputs:
fp8 (e4m3, e5m2) and int8 codes, activations unquantized, dynamic per row, static and per
group (block fp8), bias, N and K not multiples of the tiles, 1 to 128 rows (padded to blocks
of 16, 32, 64 or 128), K split over several programs. Under the Triton interpreter here (a
child process: the interpreter must be chosen before Triton is imported), on the GPU where
there is one.

Run as a script (``python tests/runtime/test_swap_kernels.py cpu|cuda``) it prints one JSON
object: case name -> failures.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
#: a case's kernel forms (``_case``'s flags) -> the environment variable that asks for each
FORMS = {"row_epilogue": "ENGINE_SWAP_ROW_EPILOGUE", "even": "ENGINE_SWAP_EVEN",
         "tma": "ENGINE_SWAP_TMA", "group_codes": "ENGINE_SWAP_GROUP_CODES",
         "scales_ahead": "ENGINE_SWAP_SCALES_AHEAD", "late_scale": "ENGINE_SWAP_LATE_SCALE"}
#: tile launches (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages) small enough for the interpreter
ONE_SLICE = (64, 128, 1, 4, 2)


def _case(name: str, m: int, fmt: str = E4M3, act: str | None = "token", n: int = 130,
          k: int = 320, block: tuple | None = None, config: tuple | None = ONE_SLICE,
          bias: bool = False, out: str = "float32", quant_rows_from: int | None = None,
          amax_unroll: int | None = None, row_epilogue: bool = False, even: bool = False,
          tma: bool = False, group_codes: bool = False, scales_ahead: bool = False,
          late_scale: bool = False):
    """(name, parameters) of one case: ``m`` rows, weight ``fmt`` [n, k], ``act`` as
    ``w8_swap``'s, ``block`` scales, launch ``config`` (BLOCK_K 0: the block's), ``out``
    dtype, ``quant_rows_from``: ``QUANT_ROWS_FROM`` for the case (17: rows quantized in the
    kernel), ``amax_unroll``: ``AMAX_UNROLL`` for the case (0: one row's scale read in a
    loop), ``row_epilogue``: one row's epilogue on the row alone
    (``ENGINE_SWAP_ROW_EPILOGUE=1``; else ``0``), ``even``: whole tiles loaded without masks
    where the shape allows (``ENGINE_SWAP_EVEN=1``), ``tma``: weight tiles through tensor
    descriptors where the GPU allows (``ENGINE_SWAP_TMA=1``; the interpreter: never),
    ``group_codes``: rows quantized per group first (``ENGINE_SWAP_GROUP_CODES=1``),
    ``scales_ahead``: with them, each iteration's scales loaded by the iteration before
    (``ENGINE_SWAP_SCALES_AHEAD=1``), ``late_scale``: one row's dynamic scale taken in the
    first iteration (``ENGINE_SWAP_LATE_SCALE=1``)."""
    return name, dict(m=m, fmt=fmt, act=act, n=n, k=k, block=block, config=config, bias=bias,
                      out=out, quant_rows_from=quant_rows_from, amax_unroll=amax_unroll,
                      row_epilogue=row_epilogue, even=even, tma=tma,
                      group_codes=group_codes, scales_ahead=scales_ahead,
                      late_scale=late_scale)


CASES = dict(
    [_case(f"fp8 {act} m={m}", m, act=act) for m in (1, 2, 5, 16)
     for act in (None, "token", "static")]
    + [_case(f"int8 token m={m}", m, fmt="int8") for m in (1, 2, 5, 16)]
    + [_case(f"block group m={m}", m, act="group", n=200, block=(128, 128),
             config=(64, 0, 1, 4, 2)) for m in (1, 2, 16)]
    + [_case("e5m2 token m=3", 3, fmt=E5M2),
       _case("e5m2 none m=1", 1, fmt=E5M2, act=None),
       _case("int8 static m=1", 1, fmt="int8", act="static"),
       _case("int8 static m=7", 7, fmt="int8", act="static"),
       _case("int8 w8a16 m=2", 2, fmt="int8", act=None, out="float16"),
       _case("block none m=2", 2, act=None, n=200, k=256, block=(128, 128),
             config=(128, 0, 1, 4, 2)),
       _case("block token m=1", 1, n=256, k=256, block=(128, 128), config=(64, 0, 1, 4, 2)),
       _case("block group bn=64 m=3", 3, act="group", n=100, k=192, block=(64, 64),
             config=(128, 0, 1, 4, 2)),
       _case("bias fp8 token m=2 half", 2, bias=True, out="float16"),
       _case("bias fp8 none m=1 half", 1, act=None, bias=True, out="float16"),
       _case("bias int8 token m=1", 1, fmt="int8", bias=True),
       _case("bias block group m=4", 4, act="group", n=200, block=(128, 128), bias=True,
             config=(64, 0, 2, 4, 2)),
       _case("split 3 fp8 token m=5", 5, config=(64, 64, 3, 4, 2)),
       _case("split 4 (an empty slice) int8 m=1", 1, fmt="int8", config=(64, 64, 4, 4, 2)),
       _case("split 4 (an empty slice) fp8 none m=16 half", 16, act=None, out="float16",
             config=(64, 64, 4, 4, 2)),
       _case("split 2 block group m=16", 16, act="group", n=200, block=(128, 128),
             config=(64, 0, 2, 4, 2)),
       # two and four scale blocks per iteration (K = 320: the last partly, or wholly, past K)
       _case("block group sub 2 m=1", 1, act="group", n=200, block=(128, 128),
             config=(64, 0, 1, 4, 2, 2)),
       _case("block group sub 4 m=3", 3, act="group", n=200, block=(128, 128),
             config=(64, 0, 1, 4, 2, 4)),
       _case("split 2 block group sub 2 m=16", 16, act="group", n=200, k=640,
             block=(128, 128), config=(64, 0, 2, 4, 2, 2)),
       _case("fp8 token sub 2 m=1", 1, config=(64, 64, 1, 4, 2, 2)),
       _case("split 2 bias int8 m=3", 3, fmt="int8", bias=True, config=(128, 64, 2, 4, 2)),
       _case("rows quantized in the kernel fp8 token m=5", 5, quant_rows_from=17),
       _case("rows quantized in the kernel fp8 static m=16", 16, act="static",
             quant_rows_from=17),
       _case("rows quantized in the kernel int8 m=16 split 2", 16, fmt="int8",
             quant_rows_from=17, config=(64, 128, 2, 4, 2)),
       _case("one row's scale in 3 unrolled blocks fp8 token m=1", 1, n=70, k=2500),
       _case("one row's scale in a loop fp8 token m=1", 1, n=70, k=2500, amax_unroll=0),
       # one weight tile a program, loaded before the wait: K in one tile, in five (the last
       # partial), every activation kind, bias; block scales and two rows keep the loop
       _case("one row's scale in a loop int8 m=1", 1, fmt="int8", n=70, k=2500,
             amax_unroll=0),
       _case("one row's codes made first fp8 token m=1", 1, quant_rows_from=1),
       _case("one row's codes made first int8 static m=1", 1, fmt="int8", act="static",
             quant_rows_from=1),
       _case("row epilogue fp8 token m=1", 1, row_epilogue=True),
       _case("row epilogue split 4 (an empty slice) fp8 token m=1 bias", 1, bias=True,
             config=(64, 64, 4, 4, 2), row_epilogue=True),
       _case("row epilogue split 3 int8 static m=1", 1, fmt="int8", act="static",
             config=(64, 64, 3, 4, 2), row_epilogue=True),
       _case("row epilogue split 2 block group m=1", 1, act="group", n=200, block=(128, 128),
             config=(64, 0, 2, 4, 2), row_epilogue=True),
       _case("row epilogue split 2 e5m2 none m=1 half", 1, fmt=E5M2, act=None,
             out="float16", config=(64, 64, 2, 4, 2), row_epilogue=True),
       _case("even fp8 token m=1 split 2", 1, n=128, k=256, config=(64, 64, 2, 4, 2),
             even=True),
       _case("even int8 static m=1 bias", 1, fmt="int8", act="static", n=128, k=256,
             bias=True, even=True),
       _case("even block group m=1, two blocks an iteration, split 2", 1, act="group",
             n=256, k=512, block=(128, 128), config=(64, 0, 2, 4, 2, 2), even=True),
       _case("even fp8 token m=5", 5, n=128, k=256, even=True),
       _case("even asked, N not whole tiles e5m2 static m=1", 1, fmt=E5M2, act="static",
             even=True),
       _case("tma fp8 token m=1 (N and K not whole tiles) split 3 bias", 1, bias=True,
             config=(64, 64, 3, 4, 2), tma=True),
       _case("tma int8 static m=1", 1, fmt="int8", act="static", tma=True),
       _case("tma e5m2 token m=3, two tiles an iteration", 3, fmt=E5M2, k=2500, n=70,
             config=(64, 64, 2, 4, 2, 2), tma=True),
       _case("tma and even fp8 static m=1 split 2", 1, act="static", n=128, k=256,
             config=(64, 64, 2, 4, 2), tma=True, even=True),
       _case("tma block group m=1 (N not whole tiles), two blocks an iteration, split 2", 1,
             act="group", n=200, k=512, block=(128, 128), config=(64, 0, 2, 4, 2, 2), tma=True),
       _case("tma block group codes m=3", 3, act="group", n=256, k=384, block=(128, 128),
             config=(128, 0, 1, 4, 2), tma=True, even=True, group_codes=True),
       _case("scales ahead block m=1 (N not whole tiles), two blocks an iteration, split 2", 1,
             act="group", n=200, k=768, block=(128, 128), config=(64, 0, 2, 4, 2, 2),
             group_codes=True, scales_ahead=True),
       _case("scales ahead block m=5, four blocks an iteration (the last partly past K)", 5,
             act="group", n=128, k=640, block=(64, 128), config=(64, 0, 1, 4, 2, 4),
             group_codes=True, scales_ahead=True, even=True),
       _case("scales ahead block m=1 bias, row epilogue, two weight blocks a program", 1,
             act="group", n=256, k=384, block=(64, 128), config=(128, 0, 1, 4, 2),
             bias=True, group_codes=True, scales_ahead=True, row_epilogue=True),
       _case("scales ahead block m=2 tma split 3", 2, act="group", n=128, k=1024,
             block=(128, 128), config=(64, 0, 3, 4, 2, 2), group_codes=True,
             scales_ahead=True, tma=True),
       _case("group codes block m=1 split 2", 1, act="group", n=200, block=(128, 128),
             config=(64, 0, 2, 4, 2), group_codes=True),
       _case("group codes block m=5, two blocks an iteration", 5, act="group", n=256, k=512,
             block=(128, 128), config=(64, 0, 1, 4, 2, 2), group_codes=True),
       _case("group codes block m=1 bias half, row epilogue", 1, act="group", n=130, k=384,
             block=(64, 128), config=(64, 0, 1, 4, 2), bias=True, out="float16",
             group_codes=True, row_epilogue=True),
       _case("group codes asked, K not whole groups m=1", 1, act="group", n=200,
             block=(128, 128), config=(64, 0, 2, 4, 2), group_codes=True),
       _case("block m=1, 32 outputs a program, 1 warp (mma.sync on a GPU), split 2, scales "
             "ahead, tma, row epilogue", 1, act="group", n=200, k=512, block=(128, 128),
             config=(32, 0, 2, 1, 2), group_codes=True, scales_ahead=True, tma=True,
             row_epilogue=True),
       _case("block m=3, 16 outputs a program, 1 warp, two blocks an iteration", 3,
             act="group", n=160, k=512, block=(128, 128), config=(16, 0, 1, 1, 2, 2),
             group_codes=True, scales_ahead=True),
       _case("late scale fp8 token m=1 split 4 (the last slice empty)", 1,
             config=(64, 64, 4, 4, 2), late_scale=True),
       _case("late scale int8 token m=1 bias, half out", 1, fmt="int8", bias=True,
             out="float16", late_scale=True),
       _case("late scale e5m2 token m=1 whole tiles split 2, row epilogue", 1, fmt=E5M2,
             n=128, k=256, config=(64, 64, 2, 4, 2), even=True, row_epilogue=True,
             late_scale=True),
       _case("late scale asked, 3 rows fp8 token", 3, late_scale=True),
       _case("default launch fp8 token m=4", 4, n=64, k=384, config=None),
       _case("default launch fp8 none m=1 wide", 1, act=None, n=256, k=64, config=None),
       _case("default launch block group m=2", 2, act="group", n=128, k=384, block=(128, 128),
             config=None),
       # rows past 16: the rows padded to a block of 32 or 64
       _case("fp8 token m=17", 17), _case("fp8 static m=32", 32, act="static"),
       _case("fp8 none m=40 half", 40, act=None, out="float16"),
       _case("int8 token m=64 split 2", 64, fmt="int8", config=(64, 128, 2, 4, 2)),
       _case("block group m=33", 33, act="group", n=200, block=(128, 128),
             config=(64, 0, 1, 4, 2)),
       _case("default launch fp8 token m=48", 48, n=64, k=384, config=None),
       _case("int8 token m=100", 100, fmt="int8"),
       _case("block group m=128", 128, act="group", n=200, block=(128, 128),
             config=(64, 0, 1, 4, 2))])


# ---------------------------------------------------------------- the checks (child process)

def _reference(x, w, ws, act, block, x_scale):
    """float64 ``x @ W^T`` with the activations quantized as the format's torch quantizer
    does, and (int8) the exact float32 result ``(sum q w) * x_scale * w_scale``."""
    from engine.runtime import quant_formats as qf

    n, k = w.shape
    if block is None:
        wd = w.double() * ws.double().reshape(-1, 1)
    else:
        wd = w.double() * qf.expand_blocks(ws, n, k, block).double()
    if act is None:
        return x.double() @ wd.t(), None
    if act == "group":
        return qf.fake_quant_fp8(x, w.dtype, group=block[1]).double() @ wd.t(), None
    if w.dtype == torch.int8:
        if act == "static":
            q, s = qf.quantize_int8_static(x, x_scale), x_scale.reshape(1, 1)
        else:
            q, s = qf.quantize_int8_per_token(x)
        acc = (q.long() @ w.long().t()).to(torch.float32)
        exact = acc * s.reshape(-1, 1) * ws.reshape(1, -1) if block is None else None
        return (q.double() * s.double().reshape(-1, 1)) @ wd.t(), exact
    s = x_scale.reshape(1, 1) if act == "static" else qf.fp8_scale_per_token(x, w.dtype)
    q = qf.quantize_fp8(x, s, w.dtype)
    return (q.double() * s.double()) @ wd.t(), None


def _inputs(p: dict, gen: torch.Generator):
    m, n, k, block = p["m"], p["n"], p["k"], p["block"]
    x = torch.randn(m, k, generator=gen).to(torch.float16)
    if p["fmt"] == "int8":
        w = torch.randint(-128, 128, (n, k), generator=gen).to(torch.int8)
    else:
        dtype = getattr(torch, p["fmt"])
        w = (torch.randn(n, k, generator=gen) * 40).clamp(-440, 440).to(dtype)
    shape = (n,) if block is None else (-(-n // block[0]), -(-k // block[1]))
    ws = torch.rand(shape, generator=gen) * 0.01 + 1e-3
    x_scale = torch.tensor([0.03 if p["fmt"] == "int8" else 0.01])
    bias = torch.randn(n, generator=gen).to(torch.float16) if p["bias"] else None
    return x, w, ws, x_scale, bias


def check(name: str, p: dict, device: str, gen: torch.Generator) -> list[str]:
    """One case: ``w8_swap`` against the float64 reference (int8 with float32 out: bit-exact
    against torch's integer product) and against ``w8_mm``."""
    from engine.runtime import quant_triton as qt
    from engine.runtime import swap_triton as st

    x, w, ws, x_scale, bias = _inputs(p, gen)
    out = getattr(torch, p["out"])
    dev = lambda t: t.to(device) if t is not None else None  # noqa: E731
    kw = dict(act=p["act"], x_scale=dev(x_scale) if p["act"] == "static" else None,
              block=p["block"], out_dtype=out, bias=dev(bias))
    saved = st.QUANT_ROWS_FROM, st.AMAX_UNROLL
    st.QUANT_ROWS_FROM = p["quant_rows_from"] or saved[0]
    st.AMAX_UNROLL = saved[1] if p["amax_unroll"] is None else p["amax_unroll"]
    for form, flag in FORMS.items():
        os.environ[flag] = "1" if p[form] else "0"
    try:
        y = st.w8_swap(dev(x), dev(w), dev(ws), config=p["config"],
                       **kw).cpu()
    finally:
        st.QUANT_ROWS_FROM, st.AMAX_UNROLL = saved
        for flag in FORMS.values():
            os.environ.pop(flag)
    mm = qt.w8_mm(dev(x), dev(w), dev(ws), **kw).cpu()
    want, exact = _reference(x, w, ws, p["act"], p["block"], x_scale)
    if bias is not None:
        want = want + bias.double()
        exact = exact + bias.float() if exact is not None else None
    failures = []
    if y.shape != (p["m"], p["n"]) or y.dtype != out or not torch.isfinite(y).all():
        return [f"{name}: shape {tuple(y.shape)} dtype {y.dtype}, or not finite"]
    scale = want.abs().max().item()
    # float32 out: the codes are the quantizer's and the products exact, so only the order
    # of float32 sums differs (GPU fp8 tensor cores: a few more bits); half out: its rounding
    rel = 2.0 ** (-9 if device == "cuda" and p["fmt"] != "int8" else -18) \
        if out == torch.float32 else 2.0 ** -10
    err = (y.double() - want).abs().max().item()
    if err > rel * scale:
        failures.append(f"{name}: max error {err:.3g} against float64 > {rel * scale:.3g}")
    # (with a bias the GPU may fuse the last multiply and add into one rounding: the float64
    # check above covers it)
    if exact is not None and bias is None and out == torch.float32 and not torch.equal(y, exact):
        failures.append(f"{name}: int8 not bit-exact ({(y - exact).abs().max().item():.3g})")
    diff = (y.double() - mm.double()).abs().max().item()
    if diff > rel * scale:
        failures.append(f"{name}: differs from w8_mm by {diff:.3g} > {rel * scale:.3g}")
    return failures


def _too_many_rows(device: str) -> list[str]:
    from engine.runtime import swap_triton as st

    w = torch.zeros(64, 64, dtype=torch.int8, device=device)
    rows = st.MAX_ROWS + 1
    try:
        st.w8_swap(torch.zeros(rows, 64, device=device), w, torch.ones(64, device=device))
    except ValueError:
        return []
    return [f"{rows} rows: no ValueError"]


def _activation_codes(device: str) -> list[str]:
    """Rows handed over as codes (``act="codes"``, made by ``quant_rows``) give the product
    of the kernel that quantizes them itself, bit for bit (float32 out, one slice); codes of
    another dtype than the weights' are refused."""
    from engine.runtime import quant_triton as qt
    from engine.runtime import swap_triton as st

    gen, failures = torch.Generator().manual_seed(1), []
    for dtype in (torch.float8_e4m3fn, torch.int8):
        w = (torch.randn(130, 320, generator=gen) * 40).clamp(-120, 120).to(dtype).to(device)
        ws = (torch.rand(130, generator=gen) * 0.01 + 1e-4).to(device)
        for m in (1, 3):
            x = torch.randn(m, 320, generator=gen).to(device)
            xq, xs = qt.quant_rows(x, dtype)
            kw = dict(out_dtype=torch.float32, config=ONE_SLICE)
            got = st.w8_swap(xq, w, ws, act="codes", x_scale=xs, **kw).cpu()
            want = st.w8_swap(x, w, ws, act="token", **kw).cpu()
            if not torch.equal(got, want):
                failures.append(f"{dtype} m={m}: {(got - want).abs().max().item():.3g} apart")
    failures += _ties(device)
    failures += _group_codes(device)
    try:
        st.w8_swap(x, w, ws, act="codes", x_scale=xs)
        failures.append("float rows as codes: no ValueError")
    except ValueError:
        pass
    return failures


def _group_codes(device: str) -> list[str]:
    """Rows quantized per group first (``ENGINE_SWAP_GROUP_CODES=1``: ``quant_groups``, then
    the product of codes and group scales) give the product that quantizes each tile itself,
    bit for bit (float32 out, one slice; one row and three)."""
    from engine.runtime import swap_triton as st

    gen, failures = torch.Generator().manual_seed(4), []
    w = (torch.randn(130, 384, generator=gen) * 40).clamp(-120, 120).to(torch.float8_e4m3fn)
    ws = torch.rand(2, 3, generator=gen) * 0.01 + 1e-4
    for m in (1, 3):
        x = torch.randn(m, 384, generator=gen).to(device)
        ys = []
        for flag in ("0", "1"):
            os.environ["ENGINE_SWAP_GROUP_CODES"] = flag
            ys.append(st.w8_swap(x, w.to(device), ws.to(device), act="group", block=(128, 128),
                                 out_dtype=torch.float32, config=(64, 128, 1, 4, 2)).cpu())
        os.environ.pop("ENGINE_SWAP_GROUP_CODES")
        if not torch.equal(ys[0], ys[1]):
            failures.append(f"group codes m={m}: {(ys[0] - ys[1]).abs().max().item():.3g} apart")
    return failures


def _ties(device: str) -> list[str]:
    """One row whose quotients are exact midpoints of the fp8 grid (normal and subnormal, both
    signs; its maximum 448 or 57344 makes the dynamic scale exactly 1): the kernel's own codes
    (on a GPU, rounded by the conversion instruction) give the product of the codes
    ``quant_rows`` makes (rounded to the grid in float32), bit for bit."""
    from engine.runtime import quant_triton as qt
    from engine.runtime import swap_triton as st

    failures = []
    for dtype, top, mant, emin in ((torch.float8_e4m3fn, 448.0, 3, -6),
                                   (torch.float8_e5m2, 57344.0, 2, -14)):
        grid = torch.arange(1, 2 ** mant + 1, dtype=torch.float64) / 2 ** mant
        mids = torch.cat([(grid[:-1] + grid[1:]) / 2 * 2.0 ** e for e in range(emin, 4)]
                         + [torch.arange(1, 2 ** mant, dtype=torch.float64) / 2 ** (mant + 1)
                            * 2.0 ** emin])  # (the last: subnormal midpoints)
        row = torch.cat([mids, -mids, torch.tensor([top])]).float()
        k = row.numel()
        x = torch.zeros(1, 256)
        x[0, :k] = row
        gen = torch.Generator().manual_seed(3)
        w = (torch.randn(64, 256, generator=gen) * 8).to(dtype).to(device)
        ws = torch.ones(64, device=device)
        xq, xs = qt.quant_rows(x.to(device), dtype)
        kw = dict(out_dtype=torch.float32, config=ONE_SLICE)
        got = st.w8_swap(x.to(device), w, ws, act="token", **kw).cpu()
        want = st.w8_swap(xq, w, ws, act="codes", x_scale=xs, **kw).cpu()
        if xs.item() != 1.0 or not torch.equal(got, want):
            failures.append(f"ties {dtype}: scale {xs.item()}, "
                            f"{(got - want).abs().max().item():.3g} apart")
    return failures


def _one_row_forms_bit_equal(device: str) -> list[str]:
    """One row's epilogue on the row alone (``ENGINE_SWAP_ROW_EPILOGUE=1``) gives the padded
    block's epilogue's results (``0``) bit for bit: the same sums, in the same order, scaled
    alike."""
    from engine.runtime import swap_triton as st

    gen, failures = torch.Generator().manual_seed(2), []
    for dtype, act, block, split in ((torch.float8_e4m3fn, "token", None, 1),
                                     (torch.float8_e4m3fn, "token", None, 4),
                                     (torch.int8, "static", None, 3),
                                     (torch.float8_e4m3fn, "group", (64, 64), 2),
                                     (torch.float8_e5m2, "static", None, 4),
                                     (torch.float8_e4m3fn, None, None, 2)):
        w = (torch.randn(130, 320, generator=gen) * 40).clamp(-120, 120).to(dtype).to(device)
        ws = (torch.rand((3, 5) if block else (130,), generator=gen) * 0.01 + 1e-4).to(device)
        kw = dict(act=act, block=block, out_dtype=torch.float32,
                  bias=torch.randn(130, generator=gen).to(device),
                  x_scale=torch.full((1,), 0.02, device=device) if act == "static" else None,
                  config=(64, 0 if block else 64, split, 4, 2))
        x = torch.randn(1, 320, generator=gen).to(device)
        ys = []
        for epilogue in ("0", "1"):
            os.environ["ENGINE_SWAP_ROW_EPILOGUE"] = epilogue
            ys.append(st.w8_swap(x, w, ws, **kw).cpu())
        os.environ.pop("ENGINE_SWAP_ROW_EPILOGUE")
        if not torch.equal(ys[0], ys[1]):
            failures.append(f"row epilogue {dtype} {act} split {split}: "
                            f"{(ys[0] - ys[1]).abs().max():.3g}")
    return failures


def main(device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    results = {name: check(name, p, device, gen) for name, p in CASES.items()}
    results["too many rows"] = _too_many_rows(device)
    results["activation codes"] = _activation_codes(device)
    results["one-row forms bit-equal"] = _one_row_forms_bit_equal(device)
    print(json.dumps(results))


# ---------------------------------------------------------------- the tests

def _run(device: str, env: dict) -> dict:
    from child_checks import run_checks  # (this file is the child's script too)

    return run_checks(__file__, device, env=env, timeout=600)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")
    return _run("cpu", {"TRITON_INTERPRET": "1"})


@pytest.mark.parametrize("name", list(CASES) + ["too many rows", "activation codes",
                                                "one-row forms bit-equal"])
def test_under_the_interpreter(interpreted, name):
    assert interpreted[name] == []


def test_one_row_of_fp8_codes_into_more_outputs_than_inputs_takes_its_own_launch(monkeypatch):
    """Fused q/k/v weights (more outputs than inputs, fewer than four times) are their own
    launch class at one row of 8-bit codes: all of K a program, where o's square weights
    take it in slices; ``ENGINE_SWAP_TALL=0`` gives them the square launch again; more rows
    take the square launches; block fp8 has launches of its own for both (its step search
    chose 8 slices of 128 outputs for q/k/v, 4 slices of 64 for o)."""
    from engine.runtime import swap_triton as st

    e4m3 = torch.float8_e4m3fn
    qkv, o = (6144, 4096), (4096, 4096)
    assert st.swap_class(*qkv) == "tall" and st.swap_class(*o) == "square"
    assert st.small_config(e4m3, "token", None, *qkv, 1)[2] == 1
    assert st.small_config(e4m3, "token", None, *o, 1)[2] > 1
    assert st.small_config(torch.int8, "token", None, *qkv, 1)[2] == 1
    for m in (4, 16, 40):
        assert st.small_config(e4m3, "token", None, *qkv, m) == \
            st.small_config(e4m3, "token", None, *o, m)
    assert st.small_config(e4m3, "group", (128, 128), *qkv, 1)[:3] == (128, 128, 8)
    assert st.small_config(e4m3, "group", (128, 128), *o, 1)[:3] == (64, 128, 4)
    monkeypatch.setenv("ENGINE_SWAP_TALL", "0")
    assert st.swap_class(*qkv) == "square"
    assert st.small_config(e4m3, "token", None, *qkv, 1) == \
        st.small_config(e4m3, "token", None, *o, 1)


@pytest.mark.gpu
def test_on_the_gpu():
    from child_checks import gpu_failures

    failures = gpu_failures(__file__)
    assert not failures, failures


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
