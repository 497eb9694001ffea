"""End-to-end on a GPU: a dummy-weight Llama-3-8B-shaped model through our ModelRunner with each
attention backend (same greedy tokens, logits close), then decode ms/step at several batch sizes
next to Hugging Face transformers in the same run. Prints tables; writes JSON to $OUT if set.

    python3 benchmarks/e2e_gpu.py [--backends torch_native,triton,flashinfer] [--batches 1,32,128]
                                  [--hf eager,compile] [--steps 32] [--rounds 3]
                                  [--quantization fp8]

Every runner is built (and checked) first and kept; the decode timings then go over them in
``--rounds`` rounds, in a rotated order each round, and the median is reported with each
round's figure (differences smaller than the spread between rounds are noise).

The model config is tests/data/llama3-8b-dummy/config.json (hidden 4096, 32 layers, 32 q / 8 kv
heads, intermediate 14336, vocab 128256, rope theta 500000); weights are random bf16 drawn on
the GPU from --random-seed, identical for every backend.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
import traceback
from pathlib import Path

import torch

from engine.config import ServerConfig
from engine.runtime.model_runner import ModelRunner
from engine.testing.batches import BatchBuilder

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = str(ROOT / "tests" / "data" / "llama3-8b-dummy")
PROMPT_LENS = (17, 64, 100, 128)
#: backend spec suffix -> the environment its runner is built and run under
MODES = {"nopdl": {"ENGINE_PDL": "0"},
         "fused": {"ENGINE_FUSED_GEMV": "1", "ENGINE_GEMV_CHAIN": "0"},
         "fmerge": {"ENGINE_TRITON_DECODE_FUSED_MERGE": "1"},
         "mergek": {"ENGINE_TRITON_DECODE_FUSED_MERGE": "0"},
         "rows": {"ENGINE_TRITON_NEW_KV": "1"}, "pool": {"ENGINE_TRITON_NEW_KV": "0"},
         "l2": {"ENGINE_L2_PREFETCH": "1"}, "qptr": {"ENGINE_TRITON_Q_DESC": "0"},
         "late": {"ENGINE_GEMV_EARLY": "0", "ENGINE_GEMV_CHAIN": "0"},
         "unchained": {"ENGINE_GEMV_CHAIN": "0"},
         "nopreload": {"ENGINE_TRITON_DECODE_PRELOAD": "0"},
         "nocodes": {"ENGINE_PRODUCER_CODES": "0"},
         "noocodes": {"ENGINE_TRITON_OUTPUT_CODES": "0"},
         "decode8": {"ENGINE_TRITON_DECODE_LAUNCH": "64,8,2"}}
GEN_STEPS = 16


def _mode_env(spec: str) -> None:
    """The environment of ``spec``'s mode (:data:`MODES`), every other mode's unset."""
    for name in {k for env in MODES.values() for k in env}:
        os.environ.pop(name, None)
    for mode in spec.partition(":")[2].split("+"):  # (modes joined by "+" combine)
        os.environ.update(MODES.get(mode, {}))


def make_runner(spec: str, max_running: int, quantization: str | None = None,
                model_dir: str = MODEL_DIR, *, page_size: int = 16,
                max_total_tokens: int | None = None, device: str = "auto",
                kv_cache_dtype: str = "auto") -> ModelRunner:
    """``spec`` is a backend name, optionally ``:eager`` to turn CUDA graphs off (``:nopdl``:
    kernels launched without programmatic dependent launch; ``:fused``: the norms and
    SiLU-and-mul inside the one-row products; ``:fmerge``: the triton decode merge folded into
    its split kernel (``:mergek`` keeps the merge kernel); ``:rows``: the triton extend
    kernel reads the forward's new K/V as rows at every page size (``:pool``: through the
    pool; the default reads them as rows where a page does not hold whole 64-key tiles);
    ``:l2``: the output projection's weights asked into L2 during decode attention;
    ``:qptr``: the triton extend loads its query tile by pointers, not a descriptor;
    ``:unchained``: the one-row layer not as four chained products (``ENGINE_GEMV_CHAIN=0``);
    ``:nopreload``: the triton decode kernel reads its first key tile after its wait;
    ``:nocodes``: block fp8's inputs not written as group codes by the norm and SiLU-and-mul
    kernels (each product's rows quantized by ``quant_groups``); ``:noocodes``: those, but
    the output projection's rows quantized by ``quant_groups`` (not written by the triton
    decode merge); modes joined by ``+`` combine; set by the caller through the environment,
    :data:`MODES`); ``quantization`` a ``--quantization`` choice that quantizes the dummy bf16
    weights at load (e.g. ``fp8``); ``model_dir`` a dummy config's folder; ``max_total_tokens``
    the KV pool (default: room for ``max_running`` short prompts); ``device`` "cpu" runs
    float32 activations (a smoke run); ``kv_cache_dtype`` the ``--kv-cache-dtype``."""
    backend, _, mode = spec.partition(":")
    # (room for the timed batches' 128-token prompts and their steps, and small enough that
    # several runners fit for the interleaved rounds)
    tokens = max_total_tokens or max(40_000, 400 * max_running)
    cfg = ServerConfig(model_path=model_dir, load_format="dummy", device=device,
                       dtype="float32" if device == "cpu" else "bfloat16",
                       quantization=quantization, kv_cache_dtype=kv_cache_dtype,
                       skip_tokenizer_init=True, attention_backend=backend, page_size=page_size,
                       disable_cuda_graph="eager" in mode.split("+"), max_total_tokens=tokens,
                       max_running_requests=max_running,
                       context_length=max(4096, max_total_tokens or 0), random_seed=0)
    return ModelRunner(cfg)


def prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def greedy(runner: ModelRunner) -> tuple[list[list[int]], torch.Tensor, list[list[float]]]:
    """Prefill all prompts in one ragged extend, then GEN_STEPS batched decode steps; also the
    top-1 minus top-2 logit margin of every chosen token (small margins are near-ties)."""
    bb = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    ps = prompts(runner.model_config.vocab_size)
    rows = [bb.new_request() for _ in ps]
    logits = runner.forward(bb.extend(list(zip(rows, ps))))
    first_logits = logits.clone()
    margins: list[list[float]] = [[] for _ in ps]

    def margin(lg: torch.Tensor) -> None:
        top = lg.float().topk(2, dim=-1).values
        for m, v in zip(margins, (top[:, 0] - top[:, 1]).tolist()):
            m.append(v)

    margin(logits)
    out = [[int(t)] for t in logits.argmax(-1).tolist()]
    for _ in range(GEN_STEPS - 1):
        logits = runner.forward(bb.decode([(r, o[-1]) for r, o in zip(rows, out)]))
        margin(logits)
        for o, t in zip(out, logits.argmax(-1).tolist()):
            o.append(int(t))
    return out, first_logits, margins


def time_decode(runner: ModelRunner, batch: int, steps: int,
                overlap: bool = False) -> tuple[float, list[int]]:
    """(ms per decode step for ``batch`` requests after a 128-token prefill each (includes the
    test batch builder's per-step table writes, as a scheduler would do), the first request's
    greedy tokens over the timed steps). Without ``overlap`` the host reads each step's tokens
    before it builds the next step; with it the tokens stay on the device (each step's
    input ids copied from the previous step's argmax there, as the overlap scheduler keeps
    them), so the host builds and launches step N+1 while the GPU runs step N."""
    bb = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    gen = torch.Generator().manual_seed(batch)
    rows = [bb.new_request() for _ in range(batch)]
    last = []
    for i in range(0, batch, 16):
        chunk = rows[i:i + 16]
        items = [(r, torch.randint(0, 32000, (128,), generator=gen).tolist()) for r in chunk]
        last += runner.forward(bb.extend(items)).argmax(-1).tolist()
    for _ in range(3):  # warm-up
        last = runner.forward(bb.decode(list(zip(rows, last)))).argmax(-1).tolist()
    torch.cuda.synchronize()
    t = time.perf_counter()
    first = []
    if overlap:
        on_device, outs = torch.tensor(last, device="cuda"), []
        for _ in range(steps):
            step = bb.decode([(r, 0) for r in rows])
            step.input_ids.copy_(on_device)
            on_device = runner.forward(step).argmax(-1)
            outs.append(on_device)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1000 / steps
        return ms, [int(o[0]) for o in outs]
    for _ in range(steps):
        last = runner.forward(bb.decode(list(zip(rows, last)))).argmax(-1).tolist()
        first.append(last[0])
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1000 / steps, first


def hf_decode(mode: str, batch: int, steps: int, device: str = "cuda", model_dir: str = MODEL_DIR,
              tokens: list | None = None) -> float:
    """transformers on the same config with random bf16 weights (seed 0): ms per decode step.

    "eager": ``model.generate`` (dynamic cache) after a 4-token warm-up call; the time of a
    call making ``steps + 1`` tokens minus that of a 1-token call (its prefill), per step. "compile": the static-cache recipe: a
    StaticCache built once, the 128-token prefill run eagerly, then one decode step (token ids
    [batch, 1], position [1] -> greedy ids [batch, 1]) compiled once (fullgraph, static shapes,
    "reduce-overhead" = CUDA graphs on CUDA, "default" elsewhere); 4 warm-up steps compile and
    record, then only ``steps`` further steps are timed, synchronised around the loop. "static" is
    that loop uncompiled (the reference for tokens). ``tokens`` (if given) gets the greedy ids."""
    import inspect
    from transformers import AutoConfig, AutoModelForCausalLM, StaticCache

    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(model_dir)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, min(32000, cfg.vocab_size), (batch, 128), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if mode == "eager":  # decode only: a 1-token call's time (prefill) is subtracted
        kw = dict(do_sample=False, pad_token_id=0)
        model.generate(ids, **kw, min_new_tokens=4, max_new_tokens=4)  # warm-up
        sync()
        t0 = time.perf_counter()
        model.generate(ids, **kw, min_new_tokens=1, max_new_tokens=1)
        sync()
        prefill = time.perf_counter() - t0
        t = time.perf_counter() + prefill  # so that the final (end - t) excludes the prefill
        model.generate(ids, **kw, min_new_tokens=steps + 1, max_new_tokens=steps + 1)
    else:
        warm, n, fwd = 4, ids.shape[1], inspect.signature(model.forward).parameters
        extra = {"max_batch_size": batch} if "max_batch_size" in inspect.signature(
            StaticCache.__init__).parameters else {}  # older constructors want the batch
        cache = StaticCache(config=cfg, max_cache_len=n + warm + steps + 8, **extra)
        ck = "cache" if "cache" in fwd else "past_key_values"  # 5.24: cache, 5.17: past_key_values

        def step(tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            kw = {ck: cache, **({"cache_position": pos} if "cache_position" in fwd else {})}
            out = model(tok, position_ids=pos[None], use_cache=True, **kw)
            return out.logits[:, -1].argmax(-1, keepdim=True)

        fn = step if mode == "static" else torch.compile(
            step, mode="reduce-overhead" if device == "cuda" else "default", fullgraph=True,
            dynamic=False)
        with torch.no_grad():
            tok, pos = step(ids, torch.arange(n, device=device)), torch.tensor([n], device=device)
            for i in range(warm + steps):
                if i == warm:
                    sync()
                    t = time.perf_counter()
                if tokens is not None:
                    tokens.append(tok)
                if device == "cuda":
                    torch.compiler.cudagraph_mark_step_begin()
                tok = fn(tok, pos).clone()  # the graph's output buffer is reused next replay
                pos += 1
        del cache
    sync()
    ms = (time.perf_counter() - t) * 1000 / steps
    del model
    if mode == "compile":
        torch._dynamo.reset()  # drops the graphs (and their hold on the model) for the next call
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return ms


def cpu_smoke(steps: int) -> None:
    """hf_decode("compile") on a tiny Llama on the CPU: one compilation of the decode step over
    warm-up + timed steps, and the uncompiled loop's greedy tokens up to where the two part
    (compiled kernels round differently: a random tiny model's near-ties then part them; the
    first steps must agree)."""
    import tempfile

    from torch._dynamo.utils import counters
    from transformers import LlamaConfig

    tmp = tempfile.mkdtemp()
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=512, max_position_embeddings=512,
                ).save_pretrained(tmp)
    torch._logging.set_logs(recompiles=True)
    ref, got = [], []
    ms_ref = hf_decode("static", 2, steps, "cpu", tmp, ref)
    ms = hf_decode("compile", 2, steps, "cpu", tmp, got)
    same = torch.equal(torch.cat(ref, 1), torch.cat(got, 1))
    agree = next((i for i, (a, b) in enumerate(zip(ref, got)) if not torch.equal(a, b)), len(ref))
    print(f"static (uncompiled) {ms_ref:.2f} ms/step, compile {ms:.2f} ms/step, "
          f"{len(got)} x {tuple(got[0].shape)} greedy tokens, same: {same} (agree for the "
          f"first {agree} steps)")
    print(f"dynamo: unique_graphs={counters['stats']['unique_graphs']} "
          f"calls_captured={counters['stats']['calls_captured']} "
          f"recompiles={sum(counters['recompiles'].values())}")
    print("tokens[0]:", torch.cat(got, 1)[0].tolist())
    assert agree >= 4 and counters["stats"]["unique_graphs"] == 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="torch_native,triton,triton:eager,flashinfer",
                    help="backend[:eager|:nopdl|:fused|:fmerge|:mergek|:rows|:pool|:l2|:qptr"
                    "|:late|:unchained|:nopreload|:decode8, modes joined by +]; "
                    "CUDA graphs are used for decode where the backend supports them unless "
                    ":eager; :nopdl launches without PDL; :fused folds the norms and "
                    "SiLU-and-mul into the one-row products; :fmerge folds the triton decode "
                    "merge into its split kernel, :mergek keeps the separate merge kernel (the "
                    "default); :rows / :pool: the triton extend reads this forward's K/V as "
                    "rows / through the pool at every page size; :l2: the output projection's "
                    "weights asked into L2 during decode attention; :qptr: the triton "
                    "extend loads its query tile by pointers, not a tensor descriptor; :late: the "
                    "one-row float products load their weights after their wait (the kernel "
                    "before); "
                    ":unchained: the one-row layer not as four chained products (norms, "
                    "residual adds and SiLU-and-mul in their own kernels); :nopreload: the "
                    "triton decode kernel reads its first key tile after its wait; :decode8: "
                    "the triton decode kernel at 64 keys a tile, 8 warps, 2 stages")
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--overlap", action="store_true",
                    help="also time each batch with the tokens kept on the device, the host "
                    "building step N+1 while the GPU runs step N (as the overlap scheduler "
                    "does)")
    ap.add_argument("--hf", default="eager,compile")
    ap.add_argument("--hf-batches", default="1,32", help="batch sizes for transformers")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3,
                    help="timing rounds; every runner is kept and the rounds go over them in "
                    "turn (a rotated order each round), so that the GPU's state drifting "
                    "during the run weighs on all alike; the median is reported")
    ap.add_argument("--model-dir", default=MODEL_DIR,
                    help="the dummy config's folder (a quantization_config in it: dummy codes)")
    ap.add_argument("--quantization", default=None,
                    help="a --quantization choice applied to the dummy weights at load")
    ap.add_argument("--kv-cache-dtype", default="auto",
                    help="the KV cache's --kv-cache-dtype (fp8_e4m3...) for every backend")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="only the transformers compile loop, tiny Llama on the CPU")
    args = ap.parse_args()
    if args.cpu_smoke:
        return cpu_smoke(args.steps)
    backends = [b for b in args.backends.split(",") if b]
    batches = [int(b) for b in args.batches.split(",")]
    results: dict = {"device": torch.cuda.get_device_name(), "greedy": {}, "decode_ms": {}}
    ref_tokens, ref_logits = None, None
    decode_tokens: dict = {}
    runners: dict = {}
    for backend in backends:
        _mode_env(backend)
        try:
            t0 = time.perf_counter()
            runner = make_runner(backend, max(batches + [len(PROMPT_LENS)]), args.quantization,
                                 args.model_dir, kv_cache_dtype=args.kv_cache_dtype)
            print(f"{backend}: decode CUDA graphs "
                  f"{'on' if runner.decode_graphs is not None else 'off'}", flush=True)
            startup = time.perf_counter() - t0
            tokens, logits, margins = greedy(runner)
            entry = {"startup_s": round(startup, 1), "tokens": tokens, "margins": margins}
            if ref_tokens is None:
                ref_tokens, ref_logits, ref_margins = tokens, logits, margins
            entry["same_tokens_as_first"] = tokens == ref_tokens
            entry["first_divergence"] = next(
                ([i, j] for i, (a, b) in enumerate(zip(tokens, ref_tokens))
                 for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
            div = entry["first_divergence"]
            entry["ref_margin_at_divergence"] = (ref_margins[div[0]][div[1]]
                                                 if div else None)
            entry["prefill_logits_max_abs_diff"] = float((logits - ref_logits).abs().max())
            entry["prefill_logits_scale"] = float(ref_logits.abs().max())
            results["greedy"][backend] = entry
            print(f"{backend}: greedy done, same tokens as first: "
                  f"{entry['same_tokens_as_first']}", flush=True)
            runners[backend] = runner
            del runner
        except Exception as exc:  # one backend's failure must not hide the others
            traceback.print_exc()
            results["greedy"][backend] = {"error": f"{type(exc).__name__}: {exc}"}
        gc.collect()
    timings: dict = {}
    order = list(runners)
    for r in range(max(1, args.rounds)):
        turn = order[r % len(order):] + order[:r % len(order)] if order else []
        for backend in turn:
            _mode_env(backend)
            for b, overlap in [(b, o) for b in batches
                               for o in ((False, True) if args.overlap else (False,))]:
                key = f"{backend}@{b}" + (" overlapped" if overlap else "")
                try:
                    ms, first = time_decode(runners[backend], b, args.steps, overlap)
                except Exception as exc:
                    traceback.print_exc()
                    timings.setdefault(key, []).append(float("nan"))
                    results["greedy"][backend]["error"] = f"{type(exc).__name__}: {exc}"
                    continue
                timings.setdefault(key, []).append(ms)
                same = decode_tokens.setdefault(b, first) == first
                results.setdefault("decode_same_tokens", {})[key] = same
                print(f"round {r + 1} {key}: {ms:.2f} ms/step (first request's timed "
                      f"tokens as the first timed backend's: {same})", flush=True)
    for key, values in timings.items():
        results["decode_ms"][key] = statistics.median(values)
        results.setdefault("decode_ms_rounds", {})[key] = values
    runners.clear()
    gc.collect()
    torch.cuda.empty_cache()
    for mode in [m for m in args.hf.split(",") if m]:
        hf_batches = [int(b) for b in args.hf_batches.split(",") if b]
        for b in hf_batches:
            try:
                ms = hf_decode(mode, b, args.steps)
                results["decode_ms"][f"hf-{mode}@{b}"] = ms
                print(f"hf-{mode}@{b}: {ms:.2f} ms/step", flush=True)
            except Exception as exc:
                traceback.print_exc()
                results["decode_ms"][f"hf-{mode}@{b}"] = f"{type(exc).__name__}: {exc}"
    print("\n== greedy equality (4 ragged prompts, 16 tokens, vs the first backend) ==")
    for name, e in results["greedy"].items():
        if "error" in e:
            print(f"{name:14s} ERROR {e['error']}")
        else:
            print(f"{name:14s} same_tokens={e['same_tokens_as_first']} "
                  f"first_divergence={e['first_divergence']} "
                  f"(reference top-2 margin there: {e['ref_margin_at_divergence']}) "
                  f"prefill_logits_max_abs_diff={e['prefill_logits_max_abs_diff']:.4f} "
                  f"(logit scale {e['prefill_logits_scale']:.2f}) startup={e['startup_s']}s")
    names = [n for n, e in results["greedy"].items() if "tokens" in e]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            same = results["greedy"][a]["tokens"] == results["greedy"][b]["tokens"]
            print(f"{a} vs {b}: same greedy tokens: {same}")
    print("\n== decode ms/step (dummy Llama-3-8B shape, bf16; roofline at batch 1 ~3.7 ms; "
          "ours: median of the rounds, then each round) ==")
    for key, ms in results["decode_ms"].items():
        rounds = results.get("decode_ms_rounds", {}).get(key)
        each = " (" + " / ".join(f"{v:.2f}" for v in rounds) + ")" if rounds else ""
        print(f"{key:22s} {ms if isinstance(ms, str) else f'{ms:8.2f}'}{each}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "e2e_gpu.json"), "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
