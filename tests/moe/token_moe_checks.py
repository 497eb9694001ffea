"""One token through ``kernels.token_moe`` (the up projection storing each pair's activation,
then one down launch through all the token's pairs with their combine): against the pair
launches plus ``combine_pairs`` (the shipped path) and the float32 definition, with and without
the residual (its sums of squares too), a pair of another rank's expert (-1) among them, and
the runner routing one token there; on a GPU also the down projection on the matrix unit
and both projections there (``token_mma.moe_mma``, Gluon kernels) and their routing.
``python token_moe_checks.py cpu`` (under TRITON_INTERPRET=1: small widths) or ``cuda``
(Qwen3-30B-A3B's widths, every launch the benchmark tries). Prints one JSON list of
failures."""

import json
import os
import sys

import torch

from engine.models.moe import torch_reference
from engine.testing.moe import runner_failures
from engine_moe_triton import kernels, token_mma
from engine_moe_triton.impl import TritonRunner

device = torch.device(sys.argv[1])
gpu = device.type == "cuda"
failures = []
gen = torch.Generator().manual_seed(5)
if gpu:  # (hidden, inter, experts, top-k), launches (down BLOCK_N, BLOCK_K, warps), prefetch
    shapes = [(2048, 768, 128, 8), (2048, 1408, 60, 4)]
    launches = [((4, 256, 4), False), ((2, 256, 4), False), ((8, 128, 4), False),
                ((4, 256, 4), True)]
    up = dict(block_n=2, block_k=2048, warps=4, l2_hints=1)
    dtypes = (torch.bfloat16, torch.float16)
    #: the matrix unit's down launches (MR, warps) tried where they fit
    MMA_LAUNCHES = [(1, 4), (1, 4, 0), (2, 4), (4, 4), (1, 8), (2, 8), (1, 2), (2, 2), (1, 1)]
    UP_LAUNCHES = [(2, 4), (2, 8), (2, 8, 0), (2, 16), (4, 8), (4, 4), (2, 2)]
else:
    shapes = [(48, 32, 6, 3), (32, 48, 5, 2)]
    launches = [((8, 16, 4), False), ((4, 16, 4), True)]
    up = dict(block_n=4, block_k=16)
    dtypes = (torch.float32, torch.bfloat16)

for h, inter, e, k in shapes:
    for dtype in dtypes:
        x = torch.randn(1, h, generator=gen).to(device, dtype)
        w13 = (torch.randn(e, 2 * inter, h, generator=gen) / h ** 0.5).to(device, dtype)
        w2 = (torch.randn(e, h, inter, generator=gen) / inter ** 0.5).to(device, dtype)
        ids = torch.randperm(e, generator=gen)[:k].view(1, k).to(torch.int32)
        ids[0, 1] = -1  # another rank's expert: adds nothing
        ids = ids.to(device)
        wts = torch.rand(1, k, generator=gen).to(device)
        res = torch.randn(1, h, generator=gen).to(device, dtype)
        gu = torch.empty(k, 2 * inter, dtype=dtype, device=device)
        down = torch.empty(k, h, dtype=dtype, device=device)
        kernels.pair_moe(x, w13, w2, ids, wts, gu, down, **({} if gpu else dict(
            block_n=16, block_k=16)))
        shipped, shipped_ss = kernels.combine_pairs(down, k, dtype, res)
        exact = torch_reference(w13, w2, x, ids, wts) + res.float()
        fitting = [(launch, prefetch) for launch, prefetch in launches
                   if kernels.token_down_fits(k, h, inter, *launch[:2])]
        if not fitting:  # (1408 inputs are no whole tiles of 256: the 128-wide launch only)
            failures.append(f"{h}x{inter}: no launch fits")
        for launch, prefetch in fitting:
            for residual in (None, res):
                act = torch.full((k, inter), float("nan"), dtype=dtype, device=device)
                out = torch.empty(1, h, dtype=dtype, device=device)
                ss = (torch.empty(h // launch[0], dtype=torch.float32, device=device)
                      if residual is not None else None)
                kernels.token_moe(x, w13, w2, ids, wts, act, out, residual, ss,
                                  token_down=launch, prefetch=prefetch, **up)
                name = f"{h}x{inter} top-{k} {dtype} {launch} prefetch={prefetch} " \
                       f"residual={residual is not None}"
                want = shipped if residual is not None else \
                    kernels.combine_pairs(down, k, dtype)
                # the shipped path rounds the same values (sums in another order), and the
                # output is rounded at most three times (pair rows, their sum, the residual
                # added): a few units in the last place of the output's largest values
                ref = exact if residual is not None else exact - res.float()
                tol = dict(rtol=0, atol=8 * torch.finfo(dtype).eps * float(ref.abs().max()))
                if not torch.allclose(out.float(), want.float(), **tol):
                    failures.append(f"{name}: against the pair launches "
                                    f"{(out.float() - want.float()).abs().max():.3g}")
                if not torch.allclose(out.float(), ref, **tol):
                    failures.append(f"{name}: against float32 "
                                    f"{(out.float() - ref).abs().max():.3g}")
                if residual is not None and not torch.allclose(
                        ss.sum(), (out.float() ** 2).sum(), rtol=1e-4):
                    failures.append(f"{name}: sums of squares {ss.sum():.6g} against "
                                    f"{(out.float() ** 2).sum():.6g}")

        if gpu and dtype != torch.float32 and token_mma.available():
            # the down projection on the matrix unit after the up projection's GLU form, then
            # both projections on the matrix unit (the activations against the GLU form's)
            glu_act = None
            tries = [(None, m) for m in MMA_LAUNCHES if token_mma.fits(h, inter, *m)]
            tries += [(u, (1, 4)) for u in UP_LAUNCHES if token_mma.fits(2 * inter, h, *u)]
            for up_launch, mma in tries:
                act = torch.full((k, inter), float("nan"), dtype=dtype, device=device)
                pairs = torch.full((k, h), float("nan"), dtype=dtype, device=device)
                token_mma.moe_mma(x, w13, w2, ids, wts, act, pairs, down_launch=mma,
                                  up_launch=up_launch, **up)
                got, got_ss = kernels.combine_pairs(pairs, k, dtype, res)
                tol = dict(rtol=0, atol=8 * torch.finfo(dtype).eps * float(exact.abs().max()))
                name = f"{h}x{inter} top-{k} {dtype} up {up_launch} down {mma}"
                for what, want in (("the pair launches", shipped.float()), ("float32", exact)):
                    if not torch.allclose(got.float(), want, **tol):
                        failures.append(f"{name}: against {what} "
                                        f"{(got.float() - want).abs().max():.3g}")
                mine = ids.view(-1) >= 0  # (another rank's pair: its activation is unused)
                if up_launch is None:
                    glu_act = act
                elif not torch.allclose(act[mine].float(), glu_act[mine].float(), rtol=0,
                                        atol=4 * torch.finfo(dtype).eps
                                        * float(glu_act[mine].abs().max())):
                    diff = (act[mine].float() - glu_act[mine].float()).abs().max()
                    failures.append(f"{name}: activations against the GLU form's {diff:.3g}")

# the runner: one token routed to token_moe (the kit's cases; the ones whose widths the
# launch does not fit keep the pair launches)
runner = TritonRunner(None)
runner.gemv_one = dict(runner.gemv_one, token_down=(4, 16, 4))  # (the kit's widths are small)
failures += [f"runner with token_down: {f}" for f in runner_failures(
    runner, device, small=not gpu, dtypes=(torch.float32,) if not gpu else
    (torch.float32, torch.bfloat16))]
if not gpu:
    os.environ["ENGINE_MOE_TOKEN_DOWN"] = "4,16,4,p"
    launch = TritonRunner(None).gemv_one
    if launch["token_down"] != (4, 16, 4) or not launch.get("prefetch"):
        failures.append(f"ENGINE_MOE_TOKEN_DOWN=4,16,4,p gave {launch}")
if gpu and token_mma.available():  # one token routed to the projections on the matrix unit
    for launches in (dict(down_mma=(1, 1)), dict(down_mma=(1, 1), up_mma=(2, 2))):
        runner = TritonRunner(None)
        runner.gemv_one = dict(runner.gemv_one, **launches)  # (the kit's widths are small)
        failures += [f"runner with {launches}: {f}" for f in runner_failures(
            runner, device, small=False, dtypes=(torch.bfloat16,))]
os.environ.update(ENGINE_MOE_DOWN_MMA="2,8", ENGINE_MOE_UP_MMA="4,8")
launch = TritonRunner(None).gemv_one
if launch.get("down_mma") != (2, 8) or launch.get("up_mma") != (4, 8):
    failures.append(f"ENGINE_MOE_DOWN_MMA=2,8 ENGINE_MOE_UP_MMA=4,8 gave {launch}")
for name in ("ENGINE_MOE_DOWN_MMA", "ENGINE_MOE_UP_MMA"):
    os.environ.pop(name)
print(json.dumps(failures))
