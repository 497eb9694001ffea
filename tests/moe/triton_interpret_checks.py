"""Run under TRITON_INTERPRET=1: the fused-MoE kit's small cases (float32) and a tiny
Qwen3-MoE checkpoint whose logits with the triton runner equal the torch runner's. Prints one
JSON list of failures."""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "runtime"))

from engine.api.moe import LocalAllToAll  # noqa: E402
from engine.config import ServerConfig  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from engine.models.parsing import read_hf_dir  # noqa: E402
from engine.testing.moe import runner_failures  # noqa: E402
from engine_moe_torch.impl import TorchRunner  # noqa: E402
from engine_moe_triton.impl import TritonRunner  # noqa: E402

from _tiny import checkpoint  # noqa: E402

def triton_runner(gemv_max_pairs: int, acc2d: bool = False,
                  next_tile: bool = False) -> TritonRunner:
    runner = TritonRunner(None)
    runner.gemv_max_pairs = gemv_max_pairs  # 0: always the sorted grouped-GEMM path
    runner.gemv["acc2d"] = acc2d
    runner.gemv["next_tile"] = next_tile  # the next K tile's weights loaded first
    runner.gemv_one = None  # one token through the launch under test too
    return runner


failures = []
# the grouped-GEMM path, then the matrix-vector path of small batches (both accumulations,
# with the next tile loaded first)
for pairs, acc2d, nxt in ((0, False, False), (64, False, False), (64, True, False),
                          (64, True, True)):
    failures += [f"gemv_max_pairs={pairs} acc2d={acc2d} next={nxt}: {f}"
                 for f in runner_failures(triton_runner(pairs, acc2d, nxt),
                                          torch.device("cpu"), small=True,
                                          dtypes=(torch.float32,))]
# the experts' weights read with L2 cache hints (the same values: hints only)
hinted = triton_runner(64, next_tile=True)
hinted.l2_hints = 2
failures += [f"l2_hints: {f}" for f in runner_failures(
    hinted, torch.device("cpu"), small=True, dtypes=(torch.float32,))]
# the runner as built: one token through its own launch (GEMV_ONE_TOKEN)
failures += [f"default runner: {f}" for f in runner_failures(
    TritonRunner(None), torch.device("cpu"), small=True, dtypes=(torch.float32,))]
# the matrix-vector path's rows: each pair's weighted expert output (a -1 pair, another
# rank's expert, zeros), summed per token by the combine kernel
from engine_moe_triton import kernels  # noqa: E402

gen = torch.Generator().manual_seed(3)
t, k, e, h, inter = 5, 3, 6, 40, 24
x = torch.randn(t, h, generator=gen)
w13 = torch.randn(e, 2 * inter, h, generator=gen) / 8
w2 = torch.randn(e, h, inter, generator=gen) / 8
ids = torch.randint(0, e, (t, k), generator=gen, dtype=torch.int32)
ids[1, 2] = -1
wts = torch.rand(t, k, generator=gen)
gu, down = torch.empty(t * k, 2 * inter), torch.full((t * k, h), float("nan"))
kernels.pair_moe(x, w13, w2, ids, wts, gu, down, block_n=16, block_k=16)
for p in range(t * k):
    e_ = int(ids.view(-1)[p])
    if e_ < 0:
        want = torch.zeros(h)
    else:
        g, u = (w13[e_] @ x[p // k]).split(inter)
        want = wts.view(-1)[p] * (w2[e_] @ (torch.nn.functional.silu(g) * u))
    if not torch.allclose(down[p], want, atol=1e-5, rtol=1e-4):
        failures.append(f"pair {p}: rows differ by {(down[p] - want).abs().max():.3g}")
# the down projection over whole tiles (``even_down``: unrolled, no masks) where the widths
# allow it, and the loop where they do not (24 inputs are no whole tiles of 16)
for h2, inter2 in ((48, 32), (40, 24)):
    x2 = torch.randn(1, h2, generator=gen)
    w13b = torch.randn(e, 2 * inter2, h2, generator=gen) / 8
    w2b = torch.randn(e, h2, inter2, generator=gen) / 8
    ids2 = torch.tensor([[4, -1, 1]], dtype=torch.int32)
    wts2 = torch.rand(1, k, generator=gen)
    gu2, down2 = torch.empty(k, 2 * inter2), torch.full((k, h2), float("nan"))
    kernels.pair_moe(x2, w13b, w2b, ids2, wts2, gu2, down2, block_n=16, block_k=16,
                     even_down=(16, 16, 4))
    for p in range(k):
        e_ = int(ids2.view(-1)[p])
        want = torch.zeros(h2)
        if e_ >= 0:
            g, u = (w13b[e_] @ x2[0]).split(inter2)
            want = wts2.view(-1)[p] * (w2b[e_] @ (torch.nn.functional.silu(g) * u))
        if not torch.allclose(down2[p], want, atol=1e-5, rtol=1e-4):
            failures.append(f"even_down {h2}x{inter2} pair {p}: rows differ by "
                            f"{(down2[p] - want).abs().max():.3g}")
# the combine with the residual added (each rounded as a separate add rounds: the sum to the
# output dtype, then the total) and the sums of squares of the rows' pieces (float16: the
# interpreter truncates float32 to bfloat16 where a GPU and torch round)
for dtype, width in ((torch.float32, h), (torch.float16, 2500)):
    d = torch.randn(t * k, width, generator=gen).to(dtype)
    r = torch.randn(t, width, generator=gen).to(dtype)
    got, ss = kernels.combine_pairs(d, k, dtype, r)
    want = (kernels.combine_pairs(d, k, dtype).float() + r.float()).to(dtype)
    if not torch.equal(got, want):
        failures.append(f"combine with residual {dtype}: {(got - want).abs().max():.3g}")
    total = (want.float() ** 2).sum(dim=1)
    if ss.shape != (t, -(-width // 1024)) or \
            not torch.allclose(ss.sum(dim=1), total, rtol=1e-5):
        failures.append(f"combine with residual {dtype}: sums of squares {ss.shape}")
cfg = read_hf_dir(checkpoint("Qwen3MoeForCausalLM"))
outs = []
for runner in (TorchRunner(), triton_runner(0), triton_runner(64)):
    model = load_model(cfg, ServerConfig(), torch.device("cpu"), torch.float32,
                       experts=(runner, LocalAllToAll()))
    x = torch.randn(11, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        outs.append(torch.stack([layer.mlp(x) for layer in model.model.layers]))
for out in outs[1:]:
    if not torch.allclose(outs[0], out, atol=1e-5, rtol=1e-4):
        failures.append(f"model sparse blocks differ: {(outs[0] - out).abs().max():.2e}")
print(json.dumps(failures))
