"""Mixture-of-experts on a GPU: the runner kit on CUDA, the fused-MoE kernel per layer against the
bandwidth/compute roofline, and whole-model decode of a dummy Qwen3-30B-A3B (48 layers, 128
experts, top-8) with the triton and torch runners (and transformers where asked), same run.

    python3 benchmarks/moe_gpu.py [--batches 1,8,64] [--kernel-tokens 1,8,64,256,1024,4096]
                                  [--layers 48] [--hf eager] [--tune]
                                  [--chain-layers 8] [--chain-tokens 1,8] [--chain-sweep]

Writes moe_gpu.json (and, with --tune, the tuned launch table) to $OUT when set.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "plugins" / "moe" / "triton"))
sys.path.insert(0, str(ROOT / "plugins" / "moe" / "torch"))

from engine.api.moe import ExpertWeights, route  # noqa: E402
from engine.testing.moe import runner_failures  # noqa: E402
from engine_moe_torch.impl import TorchRunner  # noqa: E402
import engine_moe_triton.impl as impl  # noqa: E402
from engine_moe_triton.impl import GEMV_DEFAULT, TritonRunner, table_name  # noqa: E402

MODEL_DIR = str(ROOT / "tests" / "data" / "qwen3-30b-a3b-dummy")
E, K, H, I = 128, 8, 2048, 768  # Qwen3-30B-A3B's sparse layer
BW = 4.3e12  # H200 HBM3e, bytes/s (spec; measured GEMV ~3.65e12)
FLOPS = 760e12  # bf16 dense, FLOP/s


def kit() -> list[list]:
    rows = []
    dev = torch.device("cuda")
    for name, runner in (("torch", TorchRunner()), ("triton (gemv for small)", TritonRunner(None)),
                         ("triton (grouped only)", TritonRunner(None))):
        if name == "triton (grouped only)":
            runner.gemv_max_pairs = 0
        fails = list(runner_failures(runner, dev))
        rows.append([name, len(fails), "; ".join(fails)[:200]])
    return rows


def layer(dtype=torch.bfloat16) -> tuple[ExpertWeights, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    ex = ExpertWeights(E, H, I, dtype).cuda()
    ex.w13.data.normal_(0, 0.02, generator=g)
    ex.w2.data.normal_(0, 0.02, generator=g)
    router = torch.randn(E, H, device="cuda", dtype=dtype, generator=g) * 0.02
    return ex, router


def routed(m: int, router: torch.Tensor) -> tuple:
    """``m`` random tokens routed by ``router``: (x, weights, ids, active experts, bytes the
    layer reads: the active experts' weights, x and the output)."""
    x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
    w, ids = route(x @ router.t(), K, True)
    active = int(ids.unique().numel())
    return x, w, ids, active, active * 3 * H * I * 2 + 2 * m * H * 2


def time_fn(fn, iters: int = 100, graph: bool = True) -> float:
    """ms per call: replayed from a CUDA graph (launch overhead as in a served decode step) or
    eagerly."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    else:
        run = fn
    run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def kernel_rows(tokens_list: list[int]) -> list[list]:
    ex, router = layer()
    tri, tch = TritonRunner(None), TorchRunner()
    for r in (tri, tch):
        r.process_weights_after_loading(ex)
    rows = []
    for m in tokens_list:
        x, w, ids, active, bytes_ = routed(m, router)
        flops = 2 * m * K * 3 * H * I
        t_tri = sorted(time_fn(lambda: tri.apply(ex, x, ids, w)) for _ in range(3))[1]
        t_tch = time_fn(lambda: tch.apply(ex, x, ids, w), graph=False)
        ref = tch.apply(ex, x, ids, w).float()
        err = ((tri.apply(ex, x, ids, w).float() - ref).abs().max() / ref.abs().max()).item()
        roof = max(bytes_ / BW, flops / FLOPS) * 1e3
        rows.append([m, active, round(t_tri * 1e3, 1), round(t_tch * 1e3, 1),
                     round(bytes_ / (t_tri * 1e-3) / 1e12, 2),
                     round(flops / (t_tri * 1e-3) / 1e12, 1), round(roof * 1e3, 1),
                     f"{err:.1e}"])
    return rows


def tune(tokens_list: list[int]) -> dict[int, dict]:
    """Sweep the grouped-GEMM launch parameters per token count (bf16, this layer shape)."""
    ex, router = layer()
    best: dict[int, dict] = {}
    space = [dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=gm,
                  num_warps=4 if bm <= 32 else 8, num_stages=ns)
             for bm in (16, 32, 64, 128) for bn in (64, 128) for bk in (64, 128)
             for gm in (1, 16) for ns in (3, 4)]
    for m in tokens_list:
        x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
        w, ids = route(x @ router.t(), K, True)
        r = TritonRunner(None)
        r.gemv_max_pairs = 0
        scores = []
        for cfg in space:
            r.override = cfg
            try:
                scores.append((time_fn(lambda: r.apply(ex, x, ids, w), iters=20), cfg))
            except Exception:  # a configuration the compiler rejects (shared memory...)
                continue
        scores.sort(key=lambda s: s[0])
        best[m] = scores[0][1]
        print(f"tune M={m}: {scores[0][0] * 1e3:.1f} us {scores[0][1]}", flush=True)
    return best


def sweep_gemv(tokens_list: list[int]) -> list[list]:
    """Time the matrix-vector path per launch configuration (CUDA graph replay)."""
    ex, router = layer()
    rows = []
    configs = [dict(block_n=bn, block_k=bk, warps=w, down_block_n=dbn, down_block_k=dbk,
                    acc2d=acc2d)
               for bn in (16, 32, 64) for bk in (128, 256, 512) for w in (4, 8)
               for dbn, dbk in ((None, None), (64, 128), (32, 256)) for acc2d in (False, True)]
    # (the next K tile's weights loaded first: two tiles in flight a program)
    configs += [dict(c, next_tile=True) for c in configs if not c["acc2d"]]
    for m in tokens_list:
        x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
        w, ids = route(x @ router.t(), K, True)
        r = TritonRunner(None)
        r.gemv_one = None  # every token count through the launch under test
        scores = []
        for cfg in configs:
            r.gemv = cfg
            try:
                scores.append((time_fn(lambda: r.apply(ex, x, ids, w), iters=50), cfg))
            except Exception:
                continue
        scores.sort(key=lambda s: s[0])
        for t, cfg in scores[:3]:
            rows.append([m, round(t * 1e3, 1), json.dumps(cfg)])
        rows.append([m, round(scores[-1][0] * 1e3, 1), "worst: " + json.dumps(scores[-1][1])])
        default = dict(dict(down_block_n=None, down_block_k=None, acc2d=False), **GEMV_DEFAULT)
        for rank, (t, cfg) in enumerate(scores):
            if {k: cfg.get(k, False) for k in (*cfg, *default)} == \
                    {k: default.get(k, False) for k in (*cfg, *default)}:
                rows.append([m, round(t * 1e3, 1), f"the default (rank {rank + 1} of "
                             f"{len(scores)}): " + json.dumps(cfg)])
    return rows


#: the fastest launch of a one-token sweep in the chain (``--chain-sweep``, ``--wide-sweep``),
#: which the model section's ``triton+best`` runner serves with
BEST_ONE_TOKEN: dict | None = None


def wide_launches() -> list[dict]:
    """One-token launches with few outputs a program and long K tiles (whole 4 KB rows of
    ``w13`` at 2048: one tile, every load of a program asked for at once)."""
    return [dict(block_n=bn, block_k=bk, warps=wp, down_block_n=dbn, down_block_k=dbk,
                 next_tile=bk < H, l2_hints=1)
            for bn in (2, 4, 8) for bk in (1024, 2048) for wp in (4, 8)
            for dbn, dbk in ((8, 1024), (16, 1024), (32, 256))]


def narrow_launches() -> list[dict]:
    """Around the best of :func:`wide_launches` on the H200 (2 outputs a program, whole rows,
    4 warps; the down projection 8 outputs a program, whole rows): 1-4 outputs a program,
    2-8 warps, the down projection 2-16 outputs with its own warps."""
    return [dict(block_n=bn, block_k=H, warps=wp, down_block_n=dbn, down_block_k=1024,
                 down_warps=dw, next_tile=False, l2_hints=1)
            for bn in (1, 2, 4) for wp in (2, 4, 8) for dbn in (2, 4, 8, 16)
            for dw in (2, 4, 8) if not (dbn >= 8 and dw == 2)]


def one_warp_launches() -> list[dict]:
    """One-token launches whose programs are one warp (each output's sum stays inside the warp:
    no reduction across warps through shared memory, which Nsight Compute showed the down
    projection's 4-warp programs waiting at for a fifth of its samples), in either projection
    or both, beside the shipped 4-warp ones (1-8 outputs a program, whole rows)."""
    return [dict(block_n=bn, block_k=H, warps=wp, down_block_n=dbn, down_block_k=1024,
                 down_warps=dw, next_tile=False, l2_hints=1)
            for bn, wp in ((2, 4), (1, 1), (2, 1)) for dbn, dw in ((8, 4), (2, 1), (4, 1), (8, 1))
            if wp == 1 or dw == 1]


def mma_launches() -> list[dict]:
    """The shipped one-token launch with its down projection on the matrix unit
    (``down_mma`` = (MR, warps[, prefetch]): 16 MR rows a program, the warps splitting the
    inputs; prefetch 0: the later lines not asked into L2 first), then
    with the up projection there too (``up_mma``), and with one down launch through the
    token's pairs (``token_down``), to compare in the chain."""
    from engine_moe_triton.impl import GEMV_ONE_TOKEN

    downs = ((1, 4), (1, 4, 0), (2, 4), (4, 4), (1, 8), (2, 8), (1, 2), (2, 2))
    ups = ((2, 4), (2, 8), (2, 8, 0), (2, 16), (4, 8), (4, 4))
    return ([dict(GEMV_ONE_TOKEN, down_mma=launch) for launch in downs]
            + [dict(GEMV_ONE_TOKEN, down_mma=(1, 4), up_mma=launch) for launch in ups]
            + [dict(GEMV_ONE_TOKEN, token_down=(4, 256, 4))])


def chain_rows(tokens_list: list[int], n_layers: int, sweep: bool,
               wide: str = "") -> list[list]:
    """The sparse layer as the model runs it: ``n_layers`` layers with their own weights (past
    L2), each layer's output the next one's input, in one CUDA graph (with PDL each kernel
    starts while the previous one finishes, as in a decode step); µs and TB/s per layer,
    against one layer replayed alone. Rows: the default launch and, with ``sweep``, the best
    three of a grid of one-token launches."""
    exs = [layer()[0] for _ in range(n_layers)]
    _, router = layer()
    tri = TritonRunner(None)
    for ex in exs:
        tri.process_weights_after_loading(ex)
    rows = []
    for m in tokens_list:
        x, w, ids, active, bytes_ = routed(m, router)

        def chain():
            y = x
            for ex in exs:
                y = tri.apply(ex, y, ids, w)
            return y

        launches = [("the default", None)]
        if sweep and m == 1:
            launches += [("", dict(block_n=bn, block_k=bk, warps=wp, down_block_n=dbn,
                                   next_tile=True, l2_hints=1))
                         for bn in (2, 16, 32) for bk in (256, 2048) for wp in (4, 8)
                         for dbn in (8, 16, 32)]
        if wide and m == 1:
            launches += [("", cfg) for cfg in {"narrow": narrow_launches,
                                                "onewarp": one_warp_launches,
                                                "mma": mma_launches}.get(
                                                    wide, wide_launches)()]
        scores = []
        for label, cfg in launches:
            saved = tri.gemv_one, tri.gemv
            if isinstance(cfg, dict) and m == 1:
                tri.gemv_one = cfg
            elif isinstance(cfg, dict):
                tri.gemv = cfg
            try:
                t_chain = sorted(time_fn(chain, iters=20) for _ in range(3))[1] / n_layers
                t_one = sorted(time_fn(lambda: tri.apply(exs[0], x, ids, w)) for _ in range(3))[1]
                scores.append((t_chain, t_one, label or json.dumps(cfg)))
            except Exception:  # a launch the compiler rejects
                pass
            tri.gemv_one, tri.gemv = saved
        fixed = sum(1 for s in scores if s[2].startswith("the default"))
        best = sorted(scores[fixed:])[:(15 if wide == "mma" else 5) if wide else 3]
        if best and m == 1:
            global BEST_ONE_TOKEN
            BEST_ONE_TOKEN = json.loads(best[0][2])
        for t_chain, t_one, label in scores[:fixed] + best:
            rows.append([m, active, n_layers, round(t_chain * 1e3, 1),
                         round(bytes_ / (t_chain * 1e-3) / 1e12, 2),
                         f"{bytes_ / (t_chain * 1e-3) / BW:.0%}", round(t_one * 1e3, 1),
                         round(bytes_ / (t_one * 1e-3) / 1e12, 2), label])
    exs.clear()
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def model_rows(batches: list[int], layers: int, hf: list[str],
               runners: tuple[str, ...] = ("triton", "torch"),
               overlap: bool = False) -> list[list]:
    """Decode ms/step of the model under each runner: the host reading each step's tokens
    before it builds the next; with ``overlap`` also the tokens left on the device and the next
    step built while the GPU runs this one, as the server's overlap scheduler (its default on a
    GPU) does."""
    from e2e_gpu import hf_decode, time_decode
    from engine.config import ServerConfig
    from engine.runtime.model_runner import ModelRunner

    rows = []
    override = json.dumps({"num_hidden_layers": layers})
    # triton, triton+hints / triton+keep / triton+nohints (L2 cache hints 1 / 2 / 0; the
    # one-token launch's default is 1), triton+noeven (the one-token down projection over
    # whole rows, not unrolled whole tiles), triton+token (one down launch through the token's
    # pairs with their combine, kernels.token_moe: token2 / token8 other launches, tokenp its
    # rows asked into L2 before its wait), triton+mma / mma8 / mma2 (the down projection on
    # the matrix unit at 1 x 16 rows a program and 4 / 8 warps, 2 x 16 and 4), triton+mmaup
    # (both projections there: up 2 x 16 rows and 8 warps, down 1 x 16 and 4; mmanopf: the
    # same without the prefetches of their later lines), torch
    variants = {"hints": ("ENGINE_MOE_L2_HINTS", "1"), "keep": ("ENGINE_MOE_L2_HINTS", "2"),
                "nohints": ("ENGINE_MOE_L2_HINTS", "0"),
                "noresidual": ("ENGINE_SPARSE_RESIDUAL", "0"),
                "noeven": ("ENGINE_MOE_EVEN_DOWN", "0"),
                "token": ("ENGINE_MOE_TOKEN_DOWN", "4,256,4"),
                "token2": ("ENGINE_MOE_TOKEN_DOWN", "2,256,4"),
                "token8": ("ENGINE_MOE_TOKEN_DOWN", "8,128,4"),
                "tokenp": ("ENGINE_MOE_TOKEN_DOWN", "4,256,4,p"),
                "mma": ("ENGINE_MOE_DOWN_MMA", "1,4"), "mma8": ("ENGINE_MOE_DOWN_MMA", "1,8"),
                "mma2": ("ENGINE_MOE_DOWN_MMA", "2,4"),
                "mmaup": ("ENGINE_MOE_DOWN_MMA", "1,4", "ENGINE_MOE_UP_MMA", "2,8"),
                "mmanopf": ("ENGINE_MOE_DOWN_MMA", "1,4,0", "ENGINE_MOE_UP_MMA", "2,8,0")}
    for spec in runners:
        runner_name, _, variant = spec.partition("+")
        attention, eager = "triton", runner_name == "torch"
        for names in variants.values():  # (env, value, env, value, ...)
            for env in names[::2]:
                os.environ.pop(env, None)
        if variant in variants:
            names = variants[variant]
            os.environ.update(zip(names[::2], names[1::2]))
        one_token = impl.GEMV_ONE_TOKEN
        if variant == "best":  # the chain sweep's fastest one-token launch
            if BEST_ONE_TOKEN is None:
                print("triton+best: no chain sweep ran", flush=True)
                continue
            impl.GEMV_ONE_TOKEN = dict(BEST_ONE_TOKEN)
        try:
            cfg = ServerConfig(model_path=MODEL_DIR, load_format="dummy", dtype="bfloat16",
                               skip_tokenizer_init=True, attention_backend=attention,
                               moe_runner_backend=runner_name, page_size=16,
                               disable_cuda_graph=eager, max_total_tokens=40_000,
                               max_running_requests=max(batches), context_length=2048,
                               json_model_override_args=override, random_seed=0)
            runner = ModelRunner(cfg)
            graphs = runner.decode_graphs is not None
            for b, ahead in [(b, o) for b in batches
                             for o in ((False, True) if overlap and graphs else (False,))]:
                rows.append([f"ours, {spec} runner" + (" + graphs" if graphs else "")
                             + (", overlapped" if ahead else ""),
                             b, round(time_decode(runner, b, 20, ahead)[0], 2)])
                print(rows[-1], flush=True)
            del runner
        except Exception:
            traceback.print_exc()
        for names in variants.values():
            for env in names[::2]:
                os.environ.pop(env, None)
        impl.GEMV_ONE_TOKEN = one_token
        gc.collect()
        torch.cuda.empty_cache()
    for mode in hf:
        for b in batches:
            try:
                rows.append([f"transformers {mode}", b, round(hf_decode(mode, b, 10, model_dir=MODEL_DIR), 2)])
                print(rows[-1], flush=True)
            except Exception:
                traceback.print_exc()
    return rows


def roofline_ms(layers: int) -> float:
    attn = H * (32 * 128 + 2 * 4 * 128) + 32 * 128 * H
    per_layer = attn + E * H + K * 3 * H * I
    head = 151936 * H
    return (layers * per_layer + head) * 2 / BW * 1e3


def table(title: str, header: list[str], rows: list[list]) -> None:
    print(f"\n{title}\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--kernel-tokens", default="1,2,4,8,16,64,256,1024,4096")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--hf", default="")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--sweep-gemv", action="store_true")
    ap.add_argument("--runners", default="triton,torch",
                    help="model decode: triton, triton+hints (the experts' weights read with "
                    "L2 policy evict_first), "
                    "triton+keep (hints, and the down projection's prefetch evict_last), "
                    "triton+nohints (none; the one-token default is evict_first), "
                    "triton+best (the fastest one-token launch of the chain sweep), "
                    "triton+noresidual (the residual added by the next layer's norm kernel), "
                    "torch; a runner may be named twice (order effects)")
    ap.add_argument("--shape", default=None,
                    help="E,top_k,H,I of the layer for the kit-free sections (default: "
                         "Qwen3-30B-A3B's 128,8,2048,768), e.g. 8,2,4096,14336 for Mixtral")
    ap.add_argument("--overlap", action="store_true",
                    help="model decode: also time each batch with the next step built while "
                    "the GPU runs this one (the overlap scheduler's way, the server's default)")
    ap.add_argument("--skip", default="", help="sections to skip: kit,kernel,chain,model")
    ap.add_argument("--chain-layers", type=int, default=8,
                    help="layers (own weights) in the chained kernel timing")
    ap.add_argument("--chain-tokens", default="1,8")
    ap.add_argument("--chain-sweep", action="store_true",
                    help="also time a grid of one-token launches in the chain")
    ap.add_argument("--wide-sweep", nargs="?", const="wide", default="",
                    choices=("wide", "narrow", "onewarp", "mma"),
                    help="also time one-token launches of 2-8 outputs a program and 1024-2048"
                    " long K tiles in the chain (narrow: 1-4 outputs, whole rows, each "
                    "projection's own warps; onewarp: programs of one warp in either "
                    "projection; mma: the shipped launch with its down projection on the "
                    "matrix unit); the fastest then serves triton+best")
    args = ap.parse_args()
    if args.shape:
        global E, K, H, I
        E, K, H, I = (int(v) for v in args.shape.split(","))
    skip = set(args.skip.split(","))
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d")}
    if "kit" not in skip:
        out["kit"] = kit()
        table("runner kit on CUDA (failures)", ["runner", "failures", "first"], out["kit"])
    if args.sweep_gemv:
        out["gemv_sweep"] = sweep_gemv([1, 8])
        table("matrix-vector path launch sweep (best 3 + worst per token count)",
              ["tokens", "us", "config"], out["gemv_sweep"])
    if args.tune:
        best = tune([16, 32, 64, 128, 256, 512, 1024, 2048, 4096])
        name = table_name(E, I, torch.cuda.get_device_name(), torch.bfloat16)
        print(f"tuned table {name}: {json.dumps({str(k): v for k, v in best.items()})}")
        dest = os.environ.get("OUT")
        if dest:
            with open(os.path.join(dest, name), "w") as fh:
                json.dump({str(k): v for k, v in best.items()}, fh, indent=1)
    if "kernel" not in skip:
        out["kernel"] = kernel_rows([int(x) for x in args.kernel_tokens.split(",")])
        table(f"one sparse layer (E={E}, top-{K}, H={H}, I={I}, bf16): triton in a CUDA graph, "
              "torch eager", ["tokens", "active experts", "triton us", "torch us",
                              "triton TB/s", "triton TFLOP/s", "roofline us", "max rel err"],
              out["kernel"])
    if "chain" not in skip:
        out["chain"] = chain_rows([int(x) for x in args.chain_tokens.split(",")],
                                  args.chain_layers, args.chain_sweep, args.wide_sweep)
        out["best_one_token"] = BEST_ONE_TOKEN
        table(f"the sparse layer in a chain of {args.chain_layers} (own weights, one CUDA graph;"
              f" E={E}, top-{K}, H={H}, I={I}, bf16) against one layer replayed alone",
              ["tokens", "active experts", "layers", "chain us/layer", "chain TB/s",
               "of 4.3 TB/s", "alone us", "alone TB/s", "launch"], out["chain"])
    if "model" not in skip:
        batches = [int(b) for b in args.batches.split(",")]
        out["model"] = model_rows(batches, args.layers,
                                  [m for m in args.hf.split(",") if m],
                                  tuple(args.runners.split(",")), args.overlap)
        out["roofline_ms_batch1"] = round(roofline_ms(args.layers), 2)
        table(f"decode ms/step, Qwen3-30B-A3B shape ({args.layers} layers, dummy bf16); "
              f"batch-1 bandwidth roofline of the active parameters "
              f"{out['roofline_ms_batch1']} ms", ["engine", "batch", "ms/step"], out["model"])
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "moe_gpu.json"), "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
