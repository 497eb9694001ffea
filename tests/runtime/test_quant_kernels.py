"""The packed-weight products (GPTQ/AWQ/compressed-tensors/MLX/auto-round codes, fp8 and int8
W8A8, block fp8) equal their formats' float references, kernel by kernel and through each
plugin's layer: under the Triton interpreter here, on the GPU where there is one."""

import os

import pytest
import torch

from child_checks import run_checks

CHECKS = os.path.join(os.path.dirname(__file__), "quant_kernel_checks.py")


def run(device: str, env: dict) -> list:
    return run_checks(CHECKS, device, env=env)


def test_quant_kernels_under_the_interpreter():
    assert run("cpu", {"TRITON_INTERPRET": "1"}) == []


@pytest.mark.gpu
def test_quant_kernels_on_the_gpu():
    assert run("cuda", {}) == []


def test_cpu_layers_stay_dense(monkeypatch):
    """Without a GPU (or the interpreter) a weight-only layer is served by its dense copy."""
    from engine.runtime.quant_methods import packed_kernels
    from engine.runtime.linear import Linear
    from engine.runtime.quant_schemes import AWQMethod

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    layer = Linear(64, 64, dtype=torch.bfloat16, quant_method=AWQMethod(32).bind("x"))
    assert not packed_kernels(layer)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert packed_kernels(layer)
    monkeypatch.setenv("ENGINE_DISABLE_QUANT_KERNELS", "1")
    assert not packed_kernels(layer)


def test_act_order_permutation():
    from engine.runtime.quant_methods import act_order

    g = torch.tensor([1, 0, 1, 0, 2, 2])
    ok, perm = act_order(g, 2)
    assert ok and g[perm].tolist() == [0, 0, 1, 1, 2, 2]
    assert act_order(torch.arange(6) // 2, 2) == (True, None)
    assert act_order(torch.tensor([0, 0, 0, 1, 2, 2]), 2)[0] is False


ROWWISE = r"""
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from engine.testing import quant as tq
from engine.runtime import quant_methods as qm
from engine.runtime import quant_triton as qt

calls = []
quant_rows = qt.quant_rows
qt.quant_rows = lambda *a, **k: calls.append(1) or quant_rows(*a, **k)
gen = torch.Generator().manual_seed(0)
parts = {"q_proj": 64, "k_proj": 32, "v_proj": 32}
dense = {f"m.{p}.weight": torch.randn(n, 64, generator=gen) / 8 for p, n in parts.items()}
x = torch.randn(qm.KERNEL_ROWS + 3, 64, generator=gen).to(torch.bfloat16)
for scheme in ("ct_fp8_dynamic", "fp8_tensor"):
    tensors, cfg, _ = tq.quantize_state(dense, scheme)
    hook = __import__(f"engine_quant_{tq.CHOICE[scheme].replace('-', '_')}.impl",
                      fromlist=["x"]).engine_create_quant_method
    layer = tq.load_fused_layer(hook(quant_config=cfg).for_layer("m.qkv_proj"), tensors, "m",
                                parts, 64, torch.bfloat16)
    assert layer.kernel and layer.w_scale is not None
    layer.cuda_rowwise = True  # as on a GPU: above KERNEL_ROWS rows, torch._scaled_mm
    got = layer(x)
    assert calls, "the codes did not come from quant_rows"
    calls.clear()
    layer.kernel = False  # the same product over the torch ops' codes
    want = layer(x)
    assert not calls and torch.equal(got, want), (scheme, (got.float() - want.float()).abs().max())
print("ok")
"""


def test_rowwise_fp8_above_the_kernel_rows_quantizes_in_one_kernel_as_the_torch_ops_do():
    """Above ``KERNEL_ROWS`` rows, fp8 layers with per-token (or static) activation scales go to
    ``torch._scaled_mm``; their codes come from one ``quant_rows`` kernel (the torch quantizer's
    codes exactly: the product is identical), here under the interpreter with the CPU's
    ``_scaled_mm``."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", ROWWISE], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


GROUPS = r"""
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from engine.runtime import quant_formats as qf
from engine.runtime import quant_triton as qt

gen = torch.Generator().manual_seed(0)
for fp8, per in ((torch.float8_e4m3fn, 32), (torch.float8_e5m2, 8),
                 (torch.float8_e4m3fn, 2)):
    qt.GROUPS_PER_PROGRAM = per  # (2: a row's groups over several programs, one ragged)
    for m, k in ((5, 512), (3, 384), (16, 128)):
        x = torch.randn(m, k, generator=gen) * 4
        x[:, ::7] *= 1e-6  # values that round to zero, of both signs
        x = x.to(torch.float16)
        codes, scales = qt.quant_groups(x, fp8, 128)
        want_codes, want_scales = qf.quantize_fp8_groups(x, fp8, 128)
        assert scales.shape == (m, k // 128) and scales.stride() == (1, m), scales.stride()
        assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8)), (fp8, m, k)
        assert torch.equal(scales, want_scales), (fp8, m, k)
print("ok")
"""


def test_group_quantizer_makes_the_torch_quantizers_codes_and_scales():
    """``quant_triton.quant_groups`` (the block-scaled fp8 product's activations: codes per row
    and 128 columns, scales column-major) equals ``quantize_fp8_groups`` bit for bit, -0 and
    a ragged count of groups included, with a row's groups in one program or spread over
    several (``GROUPS_PER_PROGRAM``), under the interpreter."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", GROUPS], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_block_scaled_product_is_probed_once_as_the_layers_call_it(monkeypatch):
    """Block fp8 past 16 rows takes ``torch._scaled_mm``'s block-scaled form only where a
    product laid out as the layers lay it out (activation scales [M, K/128] column-major, the
    weight's block scales transposed) runs on the device: SM90 or later and accepted."""
    from engine.runtime import quant_methods as qm

    probe = qm.block_scaled_mm_runs.__wrapped__  # (uncached)
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    assert not probe(cpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    calls = []

    def accepts(a, b, *, scale_a, scale_b, out_dtype):
        calls.append((tuple(a.shape), tuple(b.shape), b.stride(), tuple(scale_a.shape),
                      scale_a.stride(), tuple(scale_b.shape), a.dtype, out_dtype))
        return torch.zeros(a.shape[0], b.shape[1], dtype=out_dtype)

    monkeypatch.setattr(torch, "_scaled_mm", accepts)
    assert probe(cpu)
    assert calls == [((16, 256), (256, 128), (1, 256), (16, 2), (1, 16), (2, 1),
                      torch.float8_e4m3fn, torch.bfloat16)]

    def refuses(*args, **kwargs):
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")

    monkeypatch.setattr(torch, "_scaled_mm", refuses)
    assert not probe(cpu)


@pytest.mark.parametrize("rows,swapped", [(1, True), (16, True), (17, True), (40, True),
                                          (64, True), (65, False)])
def test_eight_bit_rows_up_to_64_take_the_swapped_kernel(monkeypatch, rows, swapped):
    """``w8_mm`` hands row-wise fp8, int8 and block fp8 products of up to ``SWAP_ROWS`` (64)
    rows to the swapped-operand kernel (rows padded to 16, 32, 64 or 128), more to its own."""
    from engine.runtime import quant_triton as qt
    from engine.runtime import swap_triton as st

    seen = []
    monkeypatch.setattr(st, "w8_swap", lambda x, w, ws, **kw: seen.append(
        (x.shape[0], kw["config"])) or torch.zeros(x.shape[0], w.shape[0]))
    x = torch.randn(rows, 256, dtype=torch.bfloat16)
    for w, ws, kw in ((torch.zeros(128, 256, dtype=torch.float8_e4m3fn), torch.ones(128),
                       dict(act="token")),
                      (torch.zeros(128, 256, dtype=torch.int8), torch.ones(128),
                       dict(act="token")),
                      (torch.zeros(128, 256, dtype=torch.float8_e4m3fn), torch.ones(1, 2),
                       dict(act="group", block=(128, 128)))):
        before = len(seen)
        try:
            qt.w8_mm(x, w, ws, **kw)
        except RuntimeError:  # its own kernels: no GPU (nor the interpreter) here
            pass
        assert len(seen) - before == int(swapped), (rows, kw)
        assert not swapped or (seen[-1][0] == rows and seen[-1][1] is not None)
    assert st.rows_block(rows) == (16 if rows <= 16 else 32 if rows <= 32
                                   else 64 if rows <= 64 else 128)
