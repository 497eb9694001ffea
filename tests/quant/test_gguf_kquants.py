"""The gguf plugin's K-quant kernels (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; kquants.c).

Dequantization equals the ``gguf`` package's bit for bit. Matmuls quantize each activation row
to 8 bits per 256 values (llama.cpp's Q8_K), so they are checked twice against float64: tightly
against the same activation rounding written out in numpy (the integer dot products and scales
are exact), and within 2% of the output norm against the plain product. Rows are
batch-invariant; fused layers whose shards differ in type run one call per shard; the AVX2 and
AVX-VNNI builds give the same products; and a tiny K-quant GGUF model served through the plugin
agrees with the same file loaded dequantized (``--quantization unquant``).

Blocks are random but valid: random bytes for the codes and sub-block scales, fp16 super-block
scales drawn in a small range (seeded generators, so every run sees the same data).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.config import ServerConfig
from engine.errors import PluginError
from engine.runtime.linear import Linear, PackedWeight

gguf = pytest.importorskip("gguf")
kernels = pytest.importorskip("engine_quant_gguf.kernels")
from engine_quant_gguf.impl import GGUFMethod, engine_create_quant_method  # noqa: E402
from test_gguf import fused_layer as gguf_fused_layer  # noqa: E402

TYPES = sorted(kernels.KQTYPES)
#: the row kernels, and the panel form's where this CPU has them (Q4_K, Q5_K, Q6_K)
PANELS = [False] + ([True] if kernels.panel_path() else [])
PANEL_TYPES = {"Q4_K", "Q5_K", "Q6_K"}
#: (type, panel form) pairs the kernels have
KERNELS = [(t, p) for t in TYPES for p in PANELS if t in PANEL_TYPES or not p]
#: byte offsets of the fp16 super-block scale (and minimum scale) in each type's block
FP16_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
               "Q6_K": (208,)}
#: largest |sub-block scale * code|, to draw d for a wanted weight magnitude
LEVELS = {"Q2_K": 45, "Q3_K": 128, "Q4_K": 945, "Q5_K": 1953, "Q6_K": 4096}
#: mean code, so dmin = d * mean centres the values (the scales and minimums share a range)
MEAN_CODE = {"Q2_K": 1.5, "Q4_K": 7.5, "Q5_K": 15.5}


def kquant_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator,
                  scale: float = 1.0) -> PackedWeight:
    """Random ``qtype`` rows of ``cols`` values whose largest magnitudes are about ``scale``."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    nb = cols // block
    raw = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)
    d = rng.uniform(0.5, 1.0, size=(rows, nb)) * scale / LEVELS[qtype]
    fields = FP16_FIELDS[qtype]
    raw[:, :, fields[0]:fields[0] + 2] = d.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    if len(fields) > 1:
        dmin = d * MEAN_CODE[qtype] * rng.uniform(0.8, 1.2, size=(rows, nb))
        raw[:, :, fields[1]:fields[1] + 2] = (dmin.astype(np.float16).view(np.uint8)
                                              .reshape(rows, nb, 2))
    return PackedWeight(torch.from_numpy(raw.reshape(rows, -1)), qtype, (rows, cols))


def q8k_values(x: torch.Tensor) -> torch.Tensor:
    """float64 values of ``x`` [m, k] after the kernels' activation quantization: per row and
    256 values, d = max|x| / 127 and q = round-half-even(x * (127 / max|x|)), in float32."""
    xb = x.numpy().astype(np.float32).reshape(x.shape[0], -1, 256)
    amax = np.abs(xb).max(-1, keepdims=True)
    nonzero = amax > 0
    d = amax / np.float32(127)
    inv = np.float32(127) / np.where(nonzero, amax, np.float32(1))
    q = np.where(nonzero, np.rint(xb * inv), 0)
    return torch.from_numpy((q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape))


def product(qid: int, w: PackedWeight, x: torch.Tensor, panels: bool,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T by the row kernel, or (``panels``) from w's panel form."""
    n, k = w.shape
    data = kernels.panelize(qid, w.data, n, k) if panels else w.data
    return kernels.matmul(qid, data, n, x, out=out, panels=panels)


def check_product(y: torch.Tensor, x: torch.Tensor, w: PackedWeight, what: object) -> None:
    """``y`` = the kernels' x @ w^T: float32 summation error away from the written-out 8-bit
    arithmetic; from the exact product, at most the activations' rounding (half a step per
    value) and, over outputs of 8 values or more, within 2% of the output norm."""
    dense = w.dequantize().double()
    xq = q8k_values(x)
    emulated = xq @ dense.T
    assert ((y.double() - emulated).abs() <= (xq.abs() @ dense.abs().T) * 2e-6 + 1e-30).all(), what
    plain = x.double() @ dense.T
    step = (x.double().reshape(x.shape[0], -1, 256).abs().amax(-1) / 127)  # per 256 values
    half_steps = step.repeat_interleave(256, dim=1) / 2
    assert ((y.double() - plain).abs() <= half_steps @ dense.abs().T * 1.001 + 1e-6).all(), what
    if y.numel() >= 8:
        assert (y.double() - plain).norm() <= 0.02 * plain.norm(), what


# ------------------------------------------------------------------ kernels


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows,cols", [(1, 256), (37, 512), (64, 1536)])
def test_dequantize_is_bit_identical_to_the_gguf_package(qtype, rows, cols):
    w = kquant_blocks(qtype, rows, cols, np.random.default_rng(rows + cols))
    got = kernels.dequantize(kernels.KQTYPES[qtype], w.data, rows, cols)
    assert got.shape == (rows, cols) and got.dtype == torch.float32
    assert torch.equal(got, w.dequantize())


@pytest.mark.parametrize("qtype,panels", KERNELS)
def test_matmul_against_float64(qtype, panels):
    """The row kernels, and the panel form's (16 rows a panel: 1, 8, 37 and 130 rows pad the
    last one) for the types that have one."""
    rng = np.random.default_rng(sum(map(ord, qtype)))
    torch.manual_seed(0)
    for n, k in ((1, 256), (8, 768), (37, 512), (130, 256)):
        w = kquant_blocks(qtype, n, k, rng)
        for m in (1, 3, 6, 7, 17):  # register blocks of 4 and 6 rows and their remainders
            x = torch.randn(m, k)
            y = product(kernels.KQTYPES[qtype], w, x, panels)
            assert y.shape == (m, n) and y.dtype == torch.float32
            check_product(y, x, w, (qtype, n, k, m))


@pytest.mark.skipif(not kernels.panel_path(), reason="the panel kernels need AVX512-VNNI")
@pytest.mark.parametrize("qtype", sorted(PANEL_TYPES))
def test_panel_form_holds_the_same_fields(qtype):
    """The panel form rearranges the codes, scales and minimums: back to the GGUF bytes bit for
    bit (the 6-bit scales packed again), and the gguf package's dequantization from it."""
    qid = kernels.KQTYPES[qtype]
    w = kquant_blocks(qtype, 37, 512, np.random.default_rng(12))
    panels = kernels.panelize(qid, w.data, 37, 512)
    assert panels.shape[0] == 3  # 16 rows a panel, the last padded
    assert torch.equal(kernels.unpanelize(qid, panels, 37, 512), w.data)
    assert torch.equal(kernels.dequantize(qid, panels, 37, 512, panels=True), w.dequantize())
    with pytest.raises(ValueError, match="not the panel form"):
        kernels.matmul(qid, panels[:2], 37, torch.zeros(1, 512), panels=True)


@pytest.mark.parametrize("panels", PANELS)
def test_matmul_zero_and_outlier_activations(panels):
    """An all-zero super-block of a row gives zeros; one large value sets that block's scale."""
    w = kquant_blocks("Q4_K", 16, 512, np.random.default_rng(1))
    x = torch.randn(2, 512)
    x[0, :256] = 0
    x[1, 300] = 1000.0
    y = product(kernels.KQTYPES["Q4_K"], w, x, panels)
    check_product(y, x, w, "zero / outlier")


@pytest.mark.parametrize("panels", PANELS)
def test_non_finite_activations_give_nan_rows(panels):
    """A NaN or an infinity makes its row's outputs NaN (as a dense product would make them
    non-finite); the other rows are unaffected."""
    w = kquant_blocks("Q6_K", 8, 512, np.random.default_rng(4))
    x = torch.randn(3, 512)
    clean = product(kernels.KQTYPES["Q6_K"], w, x, panels)
    x[0, 5], x[2, 400] = float("nan"), float("inf")
    y = product(kernels.KQTYPES["Q6_K"], w, x, panels)
    assert y[0].isnan().all() and y[2].isnan().all()
    assert torch.equal(y[1], clean[1])


@pytest.mark.parametrize("qtype,panels", KERNELS)
def test_rows_are_batch_invariant(qtype, panels):
    """A row's output is the same bits alone, in a batch of 5 or 17, on one thread or two."""
    w = kquant_blocks(qtype, 40, 768, np.random.default_rng(7))
    qid = kernels.KQTYPES[qtype]
    x = torch.randn(17, 768, generator=torch.Generator().manual_seed(3))
    five = product(qid, w, x[:5].contiguous(), panels)
    seventeen = product(qid, w, x, panels)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = product(qid, w, x, panels)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one_thread, seventeen)
    for i in range(17):
        alone = product(qid, w, x[i:i + 1].contiguous(), panels)
        assert torch.equal(alone[0], seventeen[i]), i
        if i < 5:
            assert torch.equal(alone[0], five[i]), i


@pytest.mark.parametrize("panels", PANELS)
def test_matmul_writes_into_a_column_slice(panels):
    w = kquant_blocks("Q6_K", 24, 512, np.random.default_rng(2))
    x = torch.randn(3, 512)
    want = product(kernels.KQTYPES["Q6_K"], w, x, panels)
    wide = torch.full((3, 40), 7.0)
    got = product(kernels.KQTYPES["Q6_K"], w, x, panels, out=wide[:, 10:34])
    assert torch.equal(got, want) and torch.equal(wide[:, 10:34], want)
    assert (wide[:, :10] == 7).all() and (wide[:, 34:] == 7).all()


def test_bad_arguments_are_refused():
    w = torch.zeros(4, 144, dtype=torch.uint8)
    with pytest.raises(ValueError, match="multiple of 256"):
        kernels.matmul(kernels.KQTYPES["Q4_K"], w, 4, torch.zeros(1, 300))
    with pytest.raises(ValueError, match="multiple of 256"):
        kernels.dequantize(kernels.KQTYPES["Q4_K"], w, 4, 128)
    with pytest.raises(ValueError, match="576 bytes of blocks for a \\[4, 512\\] weight"):
        kernels.matmul(kernels.KQTYPES["Q4_K"], w, 4, torch.zeros(1, 512))  # 2 blocks a row
    with pytest.raises(ValueError, match="contiguous float32"):
        kernels.matmul(kernels.KQTYPES["Q4_K"], w, 4, torch.zeros(2, 512)[:, ::2])
    lib = kernels.library()
    x, y = torch.zeros(1, 256), torch.zeros(1, 4)
    for qtype in (9, 15, 2):  # not a K-quant id
        assert lib.engine_gguf_kq_matmul(qtype, w.data_ptr(), 4, 256, x.data_ptr(), 1,
                                         y.data_ptr()) != 0
        assert lib.engine_gguf_kq_dequantize(qtype, w.data_ptr(), 4, 256, y.data_ptr()) != 0


@pytest.mark.parametrize("name,flags,path", [
    ("avx2", ("-mno-avx512vnni", "-mno-avxvnni"), 0),
    ("avxvnni", ("-mno-avx512vnni",), None),
])
def test_other_instruction_paths_agree(name, flags, path):
    """The kernels built without AVX512-VNNI (AVX-VNNI, if this CPU has it) and without any
    VNNI (AVX2 maddubs/madd) compute the same integer sums: the same products up to float
    rounding, checked like the default build's."""
    from engine.api.native import cpu_flags, load_library

    try:
        lib = kernels.declare_kquants(load_library(f"gguf-kq-{name}", kernels.SOURCES[1:],
                                                   ("-std=c11", *flags)))
    except PluginError as exc:  # a compiler that does not know the flag
        pytest.skip(f"cannot build the {name} variant: {exc}")
    if path is None:  # AVX-VNNI where this CPU has it, else AVX2
        path = 1 if "avx_vnni" in cpu_flags().split() else 0
    assert lib.engine_gguf_kq_path() == path
    rng = np.random.default_rng(11)
    for qtype in TYPES:
        qid = kernels.KQTYPES[qtype]
        w = kquant_blocks(qtype, 37, 768, rng)
        x = torch.randn(6, 768)
        y = torch.empty(6, 37)
        assert lib.engine_gguf_kq_matmul(qid, w.data.data_ptr(), 37, 768, x.data_ptr(), 6,
                                         y.data_ptr()) == 0
        check_product(y, x, w, (name, qtype))
        default = kernels.matmul(qid, w.data, 37, x)
        assert torch.allclose(y, default, rtol=1e-5, atol=1e-5 * default.abs().max().item())
        dq = torch.empty(37, 768)
        assert lib.engine_gguf_kq_dequantize(qid, w.data.data_ptr(), 37, 768,
                                             dq.data_ptr()) == 0
        assert torch.equal(dq, w.dequantize())


# ------------------------------------------------------------------ the layer method


def fused_layer(shards: list[PackedWeight], max_rows: int = 8, bias: bool = False,
                activations: str = "int8") -> Linear:
    return gguf_fused_layer(shards, max_rows, bias, activations)


@pytest.mark.parametrize("activations", ["int8", "float32"])
def test_fused_layer_of_mixed_q4_k_and_q6_k_shards(activations):
    """q/k in Q4_K and v in Q6_K (as Q4_K_M files store them): one kernel call per run of a
    type (q and k together, then v) into its columns, no dense copy kept. K-quants quantize
    activations to 8 bits under either --gguf-activations; with float32, batches above
    max_rows multiply a dequantized copy made for the call."""
    rng = np.random.default_rng(5)
    shards = [kquant_blocks("Q4_K", 64, 512, rng), kquant_blocks("Q4_K", 32, 512, rng),
              kquant_blocks("Q6_K", 32, 512, rng)]
    layer = fused_layer(shards, max_rows=8, bias=True, activations=activations)
    assert layer.gguf_blocks is None and layer.weight is None
    assert [(o, r, q) for o, r, q, _ in layer.gguf_parts] == [(0, 96, 12), (96, 32, 14)]
    dense = torch.cat([s.dequantize() for s in shards])
    assert torch.equal(layer.quant_method.dense_weight(layer), dense)
    x = torch.randn(5, 512)
    got = layer(x)
    want = F.linear(x.double(), dense.double(), layer.bias.double())
    assert (got.double() - want).norm() <= 0.02 * want.norm()
    panels = kernels.panel_path()
    assert layer.gguf_panels == panels
    parts = torch.cat([product(q, s, x, panels) for s, q in
                       zip(shards, (12, 12, 14))], dim=1) + layer.bias
    assert torch.equal(got, parts)  # (a row's panel arithmetic does not depend on its panel)
    for i in range(5):  # batch-invariant through the layer too
        assert torch.equal(layer(x[i:i + 1])[0], got[i])
    big = torch.randn(9, 512)  # above max_rows
    if activations == "float32":  # a dequantized copy for the call: exactly F.linear
        assert torch.equal(layer(big), F.linear(big, dense, layer.bias))
    else:  # int8: the kernels for every batch size
        want = torch.cat([product(q, s, big, panels) for s, q in
                          zip(shards, (12, 12, 14))], dim=1) + layer.bias
        assert torch.equal(layer(big), want)
    assert layer(torch.randn(2, 3, 512)).shape == (2, 3, 128)


def test_single_type_k_quant_layer_keeps_one_block_tensor():
    rng = np.random.default_rng(6)
    shards = [kquant_blocks("Q4_K", 48, 256, rng), kquant_blocks("Q4_K", 48, 256, rng)]
    layer = fused_layer(shards)
    panels = kernels.panel_path()
    shape = (6, 2368) if panels else (96, 144)  # 16 rows a panel, 2368 bytes a block
    assert layer.gguf_blocks is not None and layer.gguf_blocks.shape == shape
    assert layer.gguf_qtype == 12 and not layer.gguf_parts and layer.weight is None
    assert layer.gguf_panels == panels
    x = torch.randn(3, 256)
    want = kernels.matmul(12, layer.gguf_blocks, 96, x, panels=panels)
    assert torch.equal(layer(x), want) and torch.equal(layer(x[None]), want[None])
    rows = torch.cat([s.data for s in shards])
    assert torch.allclose(want, kernels.matmul(12, rows, 96, x), rtol=1e-5, atol=1e-4)


def test_hook_selects_the_plugin_for_a_k_quant_file():
    cfg = type("C", (), {"weights_format": "gguf"})()
    method = engine_create_quant_method(cfg, {"weight_types": ["F32", "Q4_K", "Q6_K"]},
                                        torch.device("cpu"),
                                        {"gguf_kernel_max_rows": 64, "gguf_activations": "int8"},
                                        ServerConfig())
    assert isinstance(method, GGUFMethod)


# ------------------------------------------------------------------ a tiny model end to end

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 512


@pytest.fixture(scope="module")
def tiny_kquant_gguf(tmp_path_factory) -> str:
    """A 2-layer llama GGUF in Q4_K_M's mix: Q4_K q/k/o/gate/up/embeddings, Q6_K v/down/output
    (plus one Q5_0 layer, a type still dequantized at load); float32 norms."""
    return write_tiny_kquant(str(tmp_path_factory.mktemp("kq") / "tiny-kq.gguf"), "Q5_0")


def llama_writer(path: str, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int,
                 vocab: int) -> "gguf.GGUFWriter":
    """A GGUF writer with a llama model's header fields set (tensors still to add)."""
    writer = gguf.GGUFWriter(path, "llama")
    for key, value in (("block_count", layers), ("embedding_length", hidden),
                       ("feed_forward_length", ffn), ("attention.head_count", heads),
                       ("attention.head_count_kv", kv_heads), ("context_length", 256),
                       ("vocab_size", vocab)):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    return writer


def finish(writer: "gguf.GGUFWriter") -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_tiny_kquant(path: str, second_o_proj: str) -> str:
    rng = np.random.default_rng(2024)
    writer = llama_writer(path, LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, VOCAB)
    writer.add_uint32("tokenizer.ggml.bos_token_id", 1)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 2)
    head_dim = HIDDEN // HEADS

    def quant(name: str, qtype: str, rows: int, cols: int, scale: float) -> None:
        if qtype == "Q5_0":
            blocks = rng.integers(0, 256, size=(rows, cols // 32, 22), dtype=np.uint8)
            d = np.full((rows, cols // 32), scale / 16, dtype=np.float16)
            blocks[:, :, 0:2] = d.view(np.uint8).reshape(rows, cols // 32, 2)
            data = blocks.reshape(rows, -1)
        else:
            data = kquant_blocks(qtype, rows, cols, rng, scale).data.numpy()
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[qtype])

    def norm(name: str, size: int) -> None:
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(size)).astype(np.float32))

    quant("token_embd.weight", "Q4_K", VOCAB, HIDDEN, 1.0)
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight", HIDDEN)
        quant(f"blk.{i}.attn_q.weight", "Q4_K", HIDDEN, HIDDEN, 0.2)
        quant(f"blk.{i}.attn_k.weight", "Q4_K", KV_HEADS * head_dim, HIDDEN, 0.2)
        quant(f"blk.{i}.attn_v.weight", "Q6_K", KV_HEADS * head_dim, HIDDEN, 0.2)
        quant(f"blk.{i}.attn_output.weight", second_o_proj if i == 1 else "Q4_K", HIDDEN, HIDDEN,
              0.2)
        norm(f"blk.{i}.ffn_norm.weight", HIDDEN)
        quant(f"blk.{i}.ffn_gate.weight", "Q4_K", FFN, HIDDEN, 0.2)
        quant(f"blk.{i}.ffn_up.weight", "Q4_K", FFN, HIDDEN, 0.2)
        quant(f"blk.{i}.ffn_down.weight", "Q6_K", HIDDEN, FFN, 0.15)
    norm("output_norm.weight", HIDDEN)
    quant("output.weight", "Q6_K", VOCAB, HIDDEN, 1.5)
    finish(writer)
    return path


def greedy(runner, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], list]:
    """Greedy tokens of each prompt, and the logits of every step."""
    from engine.testing.batches import BatchBuilder

    builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    rows = [builder.new_request() for _ in prompts]
    logits = [runner.forward(builder.extend(list(zip(rows, prompts))))]
    tokens = [[int(t)] for t in logits[-1].argmax(-1)]
    for _ in range(steps - 1):
        logits.append(runner.forward(builder.decode([(r, t[-1]) for r, t in zip(rows, tokens)])))
        for t, nxt in zip(tokens, logits[-1].argmax(-1).tolist()):
            t.append(nxt)
    return tokens, logits


def test_tiny_k_quant_model_matches_its_dequantized_self(tiny_kquant_gguf, caplog):
    """Served packed (selected by default for the .gguf), the model's greedy tokens equal the
    dequantized model's for 6 steps, and at every step the logits differ by at most 5% of their
    largest magnitude and by 4% in root mean square (measured: 2.3% and 2.0%; the 8-bit
    activations' rounding, largest at the down projections, whose inputs are heavy-tailed)."""
    from engine.runtime.model_runner import ModelRunner

    prompts = [[1, 17, 300, 42, 9, 77, 5], [1] + list(range(100, 111))]
    results = {}
    for quant in (None, "unquant"):
        with caplog.at_level(logging.INFO, logger="engine.quant.gguf"):
            runner = ModelRunner(ServerConfig(
                model_path=tiny_kquant_gguf, skip_tokenizer_init=True, device="cpu",
                max_total_tokens=512, attention_backend="torch_native",
                max_running_requests=4, quantization=quant))
        if quant is None:
            assert isinstance(runner.model.quant_method, GGUFMethod)
            layer = runner.model.model.layers[0]
            qkv, gate_up = layer.self_attn.qkv_proj, layer.mlp.gate_up_proj
            assert [q for _, _, q, _ in qkv.gguf_parts] == [12, 14]  # q+k, then v
            assert gate_up.gguf_qtype == 12 and layer.mlp.down_proj.gguf_qtype == 14
            assert runner.model.lm_head.gguf_qtype == 14
            o_proj = runner.model.model.layers[1].self_attn.o_proj
            assert o_proj.gguf_blocks is None and not o_proj.gguf_parts  # Q5_0: dense
            assert "Q5_0 weights are not served packed" in caplog.text
        results[quant] = greedy(runner, prompts, 6)
    (tokens, logits), (want_tokens, want_logits) = results[None], results["unquant"]
    assert tokens == want_tokens
    for got, want in zip(logits, want_logits):
        assert (got - want).abs().max() <= 0.05 * want.abs().max()
        assert (got - want).pow(2).mean().sqrt() <= 0.04 * want.pow(2).mean().sqrt()


def test_decode_plan_runs_mixed_type_layers_bit_identically(tmp_path):
    """Every layer packed (Q4_K with Q6_K v inside the fused qkv): the CPU decode plan serves
    decode steps, each fused layer of mixed types as one parts kernel, and its logits equal the
    per-operation path's bit for bit."""
    from engine.runtime import fused_cpu
    from engine.runtime.model_runner import ModelRunner

    if not fused_cpu.available():
        pytest.skip("needs the CPU fused kernels")
    path = write_tiny_kquant(str(tmp_path / "all-packed.gguf"), "Q4_K")
    runner = ModelRunner(ServerConfig(model_path=path, skip_tokenizer_init=True, device="cpu",
                                      max_total_tokens=512, attention_backend="torch_native",
                                      max_running_requests=4))
    model = runner.model
    prompts = [[1, 17, 300, 42, 9, 77, 5], [1] + list(range(100, 111))]
    _, with_plan = greedy(runner, prompts, 5)
    assert any(model._plans.values())
    model._decode_plan = lambda *a: None
    _, without = greedy(runner, prompts, 5)
    assert all(torch.equal(a, b) for a, b in zip(with_plan, without))


def test_f16_gguf_keeps_16_bit_weights_and_runs_the_decode_plan(tmp_path, monkeypatch):
    """An F16 GGUF on the CPU: its dense layers and embedding table stay in half
    (``cpu_half_weight``), decode runs through the decode plan, and every logit equals the
    model's with the weights widened to float32 at load (``ENGINE_CPU_HALF_WEIGHTS=0``) and with
    the per-operation path."""
    from engine.runtime import fused_cpu
    from engine.runtime.model_runner import ModelRunner

    if not fused_cpu.available():
        pytest.skip("needs the CPU fused kernels")
    hidden, ffn, heads, kv_heads, vocab = 512, 1024, 4, 2, 512
    rng = np.random.default_rng(7)
    path = str(tmp_path / "tiny-f16.gguf")
    writer = llama_writer(path, 2, hidden, ffn, heads, kv_heads, vocab)

    def f16(name: str, rows: int, cols: int) -> None:
        writer.add_tensor(name, (rng.standard_normal((rows, cols)) / cols ** 0.5)
                          .astype(np.float16))

    kv = kv_heads * hidden // heads
    f16("token_embd.weight", vocab, hidden)
    for i in range(2):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        for name, rows, cols in (("attn_q", hidden, hidden), ("attn_k", kv, hidden),
                                 ("attn_v", kv, hidden), ("attn_output", hidden, hidden),
                                 ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden),
                                 ("ffn_down", hidden, ffn)):
            f16(f"blk.{i}.{name}.weight", rows, cols)
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    finish(writer)

    prompts = [[1, 17, 300, 42, 9, 77, 5], [1] + list(range(100, 111))]
    results = {}
    for keep in ("1", "0"):
        monkeypatch.setenv("ENGINE_CPU_HALF_WEIGHTS", keep)
        runner = ModelRunner(ServerConfig(model_path=path, skip_tokenizer_init=True,
                                          device="cpu", max_total_tokens=512,
                                          attention_backend="torch_native",
                                          max_running_requests=4))
        model = runner.model
        types = {p.dtype for p in model.parameters() if p.dim() == 2}
        assert types == ({torch.float16} if keep == "1" else {torch.float32})
        _, results[keep] = greedy(runner, prompts, 5)
        assert any(model._plans.values())  # the dense layers have native kernels
        model._decode_plan = lambda *a: None
        _, without = greedy(runner, prompts, 5)
        assert all(torch.equal(a, b) for a, b in zip(results[keep], without))
    assert all(torch.equal(a, b) for a, b in zip(results["1"], results["0"]))
