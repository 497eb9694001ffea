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

def triton_runner(gemv_max_pairs: int, acc2d: bool = False, combine: bool = False,
                  next_tile: bool = False, chained: bool = False) -> TritonRunner:
    runner = TritonRunner(None)
    runner.chained = chained  # both projections in one launch
    runner.gemv_max_pairs = gemv_max_pairs  # 0: always the sorted grouped-GEMM path
    runner.gemv["acc2d"] = acc2d
    runner.gemv["next_tile"] = next_tile  # the next K tile's weights loaded first
    runner.fused_combine = combine  # the down projection sums the pairs itself
    runner.gemv_one = None  # one token through the launch under test too
    return runner


failures = []
# the grouped-GEMM path, then the matrix-vector path of small batches (both accumulations,
# with the combine inside the down projection, with the next tile loaded first)
for pairs, acc2d, combine, nxt in ((0, False, False, False), (64, False, False, False),
                                   (64, True, False, False), (64, False, True, False),
                                   (64, True, True, True)):
    failures += [f"gemv_max_pairs={pairs} acc2d={acc2d} combine={combine} next={nxt}: {f}"
                 for f in runner_failures(triton_runner(pairs, acc2d, combine, nxt),
                                          torch.device("cpu"), small=True,
                                          dtypes=(torch.float32,))]
# both projections in one launch (the down items wait for their pair's up tiles)
failures += [f"chained: {f}" for f in runner_failures(
    triton_runner(64, next_tile=True, chained=True), torch.device("cpu"), small=True,
    dtypes=(torch.float32,))]
# the experts' weights read with L2 cache hints (the same values: hints only)
hinted = triton_runner(64, next_tile=True)
hinted.l2_hints = 2
failures += [f"l2_hints: {f}" for f in runner_failures(
    hinted, torch.device("cpu"), small=True, dtypes=(torch.float32,))]
# the runner as built: one token through its own launch (GEMV_ONE_TOKEN)
failures += [f"default runner: {f}" for f in runner_failures(
    TritonRunner(None), torch.device("cpu"), small=True, dtypes=(torch.float32,))]
# the combine inside the down projection gives the separate kernel's sums bit for bit (the
# same rounded rows, the same order), and leaves its counters at zero for the next call
from engine_moe_triton import kernels  # noqa: E402

gen = torch.Generator().manual_seed(3)
t, k, e, h, inter = 5, 3, 6, 40, 24
x = torch.randn(t, h, generator=gen)
w13 = torch.randn(e, 2 * inter, h, generator=gen) / 8
w2 = torch.randn(e, h, inter, generator=gen) / 8
ids = torch.randint(0, e, (t, k), generator=gen, dtype=torch.int32)
ids[1, 2] = -1  # another rank's expert: zeros, still counted in
wts = torch.rand(t, k, generator=gen)
gu, down = torch.empty(t * k, 2 * inter), torch.empty(t * k, h)
combined = torch.full((t, h), float("nan"))
kw = dict(block_n=16, block_k=16)
if not kernels.pair_moe(x, w13, w2, ids, wts, gu, down, combined=combined, **kw):
    failures.append("pair_moe did not combine")
want = kernels.combine_pairs(down, k, torch.float32)
if not torch.equal(combined, want):
    failures.append(f"fused combine differs: {(combined - want).abs().max():.3g}")
if kernels.combine_counters(x.device).any():
    failures.append("combine counters not reset")
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
# the one-launch form: the same rows as the two launches (whole rows of I summed at once, so
# within float32 rounding), a -1 pair's rows zero, and its counters zero again afterwards
gu2, down2 = torch.empty(t * k, 2 * inter), torch.full((t * k, h), float("nan"))
kernels.pair_moe_chained(x, w13, w2, ids, wts, gu2, down2, **kw, down_block_n=16)
if not torch.allclose(down2, down, atol=1e-6, rtol=1e-5):
    failures.append(f"chained rows differ: {(down2 - down).abs().max():.3g}")
if down2[1 * k + 2].any():
    failures.append("chained: another rank's pair not zero")
if kernels._chain_counters[x.device].any():
    failures.append("chained counters not reset")
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
