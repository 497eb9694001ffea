"""A float32 CPU model keeps weights whose values are all bfloat16 (or half) values in that
16-bit type (``linear.cpu_half_weight``): the weight-streaming product widens them exactly as it
reads, more rows widen the weight for ``F.linear``, so every logit is the float32 model's bit for
bit, in half the bytes."""

from __future__ import annotations

import json

import pytest
import torch

from engine.config import ServerConfig
from engine.runtime import fused_cpu
from engine.runtime.linear import cpu_half_weight
from engine.runtime.model_runner import ModelRunner
from engine.testing import quant as tq
from engine.testing.batches import BatchBuilder

pytestmark = pytest.mark.skipif(not fused_cpu.available(), reason="needs the CPU kernels")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(256, 576), (131, 1000), (4096, 37), (520, 4100)])
def test_gemv_of_16_bit_weights_is_the_float32_copys_bit_for_bit(dtype, n, k):
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen)
    for rows in (1, 2, 3, 4, 5, 7, fused_cpu.GEMV_ROWS):
        x = torch.randn(rows, k, generator=gen)
        got = fused_cpu.gemv(x, w, bias)
        assert got.dtype == torch.float32
        assert torch.equal(got, fused_cpu.gemv(x, w.float().contiguous(), bias))
        want = x.double() @ w.double().t() + bias.double()
        assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_expert_kernels_read_16_bit_experts_as_their_float32_copies(dtype):
    gen = torch.Generator().manual_seed(2)
    e, hidden, inter, k = 6, 72, 40, 2
    w13 = torch.randn(e, 2 * inter, hidden, generator=gen).to(dtype)
    w2 = torch.randn(e, hidden, inter, generator=gen).to(dtype)
    w13f, w2f = w13.float().contiguous(), w2.float().contiguous()
    for t in (1, 3, 9):
        x = torch.randn(t, hidden, generator=gen)
        ids = torch.randint(0, e, (t, k), generator=gen)
        ids[0, 1] = -1  # another rank's expert
        tw = torch.rand(t, k, generator=gen)
        got = fused_cpu.moe_routed(x, ids, tw, w13, w2)
        assert torch.equal(got, fused_cpu.moe_routed(x, ids, tw, w13f, w2f))
        counts = torch.tensor([t, 0, 2, 0, 0, 1])
        rows = torch.randn(int(counts.sum()), hidden, generator=gen)
        assert torch.equal(fused_cpu.moe_experts(rows, counts, w13, w2),
                           fused_cpu.moe_experts(rows, counts, w13f, w2f))


def test_which_weights_are_kept_in_16_bits(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(512, 576, generator=gen)
    assert cpu_half_weight(w) is None  # float32 values
    kept = cpu_half_weight(w.bfloat16().float())
    assert kept.dtype == torch.bfloat16 and torch.equal(kept.float(), w.bfloat16().float())
    half = w.half().float()
    half[5, 7] = 1 + 2.0 ** -10  # a half value that bfloat16 cannot hold
    assert cpu_half_weight(half).dtype == torch.float16
    assert cpu_half_weight(w[:8].bfloat16().float()) is None  # too small to stream
    half[300, 2] = 1e-30  # below half's range: no 16-bit type holds every value
    half[4, 4] = 1 + 2.0 ** -10
    assert cpu_half_weight(half) is None
    monkeypatch.setenv("ENGINE_CPU_HALF_WEIGHTS", "0")
    assert cpu_half_weight(w.bfloat16().float()) is None


def _checkpoint(root, dtype: torch.dtype) -> str:
    from safetensors.torch import load_file, save_file

    path = str(root / str(dtype).split(".")[-1])
    tq.tiny_llama(path, vocab=4096)
    state = load_file(f"{path}/model.safetensors")
    save_file({k: v.to(dtype) for k, v in state.items()}, f"{path}/model.safetensors")
    with open(f"{path}/config.json") as f:
        cfg = json.load(f)
    cfg["torch_dtype"] = str(dtype).split(".")[-1]
    with open(f"{path}/config.json", "w") as f:
        json.dump(cfg, f)
    return path


def _logits(path: str, prompts: list[list[int]], steps: int) -> tuple[torch.Tensor, set, bool]:
    runner = ModelRunner(ServerConfig(model_path=path, device="cpu", dtype="float32",
                                      skip_tokenizer_init=True, attention_backend="torch_native",
                                      max_total_tokens=2048, max_running_requests=32,
                                      page_size=4))
    model = runner.model
    types = {p.dtype for p in model.parameters() if p.dim() == 2}
    used, real = [], type(model)._decode_plan

    def spy(batch, attn, h):
        got = real(model, batch, attn, h)
        if batch.is_decode:
            used.append(got is not None)
        return got

    model._decode_plan = spy
    b = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size, shuffle=True)
    rows = [b.new_request() for _ in prompts]
    logits = runner.forward(b.extend(list(zip(rows, prompts))))
    out, toks = [logits], logits.argmax(-1).tolist()
    for _ in range(steps):
        logits = runner.forward(b.decode(list(zip(rows, toks))))
        toks = logits.argmax(-1).tolist()
        out.append(logits)
    return torch.cat(out), types, bool(used) and all(used)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_checkpoint_in_float32_keeps_its_bytes_and_the_float32_logits(
        tmp_path, monkeypatch, dtype):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    path = _checkpoint(tmp_path, dtype)
    gen = torch.Generator().manual_seed(1)
    for batch in (1, 5, 20):  # decode through the plan, and past its rows
        prompts = [torch.randint(0, 4096, (int(n),), generator=gen).tolist()
                   for n in torch.randint(2, 30, (batch,), generator=gen)]
        monkeypatch.setenv("ENGINE_CPU_HALF_WEIGHTS", "1")
        kept, types, plan = _logits(path, prompts, 3)
        assert types == {dtype}  # every projection and the (tied) embedding
        assert plan == (batch <= fused_cpu.GEMV_ROWS)
        monkeypatch.setenv("ENGINE_CPU_HALF_WEIGHTS", "0")
        widened, types, _ = _logits(path, prompts, 3)
        assert types == {torch.float32}
        assert torch.equal(kept, widened)
