"""One row of 4-bit codes through :func:`engine.runtime.nibbles_triton.gemv_nibbles` equals the
float64 product of its dequantized weights: groups 16 to 576 (a group inside a slice, several
to a tile, across tiles, K one group), N and K not multiples of the launch, K in one or several
slices (one iteration a program, or streamed; an empty slice), 1, 2 and 4 tiles an iteration,
the groups' constants loaded before the wait or after it, float32 and the 16-bit compact
constants, bias or none, bfloat16 and float16 activations; and ``affine_mm`` routes one row
there for the square weights by default, or for those ``ENGINE_W4_NIBBLES`` names. Under the
Triton interpreter here (a child process: the interpreter is chosen before Triton is
imported), on the GPU where there is one.

Run as a script (``python tests/runtime/test_nibbles_triton.py cpu|cuda``) it prints one JSON
object: case name -> failures.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

# (n, k, group, launch (BLOCK_N, TILES, split, warps, VEC[, PRE_CONST]), dtype, bias,
# compact)
CASES = {
    "one iteration a program, groups of 128": (64, 512, 128, (64, 1, 0, 4, 4), "bfloat16",
                                               True, False),
    "N and K past the launch, two tiles": (40, 320, 128, (32, 2, 0, 4, 4), "bfloat16", False,
                                           False),
    "streamed, two slices": (64, 1024, 128, (32, 1, 2, 4, 4), "bfloat16", True, True),
    "groups of 64, float16, three slices": (48, 2048, 64, (16, 2, 3, 4, 4), "float16", True,
                                            False),
    "groups of 32, K padded": (40, 288, 32, (32, 1, 2, 4, 4), "bfloat16", True, True),
    "groups of 16 (slices of 16)": (40, 96, 16, (32, 1, 0, 4, 4), "bfloat16", False, False),
    "groups across tiles, four tiles": (64, 1024, 256, (64, 4, 0, 4, 4), "bfloat16", True,
                                        False),
    "groups of 512 streamed, compact": (40, 2048, 512, (32, 2, 2, 4, 4), "bfloat16", True,
                                        True),
    "K one group of 576": (40, 576, 576, (32, 1, 1, 4, 4), "bfloat16", True, False),
    "four tiles streamed": (24, 1536, 128, (16, 4, 2, 4, 4), "float16", True, True),
    "streamed, an empty slice": (24, 1792, 128, (16, 1, 5, 4, 4), "float16", True, True),
    "constants after the wait": (64, 1024, 128, (32, 2, 0, 4, 4, 0), "bfloat16", True, True),
    "constants before the wait, groups of 256": (64, 1280, 256, (32, 1, 0, 4, 4, 1),
                                                 "bfloat16", True, False),
}


def check(name: str, case: tuple, device: str, gen: torch.Generator) -> list[str]:
    from engine.runtime import nibbles_triton as nt
    from engine.runtime import quant_triton as qt
    from engine.runtime.quant_methods import compact_constants

    n, k, group, launch, dtype, with_bias, compact = case
    groups = -(-k // group)
    codes = torch.randint(0, 16, (n, k), generator=gen)
    scale = torch.rand(groups, n, generator=gen) * 0.02 + 0.001
    offset = torch.randn(groups, n, generator=gen) * 0.05
    if compact:
        scale = scale.half().float()
    expand = lambda t: t.double().t().repeat_interleave(group, 1)[:, :k]  # noqa: E731
    w = codes.double() * expand(scale) + expand(offset)
    x = torch.randn(1, k, generator=gen).to(getattr(torch, dtype))
    bias = torch.randn(n, generator=gen).to(x.dtype) if with_bias else None
    s, b = compact_constants(scale, offset) if compact else (scale, offset)
    sub = qt.affine_sub(group)
    dev = lambda t: t.to(device) if t is not None else None  # noqa: E731
    y = nt.gemv_nibbles(dev(x), dev(qt.pack_affine(codes, 4, sub)), dev(s), dev(b), group, sub,
                        bias=dev(bias), config=launch).cpu()
    if y.shape != (1, n) or y.dtype != x.dtype or not torch.isfinite(y).all():
        return [f"{name}: shape {tuple(y.shape)} dtype {y.dtype}, or not finite"]
    want = x.double() @ w.t() + (bias.double() if bias is not None else 0.0)
    # the output's rounding (the interpreter truncates bfloat16: one unit more), plus float32
    # sums of exact products in another order: bounded by their magnitudes
    unit = 2.0 ** -7 if x.dtype == torch.bfloat16 else 2.0 ** -10
    bound = 2 * unit * want.abs() + 2.0 ** -18 * (x.double().abs() @ w.abs().t())
    excess = ((y.double() - want).abs() - bound).max().item()
    if excess > 0:
        return [f"{name}: exceeds the float64 bound by {excess:.3g}"]
    return []


def _routing(device: str, gen: torch.Generator) -> list[str]:
    """``affine_mm`` at one row calls gemv_nibbles for the weights ENGINE_W4_NIBBLES names (the
    child sets it for 40 x 320 only; on a GPU: the route takes CUDA tensors) and no other,
    with the launch named; and, with the default classes (the variable unset), for the
    "square" weights alone at the class's launch."""
    from engine.runtime import nibbles_triton as nt
    from engine.runtime import quant_triton as qt

    def one_row(n, k):
        codes = torch.randint(0, 16, (n, k), generator=gen)
        s = torch.rand(-(-k // 128), n, generator=gen) * 0.02 + 0.001
        b = torch.randn(-(-k // 128), n, generator=gen) * 0.05
        x = torch.randn(1, k, generator=gen).to(torch.bfloat16)
        qt.affine_mm(x.to(device), qt.pack_affine(codes, 4, 32).to(device), s.to(device),
                     b.to(device), 4, 128, 32)

    calls = []
    real, route, classes = nt.gemv_nibbles, qt.W4_NIBBLES_ROUTE, qt.W4_NIBBLES_CLASSES
    nt.gemv_nibbles = lambda *a, **kw: calls.append(((a[1].shape[0], a[0].shape[1]),
                                                     kw.get("config"))) or real(*a, **kw)
    try:
        for n, k in ((40, 320), (48, 256), (128, 128)):  # deep, deep, square
            one_row(n, k)
        named = list(calls)
        calls.clear()
        qt.W4_NIBBLES_ROUTE = {}
        qt.W4_NIBBLES_CLASSES = qt._nibbles_classes("")
        for n, k in ((40, 320), (128, 128), (512, 128)):  # deep, square, wide
            one_row(n, k)
    finally:
        nt.gemv_nibbles, qt.W4_NIBBLES_ROUTE, qt.W4_NIBBLES_CLASSES = real, route, classes
    want = ([((40, 320), (32, 1, 0, 4, 4))], [((128, 128), None)]) if device == "cuda" else (
        [], [])
    return [f"gemv_nibbles called for {got}, expected {w}"
            for got, w in zip((named, calls), want) if got != w]


def main(device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    results = {name: check(name, case, device, gen) for name, case in CASES.items()}
    results["routing"] = _routing(device, gen)
    print(json.dumps(results))


# ---------------------------------------------------------------- the tests

#: the route the routing check asks for (one weight's shape, at a launch of its own)
ROUTE_ENV = {"ENGINE_W4_NIBBLES": "40x320:32,1,0,4,4"}


def _run(device: str, env: dict) -> dict:
    from child_checks import run_checks  # (this file is the child's script too)

    return run_checks(__file__, device, env={**ROUTE_ENV, **env}, timeout=600)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")
    return _run("cpu", {"TRITON_INTERPRET": "1"})


@pytest.mark.parametrize("name", list(CASES) + ["routing"])
def test_under_the_interpreter(interpreted, name):
    assert interpreted[name] == []


def test_default_classes_by_variable():
    """Unset: the square class; 0 or a spec naming weights: none by class; 1: every class."""
    from engine.runtime import quant_triton as qt

    assert qt._nibbles_classes("") == {"square"}
    assert qt._nibbles_classes("0") == set()
    assert qt._nibbles_classes("40x320:32,1,0,4,4") == set()
    assert qt._nibbles_classes("1") == {"square", "wide", "deep"}


def test_route_spec_names_the_variable():
    from engine.runtime import quant_triton as qt

    assert qt.launch_spec("6144x4096:128,2,0,4,4", "ENGINE_W4_NIBBLES", "f", qt._shape) == {
        (6144, 4096): (128, 2, 0, 4, 4)}
    with pytest.raises(ValueError, match="ENGINE_W4_NIBBLES: 'x:1' is not"):
        qt.launch_spec("x:1", "ENGINE_W4_NIBBLES", "f", qt._shape)


@pytest.mark.gpu
def test_on_the_gpu():
    from child_checks import gpu_failures

    failures = gpu_failures(__file__, ROUTE_ENV)
    assert not failures, failures


if __name__ == "__main__":
    sys.path.insert(0, __import__("os").path.dirname(__file__))
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
