"""What start-up builds faster or smaller must give the same results: the GGUF reader (vs
``gguf.GGUFReader``), the packed token embedding (vs the dense table), the cached tokenizer (vs
the one built from the GGUF metadata), the CPU KV pool (zeroed, sized by the rule in
``ModelRunner._kv_tokens``)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.models.config import default_model_path
from engine.models.parsing import GGUFFile, read_gguf
from engine.runtime.attention import KVPool
from engine.runtime.linear import Embedding, PackedWeight, dequantize_rows
from engine.runtime.model_runner import CPU_DEFAULT_CONTEXT, ModelRunner

from _default_model import default_runner, greedy


def test_gguf_file_reads_what_gguf_reader_reads():
    import gguf

    path = default_model_path()
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    for key, field in theirs.fields.items():
        if not key.startswith("GGUF."):
            assert ours.fields[key].contents() == pytest.approx(field.contents()), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape.tolist() == b.shape.tolist()
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        assert np.array_equal(a.data, b.data), a.name
    assert ours.data_offset == theirs.data_offset
    assert ours.tensors[0].data.flags.writeable  # copy-on-write: torch takes it as it is


def test_gguf_file_rejects_what_is_not_gguf(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError):
        GGUFFile(str(bad))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_rows_dequantize_like_the_whole_table(qtype):
    import gguf

    rows, cols = 7, 96
    qt = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[qt]
    gen = np.random.default_rng(0)
    data = gen.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
    data.reshape(rows, -1, size)[..., :2] = np.array([0.01], np.float16).view(np.uint8)  # finite
    if qtype == "Q4_1":
        data.reshape(rows, -1, size)[..., 2:4] = np.array([-0.5], np.float16).view(np.uint8)
    packed = PackedWeight(torch.from_numpy(data), qtype, (rows, cols))
    dense = packed.dequantize()
    ids = torch.tensor([3, 0, 6, 3])
    assert torch.equal(packed.rows(ids), dense[ids])
    assert torch.equal(dequantize_rows(qtype, packed.data, cols), dense)


def test_packed_embedding_gives_the_dense_hidden_states_bit_for_bit():
    runner = default_runner()
    packed = runner.model.model.embed_tokens
    assert packed.packed is not None and packed.packed.qtype == "Q8_0"
    assert packed.weight.numel() == 0  # no dense table
    dense = Embedding(packed.num_embeddings, packed.embedding_dim, runner.dtype)
    dense.keep_packed = False
    dense.weight.weight_loader(dense.weight, packed.packed, 0, None)
    ids = torch.tensor([[1, 49151], [0, 700]])
    assert torch.equal(packed(ids), dense(ids))
    prompts = [runner.tokenizer.encode("The capital of France is"), [1, 2, 3, 49151]]
    out_packed, logits_packed = greedy(runner, prompts, 3)
    runner.model.model.embed_tokens = dense
    try:
        out_dense, logits_dense = greedy(runner, prompts, 3)
    finally:
        runner.model.model.embed_tokens = packed
    assert out_packed == out_dense
    assert torch.equal(logits_packed, logits_dense)


def test_embedding_stays_dense_for_a_tied_head_without_a_method():
    from engine.models.llama import LlamaForCausalLM

    cfg = read_gguf(default_model_path())
    assert cfg.tie_word_embeddings
    model = LlamaForCausalLM(cfg)  # no quantization method: the head reads the dense table
    assert not model.model.embed_tokens.keep_packed
    blocks = torch.zeros((cfg.vocab_size, cfg.hidden_size // 32 * 34), dtype=torch.uint8)
    emb = model.model.embed_tokens
    emb.weight.weight_loader(emb.weight, PackedWeight(blocks, "Q8_0",
                                                      (cfg.vocab_size, cfg.hidden_size)), 0, None)
    assert emb.packed is None and emb.weight.shape == (cfg.vocab_size, cfg.hidden_size)
    with pytest.raises(ConfigError):
        emb.weight.weight_loader(emb.weight, torch.zeros(3, 3), 0, None)


def test_cached_tokenizer_encodes_like_the_one_built_from_gguf(tmp_path, monkeypatch):
    from engine.models.tokenizer import Tokenizer, tokenizer_cache

    monkeypatch.setenv("ENGINE_CACHE_DIR", str(tmp_path))
    cfg = read_gguf(default_model_path())
    folder = tokenizer_cache(default_model_path())
    assert folder is not None and folder.startswith(str(tmp_path))
    built = Tokenizer.load(cfg)
    assert os.path.isfile(os.path.join(folder, "tokenizer.json"))
    cached = Tokenizer.load(cfg)
    assert cached.hf is not built.hf
    texts = ["Hello world!", "  leading spaces\tand tabs\n", "héllo wörld 🙂 123456",
             "<|im_start|>user\nhi<|im_end|>", ""]
    for text in texts:
        for special in (True, False):
            assert cached.encode(text, special) == built.encode(text, special)
    ids = built.encode(texts[2] + texts[3])
    assert cached.decode(ids) == built.decode(ids)
    assert cached.vocab_size == built.vocab_size and cached.eos_token_ids == built.eos_token_ids
    messages = [{"role": "user", "content": "Hi"}]
    assert cached.apply_chat_template(messages) == built.apply_chat_template(messages)
    # a damaged entry is rebuilt
    with open(os.path.join(folder, "tokenizer.json"), "w") as fh:
        fh.write("{")
    again = Tokenizer.load(cfg)
    assert again.encode(texts[0]) == built.encode(texts[0])
    assert Tokenizer.load(cfg).encode(texts[2]) == built.encode(texts[2])


def _sizing(context: int | None, model_context: int = 8192, **flags) -> int:
    runner = ModelRunner.__new__(ModelRunner)
    runner.config = ServerConfig(context_length=context, **flags)
    runner.device, runner.dtype, runner.page_size = torch.device("cpu"), torch.float32, 1
    runner.model_config = SimpleNamespace(num_hidden_layers=30, num_key_value_heads=3,
                                          head_dim=64)
    runner.max_context_len = context or model_context
    return runner._kv_tokens()


def test_cpu_kv_pool_holds_one_full_context_by_default():
    assert _sizing(None) == 8192
    assert _sizing(2048) == 2048  # --context-length, like llama.cpp's n_ctx
    assert _sizing(None, model_context=131072) == CPU_DEFAULT_CONTEXT
    assert _sizing(65536, model_context=131072) == 65536  # asked for: given
    assert _sizing(2048, max_running_requests=64) == 2048  # not a multiplier
    assert _sizing(2048, max_total_tokens=5000) == 5000
    per_token = 2 * 30 * 3 * 64 * 4
    assert _sizing(2048, mem_fraction_static=0.5) == (2**30 // per_token)


def test_cpu_kv_pool_is_zeroed_and_writable():
    pool = KVPool(num_layers=2, num_kv_heads=3, head_dim=8, num_slots=16, page_size=1,
                  dtype=torch.float32, device=torch.device("cpu"))
    assert all(torch.count_nonzero(t) == 0 for t in pool.k + pool.v)
    loc = torch.tensor([3, 5])
    pool.write(1, loc, torch.ones(2, 3, 8), torch.full((2, 3, 8), 2.0))
    k, v = pool.gather(1, loc, torch.float32)
    assert torch.equal(k, torch.ones(2, 3, 8)) and torch.equal(v, torch.full((2, 3, 8), 2.0))
    assert torch.count_nonzero(pool.k[0]) == 0 and torch.count_nonzero(pool.v[1]) == 2 * 3 * 8


def test_a_cpu_start_loads_neither_triton_nor_transformers_and_keeps_copied_pages_out(tmp_path):
    """The default model's start on CPU (tokenizer cache warm): Triton and transformers are
    never imported, the grammar backend is not built until a constrained request needs it,
    the KV cache is float16 (int8 activations), and file pages read into fused copies are not
    resident (release_pages)."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from engine.config import ServerConfig\n"
        "from engine.runtime.frontend import Runtime\n"
        "rt = Runtime(ServerConfig(device='cpu'))\n"
        "path = rt.model_config.model_path\n"
        "rss, cur = 0, None\n"
        "for line in open('/proc/self/smaps'):\n"
        "    first = line.split()\n"
        "    if '-' in first[0] and len(first[0]) > 8 and ':' not in first[0]:\n"
        "        cur = first[5] if len(first) > 5 else ''\n"
        "    elif first[0] == 'Rss:' and cur and cur.endswith('.gguf'):\n"
        "        rss += int(first[1]) * 1024\n"
        "import os\n"
        "gguf = [f for f in [path] if f.endswith('.gguf')] or [os.path.join(path, "
        "rt.model_config.gguf_file)]\n"
        "print(json.dumps({'triton': 'triton' in sys.modules,\n"
        "                  'transformers': 'transformers' in sys.modules,\n"
        "                  'grammar_built': rt.grammars is not None and "
        "rt.grammars._backend is not None,\n"
        "                  'kv': str(rt.runner.pool.dtype), 'rss': rss,\n"
        "                  'size': os.path.getsize(gguf[0])}))\n"
        "rt.shutdown()\n")
    env = {**os.environ, "ENGINE_CACHE_DIR": str(tmp_path)}
    for _ in range(2):  # the first start builds the tokenizer cache (with transformers)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=True, timeout=600)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert not got["triton"] and not got["transformers"] and not got["grammar_built"]
    assert got["kv"] == "torch.float16"
    assert got["rss"] < 0.5 * got["size"], got
