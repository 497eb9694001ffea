"""``--kv-cache-dtype fp4_mx_block16``: E2M1 codes with a power-of-two scale per 16 values,
packed two a byte, checked against the format's definition written out element by element;
the pool stores it, torch_native reads it, the other backends are refused, and the host tier
moves its packed rows."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from engine.errors import ConfigError
from engine.runtime import kv_fp4
from engine.runtime.attention import KVPool
from engine.testing import quant as tq

MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def reference(row: list[float]) -> tuple[list[int], list[int]]:
    """(codes, scale bytes) of one row, from the format's definition, one value at a time."""
    codes, scales = [], []
    for b in range(0, len(row), 16):
        block = row[b:b + 16]
        e = math.ceil(math.log2(max(max(abs(x) for x in block) / 6.0, 1e-10)))
        scales.append(e + 127)
        for x in block:
            y = x / 2.0 ** e
            # the largest magnitude whose rounding bound |y| reaches (a bound rounds up)
            mag = sum(abs(y) >= bound for bound in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0))
            codes.append(mag | (8 if y < 0 else 0))
    return codes, scales


def test_codes_scales_and_packing_follow_the_format():
    block = [6, -6, 0.25, 0.24, -0.75, 0.74, 1.25, 1.75, 2.5, 3.5, 5, 4.99, 0, -0.0, 3, 1]
    want = [7, 15, 1, 0, 10, 1, 3, 4, 5, 6, 7, 6, 0, 0, 5, 2]
    # the same block times 8 (scale 2^3), a block of amax 7 (scale 2^1), a zero block
    x = torch.tensor([block, [8 * v for v in block], [7.0] + [0.0] * 15, [0.0] * 16])
    packed = kv_fp4.pack(x.reshape(1, 64))[0]
    assert packed.dtype == torch.uint8 and packed.shape == (32 + 4,)
    assert packed[:8].tolist() == [want[2 * i] | want[2 * i + 1] << 4 for i in range(8)]
    assert packed[8:16].tolist() == packed[:8].tolist()
    assert packed[32:].tolist() == [127, 130, 128, 127 - 33]
    back = kv_fp4.unpack(packed[None], 64, torch.float32)[0]
    assert back[:16].tolist() == [math.copysign(MAGNITUDES[c & 7], -1 if c & 8 else 1)
                                  for c in want]
    assert torch.equal(back[16:32], 8 * back[:16])
    assert back[32].item() == 8.0 and not back[33:].any()  # 7 / 2 -> 3.5 -> 4, times 2


def test_random_rows_match_the_definition_exactly():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, 64, generator=gen) * torch.logspace(-6, 6, 6)[:, None, None]
    x[0, 0, :16] = 0.0
    packed = kv_fp4.pack(x)
    assert packed.shape == (6, 3, kv_fp4.row_bytes(64))
    for row, got in zip(x.reshape(-1, 64).tolist(), packed.reshape(-1, 36).tolist()):
        codes, scales = reference(row)
        assert got[:32] == [codes[2 * i] | codes[2 * i + 1] << 4 for i in range(32)]
        assert got[32:] == scales
    back = kv_fp4.unpack(packed, 64, torch.float32)
    for row, got, scale_bytes in zip(x.reshape(-1, 64).tolist(), back.reshape(-1, 64).tolist(),
                                     packed.reshape(-1, 36)[:, 32:].tolist()):
        codes, _ = reference(row)
        want = [math.copysign(MAGNITUDES[c & 7], -1.0 if c & 8 else 1.0)
                * 2.0 ** (scale_bytes[i // 16] - 127) for i, c in enumerate(codes)]
        assert got == want
    # bfloat16 input: quantized from its float32 values, read back as bfloat16
    assert torch.equal(kv_fp4.pack(x.to(torch.bfloat16)), kv_fp4.pack(x.to(torch.bfloat16)
                                                                      .float()))
    assert kv_fp4.unpack(packed, 64, torch.bfloat16).dtype == torch.bfloat16


def test_packing_builds_no_tensor_from_host_data(monkeypatch):
    """A CUDA graph capture (a decode step writing K/V) allows no copy from the host: pack and
    unpack compute codes and values from the bits alone, never a table made with torch.tensor."""
    x = torch.randn(4, 2, 32)
    want = kv_fp4.unpack(kv_fp4.pack(x), 32, torch.float32)

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor made from host data")

    monkeypatch.setattr(torch, "tensor", refuse)
    monkeypatch.setattr(torch, "as_tensor", refuse)
    assert torch.equal(kv_fp4.unpack(kv_fp4.pack(x), 32, torch.float32), want)


def test_the_pool_stores_packed_rows_and_gathers_them_back():
    pool = KVPool(num_layers=1, num_kv_heads=2, head_dim=32, num_slots=8, page_size=1,
                  dtype=torch.bfloat16, device=torch.device("cpu"), fp4=True)
    assert pool.k[0].shape == (8, 2, 18) and pool.k[0].dtype == torch.uint8
    assert pool.bytes_per_token == 2 * 2 * 18 and pool.format_name == "fp4_mx_block16"
    assert not pool.takes_direct_writes(torch.uint8, torch.device("cpu"))
    k, v = torch.randn(3, 2, 32), torch.randn(3, 2, 32)
    pool.write(0, torch.tensor([5, 1, 3]), k, v)
    gk, gv = pool.gather(0, torch.tensor([[1, 5]]), torch.float32)
    assert gk.shape == (1, 2, 2, 32)
    assert torch.equal(gk[0, 1], kv_fp4.unpack(kv_fp4.pack(k[0]), 32, torch.float32))
    assert torch.equal(gv[0, 0], kv_fp4.unpack(kv_fp4.pack(v[1]), 32, torch.float32))
    with pytest.raises(ValueError, match="multiple of 16"):
        KVPool(num_layers=1, num_kv_heads=1, head_dim=24, num_slots=4, page_size=1,
               dtype=torch.float32, device=torch.device("cpu"), fp4=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("m"))
    tq.tiny_llama(path)
    return path


def test_the_model_serves_from_an_fp4_cache_close_to_float32(model):
    from test_kv_cache_dtype import run

    base, dense = run(model, "auto")
    got, runner = run(model, "fp4_mx_block16")
    pool = runner.pool
    assert pool.is_fp4 and pool.k[0].dtype == torch.uint8 and pool.k[0].shape[-1] == 36
    # layer 0's keys depend on the embeddings alone: what the fp4 pool holds is exactly the
    # float32 run's keys, packed
    slots = torch.arange(1, 14)
    assert torch.equal(pool.k[0][slots], kv_fp4.pack(dense.pool.k[0][slots]))
    assert torch.equal(pool.v[0][slots], kv_fp4.pack(dense.pool.v[0][slots]))
    p, q = F.log_softmax(base, -1), F.log_softmax(got, -1)
    assert (p.exp() * (p - q)).sum(-1).mean() < 0.05
    assert (got.argmax(-1) == base.argmax(-1)).float().mean() >= 0.75


def test_cpu_decode_unpacks_it_in_the_c_kernel_as_the_gather_does(model, monkeypatch):
    """On the CPU the decode steps read the fp4 rows in the core's pool kernel (prefills keep
    the gathered SDPA): the same logits as the gathered path, to float32 rounding."""
    import engine_attention_torch_native.impl as tn

    from engine.runtime import fused_cpu
    from test_kv_cache_dtype import run

    calls = []
    real = fused_cpu.decode_attention_fp4
    monkeypatch.setattr(fused_cpu, "decode_attention_fp4",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    got, _ = run(model, "fp4_mx_block16")
    assert calls
    monkeypatch.setattr(tn, "pool_attention_applies", lambda pool: False)
    want, _ = run(model, "fp4_mx_block16")
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


def test_flex_attention_reads_it_as_torch_native_does(model):
    from test_kv_cache_dtype import run

    want, _ = run(model, "fp4_mx_block16")
    got, runner = run(model, "fp4_mx_block16", backend="flex_attention")
    assert type(runner.decode_backend).__name__ == "FlexAttentionBackend"
    assert (got - want).abs().max() < 1e-3


TRITON_FP4 = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from engine.config import ServerConfig
from engine.runtime.model_runner import ModelRunner
from engine.testing.batches import BatchBuilder
from engine_attention_triton.impl import TritonBackend

def logits(page, triton):
    runner = ModelRunner(ServerConfig(model_path=sys.argv[1], device="cpu", dtype="float32",
                                      skip_tokenizer_init=True, max_total_tokens=512,
                                      page_size=page, attention_backend="torch_native",
                                      kv_cache_dtype="fp4_mx_block16"))
    if triton:
        cfg = runner.model_config
        backend = TritonBackend(runner.pool, cfg.num_attention_heads // cfg.num_key_value_heads)
        assert backend.supports_fp4_kv_cache
        runner.prefill_backend = runner.decode_backend = backend
    b = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    rows = [b.new_request(), b.new_request()]
    gen = torch.Generator().manual_seed(page)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (150, 40)]
    out = [runner.forward(b.extend(list(zip(rows, prompts)), all_logits=True))]
    out.append(runner.forward(b.decode([(rows[0], 7), (rows[1], 9)])))
    out.append(runner.forward(b.extend([(rows[1], [3] * 140)], all_logits=True)))  # a prefix
    return torch.cat(out)

for page in (1, 16, 128):  # slot by slot, tiles of several pages, a tile inside one page
    err = (logits(page, True) - logits(page, False)).abs().max().item()
    assert err < 1e-3, (page, err)
print("ok")
"""


def test_triton_unpacks_it_as_torch_native_does(model):
    """The triton kernels unpack the fp4 rows in registers (decode, extend over whole and
    partial key tiles, a cached prefix; under the interpreter here): their logits equal
    torch_native's, which unpacks through ``KVPool.gather``."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", TRITON_FP4, model], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.gpu
def test_triton_unpacks_it_on_the_gpu(model):
    """On a GPU the triton backend is offered with an fp4 cache, and its logits equal
    torch_native's over the same stored rows."""
    from test_kv_cache_dtype import run

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    got, runner = run(model, "fp4_mx_block16", backend="triton", device="cuda")
    want, _ = run(model, "fp4_mx_block16", device="cuda")
    assert type(runner.decode_backend).__name__ == "TritonBackend" and runner.pool.is_fp4
    assert (got - want).abs().max().item() < 1e-3


def test_backends_that_do_not_read_it_are_refused(model, monkeypatch):
    from engine_attention_torch_native.impl import TorchNativeBackend
    from test_kv_cache_dtype import run

    monkeypatch.setattr(TorchNativeBackend, "supports_fp4_kv_cache", False)
    with pytest.raises(ConfigError, match="fp4_mx_block16: the prefill attention backend "
                                          r"\(TorchNativeBackend\) does not read it"):
        run(model, "fp4_mx_block16")


def test_a_head_dimension_off_the_blocks_is_refused(tmp_path):
    from test_kv_cache_dtype import run

    tq.tiny_llama(str(tmp_path), hidden=72, heads=3, kv_heads=1, intermediate=64)  # D = 24
    with pytest.raises(ConfigError, match="multiple of 16; this model's is 24"):
        run(str(tmp_path), "fp4_mx_block16")


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_the_host_tier_moves_packed_rows(layout):
    from engine.runtime.host_pool import HostKVPool, Transfer

    dev = KVPool(num_layers=2, num_kv_heads=2, head_dim=32, num_slots=16, page_size=4,
                 dtype=torch.float32, device=torch.device("cpu"), fp4=True)
    for layer in range(2):
        dev.write(layer, torch.arange(16), torch.randn(16, 2, 32), torch.randn(16, 2, 32))
    host = HostKVPool(dev, 8, layout=layout)
    assert host.payload_bytes == 2 * 2 * 4 * 2 * 18  # 16 + 2 bytes a row
    t = Transfer(dev, host, "direct")
    dst = host.alloc(4)
    t.to_host(torch.arange(4, 8), dst)
    t.to_device(dst, torch.arange(12, 16))
    dev.settle_loads()
    for layer in range(2):
        assert torch.equal(dev.k[layer][12:16], dev.k[layer][4:8])
        assert torch.equal(dev.v[layer][12:16], dev.v[layer][4:8])
