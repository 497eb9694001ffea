"""The one-row 8-bit product whose codes are widened by integer operations
(:func:`engine.runtime.row8_triton.w8_row`) equals its formats' float64 references and
:func:`engine.runtime.quant_triton.w8_mm` on the same inputs: e4m3, e5m2 and int8 codes (every
code value, subnormals included), activations unquantized, dynamic per row (the scale from the
whole row, unrolled or in a loop) and static, bias, half and float32 outputs, N and K not
multiples of the launch, K split over several programs. Under the Triton interpreter here (a
child process), on the GPU where there is one.

Run as a script (``python tests/runtime/test_row8_kernel.py cpu|cuda``) it prints one JSON
object: case name -> failures.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_swap_kernels import E4M3, E5M2, _inputs, _reference  # noqa: E402

#: launches (BLOCK_N, columns a program, warps) small enough for the interpreter
SMALL = (16, 128, 4)


def _case(name: str, fmt: str = E4M3, act: str | None = "token", n: int = 70, k: int = 320,
          config: tuple = SMALL, bias: bool = False, out: str = "float32",
          amax_unroll: int | None = None):
    """(name, parameters) of one case (``amax_unroll``: ``AMAX_UNROLL`` for it; 0: the row's
    dynamic scale read in a loop)."""
    return name, dict(m=1, fmt=fmt, act=act, n=n, k=k, block=None, config=config, bias=bias,
                      out=out, amax_unroll=amax_unroll)


CASES = dict(
    [_case(f"{fmt} {act}", fmt=fmt, act=act) for fmt in (E4M3, E5M2, "int8")
     for act in (None, "token", "static")]
    + [_case("e4m3 token one slice", config=(8, 512, 4)),
       _case("e4m3 none half bias", act=None, bias=True, out="float16"),
       _case("int8 token bias half", fmt="int8", bias=True, out="float16"),
       _case("e5m2 token bias", fmt=E5M2, bias=True),
       _case("e4m3 token K 2500 (the row's scale in a loop)", k=2500, n=20, amax_unroll=0),
       _case("int8 token K 2500 unrolled", fmt="int8", k=2500, n=20),
       _case("int8 token K 4 (one word)", fmt="int8", k=4, n=9),
       _case("e4m3 static bfloat16 out", act="static", out="bfloat16"),
       _case("e4m3 token split 3 one output", n=1, k=384, config=(4, 128, 2))])


def _every_code(fmt: str) -> torch.Tensor:
    """Weights [4, 64] holding every code of the format once (NaN codes excluded)."""
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    if fmt == "int8":
        return codes.view(torch.int8).reshape(4, 64)
    dtype = getattr(torch, fmt)
    w = codes.view(dtype).float()
    return torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0).to(dtype).reshape(4, 64)


def check(name: str, p: dict, device: str, gen: torch.Generator) -> list[str]:
    """One case: ``w8_row`` against the float64 reference (int8 codes times int8 activation
    codes with float32 out: bit-exact against torch's integer product) and ``w8_mm``."""
    from engine.runtime import quant_triton as qt
    from engine.runtime import row8_triton as rt

    x, w, ws, x_scale, bias = _inputs(p, gen)
    out = getattr(torch, p["out"])
    dev = lambda t: t.to(device) if t is not None else None  # noqa: E731
    kw = dict(act=p["act"], x_scale=dev(x_scale) if p["act"] == "static" else None,
              out_dtype=out, bias=dev(bias))
    if not rt.serves(dev(x), dev(w), None, p["act"]):
        return [f"{name}: not served"]
    saved = rt.AMAX_UNROLL
    rt.AMAX_UNROLL = saved if p["amax_unroll"] is None else p["amax_unroll"]
    try:
        y = rt.w8_row(dev(x), dev(w), dev(ws), config=p["config"], **kw).cpu()
    finally:
        rt.AMAX_UNROLL = saved
    mm = qt.w8_mm(dev(x), dev(w), dev(ws), path="dot", **kw).cpu()
    want, exact = _reference(x, w, ws, p["act"], None, x_scale)
    if bias is not None:
        want = want + bias.double()
        exact = exact + bias.float() if exact is not None else None
    if y.shape != (1, p["n"]) or y.dtype != out or not torch.isfinite(y).all():
        return [f"{name}: shape {tuple(y.shape)} dtype {y.dtype}, or not finite"]
    scale = want.abs().max().item()
    rel = 2.0 ** -18 if out == torch.float32 else 2.0 ** -7 if out == torch.bfloat16 \
        else 2.0 ** -10
    failures = []
    err = (y.double() - want).abs().max().item()
    if err > rel * scale:
        failures.append(f"{name}: max error {err:.3g} against float64 > {rel * scale:.3g}")
    if exact is not None and bias is None and out == torch.float32 and not torch.equal(y, exact):
        failures.append(f"{name}: int8 not bit-exact ({(y - exact).abs().max().item():.3g})")
    diff = (y.double() - mm.double()).abs().max().item()
    if diff > 2 * rel * scale:
        failures.append(f"{name}: differs from w8_mm by {diff:.3g} > {2 * rel * scale:.3g}")
    return failures


def _every_code_check(fmt: str, device: str) -> list[str]:
    """Every code (subnormals, both zeros, the extremes) widened exactly: the weights times
    one-hot rows, unquantized activations, float32 out, equal to the codes' values."""
    from engine.runtime import row8_triton as rt

    w = _every_code(fmt)
    ws = torch.ones(4)
    failures = []
    for col in (0, 1, 2, 3, 61):  # each byte position of a word, and a later word
        x = torch.zeros(1, 64)
        x[0, col] = 1.0
        y = rt.w8_row(x.to(device), w.to(device), ws.to(device), config=(4, 64, 4)).cpu()
        want = w.float()[:, col].reshape(1, 4)
        if not torch.equal(y, want):
            failures.append(f"{fmt} column {col}: {y.tolist()} != {want.tolist()}")
    return failures


def main(device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    results = {name: check(name, p, device, gen) for name, p in CASES.items()}
    for fmt in (E4M3, E5M2, "int8"):
        results[f"every code {fmt}"] = _every_code_check(fmt, device)
    print(json.dumps(results))


# ---------------------------------------------------------------- the tests

NAMES = list(CASES) + [f"every code {fmt}" for fmt in (E4M3, E5M2, "int8")]


def _run(device: str, env: dict) -> dict:
    from child_checks import run_checks  # (this file is the child's script too)

    return run_checks(__file__, device, env=env, timeout=600)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")
    return _run("cpu", {"TRITON_INTERPRET": "1"})


@pytest.mark.parametrize("name", NAMES)
def test_under_the_interpreter(interpreted, name):
    assert interpreted[name] == []


def test_what_it_serves():
    """One row, per-output scales, whole words of codes: block scales, more rows, a K that is
    not a multiple of 4 and float weights go elsewhere."""
    from engine.runtime import row8_triton as rt

    x, w = torch.zeros(1, 64), torch.zeros(8, 64, dtype=torch.int8)
    assert rt.serves(x, w, None, "token") and rt.serves(x, w, None, None)
    assert not rt.serves(x, w, (128, 128), "group")
    assert not rt.serves(torch.zeros(2, 64), w, None, "token")
    assert not rt.serves(torch.zeros(1, 62), torch.zeros(8, 62, dtype=torch.int8), None, None)
    assert not rt.serves(x, torch.zeros(8, 64), None, None)


@pytest.mark.gpu
def test_on_the_gpu():
    failures = [f for fs in _run("cuda", {}).values() for f in fs]
    assert failures == [], "\n".join(failures)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
