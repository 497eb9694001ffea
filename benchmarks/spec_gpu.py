"""Speculative decoding on a GPU: what a verify forward costs next to a decode step, and NGRAM
against plain decoding, same run. Prints tables; writes JSON to $OUT if set.

    python3 benchmarks/spec_gpu.py [--batches 1,16] [--widths 2,4,8,12,16]
        [--prompt-len 512] [--max-new 128] [--skip cost,e2e,profile,draft]

Model: the dummy Llama-3-8B shape (tests/data/llama3-8b-dummy), random bf16 weights, the
triton attention backend, page size 16, CUDA graphs on.

* **cost** (ModelRunner direct): per batch size, a decode step (its captured graph) and a
  verify forward of ``width`` tokens per request (a chain with its mask: captured verify graph,
  and eager), each the mean of repeated forwards of one prepared batch, after a prompt of
  ``--prompt-len`` tokens.
* **profile**: the kernels of one batch-1 decode replay and one 4-token verify replay.
* **e2e** (the scheduler, greedy, ``ignore_eos``): ``plain`` decoding, ``ngram`` (the NGRAM
  plugin with its defaults) and ``oracle`` (drafts the plain run's own continuation, every
  draft token right: the most a verify of that width gives) on two workloads: ``repeat``
  (a text of ``--prompt-len / 2`` tokens given twice: the model continues repeating it) and
  ``random`` (random tokens; nothing repeats). Decode rate per request is ``(tokens - 1) /
  (last token time - first token time)``; the batch's rate is the sum over its requests of
  ``tokens - 1`` over the span from the first first-token to the last token. Then the
  scheduler's mean wall ms per step by phase (its step timer).
* **draft** (run last: it makes the target capture features): EAGLE3 draft time per verify
  step with a random head of the model's shape, 3 steps, top-1: every request at once with
  the steps replaying captured graphs, the same without graphs, and each request alone; then
  a random DFLASH draft's blocks of 8 and UNO's draft forward (a block of 4, a random
  adapter), each from its captured graphs and eagerly.

Random weights neither copy their prompt nor decode the same in two kernels (bf16 rounding
differences after 32 random layers flip near-tied argmaxes), so e2e first turns the dummy model
into a *cycle model*: every layer's ``o_proj`` and ``down_proj`` are zeroed (a step still reads
every weight and does every product: the same cost), so a token's final hidden state is its
normed embedding; and for ``--prompt-len / 2``-token cycles of random tokens, one per request,
the head row of each cycle token's successor is set to that state, scaled to win by a margin of
8. The greedy output of a prompt that holds a cycle is that cycle, repeated: a model that
repeats its input, with a wide argmax margin (outputs with and without speculation are equal).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from engine.api.speculative import Draft, Proposer
from engine.config import ServerConfig
from engine.runtime.batch import ForwardMode
from engine.runtime.model_runner import ModelRunner
from engine.testing.batches import BatchBuilder

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = str(ROOT / "tests" / "data" / "llama3-8b-dummy")


def config(args: argparse.Namespace, max_running: int) -> ServerConfig:
    overrides = json.loads(args.model_override) if args.model_override else None
    return ServerConfig(model_path=MODEL_DIR, load_format="dummy", dtype=args.dtype,
                        device=args.device, skip_tokenizer_init=True,
                        attention_backend=args.attention_backend, page_size=16,
                        max_total_tokens=120_000, max_running_requests=max_running,
                        context_length=4096, random_seed=0,
                        json_model_override_args=json.dumps(overrides) if overrides else None)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Any, reps: int = 20) -> float:
    """Mean ms of ``fn()`` over ``reps`` calls (after 3 warm-up calls), the device drained
    before and after."""
    for _ in range(3):
        fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync()
    return (time.perf_counter() - t0) * 1e3 / reps


def verify_batch(bb: BatchBuilder, rows: list[int], width: int) -> Any:
    """A chain verify of ``width`` tokens per request, with its (causal) mask."""
    batch = bb.extend([(r, [11] * width) for r in rows], all_logits=True)
    batch.mode = ForwardMode.VERIFY
    batch.tree_mask = torch.ones(width, width, dtype=torch.bool,
                                 device=batch.input_ids.device).tril().repeat(len(rows), 1, 1)
    return batch


def cost(runner: ModelRunner, batches: list[int], widths: list[int], prompt_len: int
         ) -> list[dict[str, Any]]:
    vocab = runner.model_config.vocab_size
    gen = torch.Generator().manual_seed(7)
    out = []
    for bs in batches:
        bb = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
        rows = [bb.new_request() for _ in range(bs)]
        for r in rows:
            runner.forward(bb.extend([(r, torch.randint(0, vocab, (prompt_len,),
                                                        generator=gen).tolist())]))
        decode = bb.decode([(r, 5) for r in rows])
        dec_ms = timed(lambda: runner.forward(decode))
        out.append({"batch": bs, "width": 1, "graph_ms": dec_ms, "eager_ms": None,
                    "vs_decode": 1.0})
        for w in widths:
            t0 = time.perf_counter()
            runner.capture_verify_graphs(w)  # the first of a width compiles its kernels too
            capture_s = time.perf_counter() - t0
            batch = verify_batch(bb, rows, w)
            replayed = any(g.size_for(batch) for g in runner.verify_graphs)
            g_ms = timed(lambda: runner.forward(batch)) if replayed else None
            e_ms = timed(lambda: runner._forward(batch))
            best = g_ms if g_ms is not None else e_ms
            out.append({"batch": bs, "width": w, "graph_ms": g_ms, "eager_ms": e_ms,
                        "vs_decode": best / dec_ms, "capture_s": capture_s})
        for r in rows:
            bb.free(r)
    runner.verify_graphs = []
    return out


def make_cycles(runner: ModelRunner, count: int, length: int, gen: torch.Generator
                ) -> list[list[int]]:
    """Turn the model into the cycle model (module docstring); returns the cycles."""
    m = runner.model
    for layer in m.model.layers:
        layer.self_attn.o_proj.weight.data.zero_()
        layer.mlp.down_proj.weight.data.zero_()
    vocab = runner.model_config.vocab_size
    ids = torch.randperm(vocab, generator=gen)[:count * length].view(count, length)
    with torch.inference_mode():
        flat = ids.flatten().to(runner.device)
        x = m.model.norm(m.model.embed_tokens(flat)).float()  # [count * length, hidden]
        head = m.lm_head.weight
        top = torch.cat([(xs @ head.float().T).max(-1).values for xs in x.split(256)])
        succ = ids.roll(-1, dims=1).flatten().to(runner.device)
        head.data[succ] = (x * ((top + 8.0) / (x * x).sum(-1))[:, None]).to(head.dtype)
    return ids.tolist()


def phases(sched: Any) -> dict[str, float]:
    """Mean wall ms per step by phase of the scheduler's step timer (cleared)."""
    timer = sched.timer
    steps = max(1, getattr(timer, "_steps", 0))
    out = {k: w / steps * 1e3 for k, (w, _) in getattr(timer, "_phases", {}).items()}
    if hasattr(timer, "_phases"):
        timer._phases, timer._modes, timer._steps = {}, {}, 0
    out["steps"] = steps
    return out


class Oracle(Proposer):
    """Drafts the next ``width - 1`` tokens of a known continuation."""

    drafts_trees = False

    def __init__(self, truth: dict[tuple[int, ...], list[int]], width: int) -> None:
        self.truth, self.num_draft_tokens = truth, width

    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        out = []
        for req in requests:
            full = self.truth.get(tuple(req.origin_input_ids), [])
            done = len(req.output_ids)
            out.append(Draft.chain(full[done:done + self.num_draft_tokens - 1]))
        return out

    def on_verified(self, request: Any, accepted: int) -> None:
        pass

    def release(self, request: Any) -> None:
        pass


class _Detok:
    def add(self, t: int) -> str:
        return ""

    def finish(self) -> str:
        return ""


def generate(sched: Any, prompts: list[list[int]], max_new: int) -> dict[str, Any]:
    from engine.runtime.request import Req
    from engine.runtime.sampling import SamplingParams

    times: dict[int, list[tuple[float, int]]] = {k: [] for k in range(len(prompts))}
    tokens: dict[int, list[int]] = {k: [] for k in range(len(prompts))}
    reqs = []
    for k, p in enumerate(prompts):
        def sink(o: Any, k: int = k) -> None:
            tokens[k].extend(o.token_ids)
            times[k].append((time.perf_counter(), len(tokens[k])))
        params = SamplingParams(temperature=0.0, max_new_tokens=max_new,
                                ignore_eos=True).validate()
        reqs.append(Req(rid=f"r{k}", origin_input_ids=p, sampling_params=params, sink=sink,
                        detokenizer=_Detok(), max_new_tokens=max_new, stop_ids=frozenset()))
    sched.submit(reqs)
    phases(sched)
    while sched.step():
        pass
    _sync()
    steps = phases(sched)
    sched.flush_cache()
    sched.step()
    first = [t[0][0] for t in times.values()]
    last = [t[-1][0] for t in times.values()]
    rates = [(len(tokens[k]) - times[k][0][1]) / (last[k] - first[k]) for k in times]
    made = sum(len(tokens[k]) - times[k][0][1] for k in times)
    return {"tokens": {tuple(p): tokens[k] for k, p in enumerate(prompts)},
            "rate": made / (max(last) - min(first)), "per_request": statistics.median(rates),
            "phases": steps}


def e2e(runner: ModelRunner, batches: list[int], prompt_len: int, max_new: int
        ) -> list[dict[str, Any]]:
    from engine.assembly import Assembly
    from engine.runtime.scheduler import Scheduler
    from engine.runtime.speculative import SpecDecoder

    vocab = runner.model_config.vocab_size
    gen = torch.Generator().manual_seed(11)
    cycles = make_cycles(runner, max(batches), prompt_len // 2, gen)
    rows = []
    ngram_cfg = runner.config.replace(speculative_algorithm="NGRAM")
    ngram = Assembly(ngram_cfg).speculative(runner)
    width = ngram.width
    for bs in batches:
        work = {"repeat": [c[k:] + c[:k] + c[k:] + c[:k]
                           for k, c in zip(torch.randint(0, len(cycles[0]), (bs,),
                                                         generator=gen).tolist(), cycles)],
                "random": [torch.randint(0, vocab, (prompt_len,), generator=gen).tolist()
                           for _ in range(bs)]}
        for name, prompts in work.items():
            plain = generate(Scheduler(runner.config, runner), prompts, max_new)
            rows.append({"batch": bs, "workload": name, "engine": "plain",
                         "tok_s": plain["rate"], "req_tok_s": plain["per_request"],
                         "speedup": 1.0, "accept": None, "same": 1.0,
                         "phases": plain["phases"]})
            engines = {"ngram": ngram,
                       "oracle": SpecDecoder(Oracle(plain["tokens"], width), runner)}
            for eng, spec in engines.items():
                spec.stats.__init__()
                res = generate(Scheduler(ngram_cfg, runner, speculative=spec), prompts,
                               max_new)
                st = spec.stats
                same = sum(res["tokens"][k] == v for k, v in plain["tokens"].items())
                rows.append({"batch": bs, "workload": name, "engine": eng,
                             "tok_s": res["rate"], "req_tok_s": res["per_request"],
                             "speedup": res["rate"] / plain["rate"],
                             "accept": st.accepted_tokens / max(1, st.verified_requests),
                             "tokens_per_verify": st.accept_length,
                             "same": same / len(prompts), "phases": res["phases"]})
    return rows


def _drafting(runner: ModelRunner, cfg: ServerConfig, spec: Any, propose: Any, prompts: list,
              max_new: int) -> None:
    """A greedy run of ``prompts`` whose proposer drafts through ``propose`` (a wrapper)."""
    from engine.runtime.scheduler import Scheduler

    p = spec.proposer
    real, p.propose = p.propose, propose
    try:
        generate(Scheduler(cfg, runner, speculative=spec), prompts, max_new)
    finally:
        p.propose = real


def _median_ms(times: list[float]) -> float:
    return statistics.median(times[2:] or times) * 1e3  # (the first steps capture graphs)


@contextlib.contextmanager
def _no_graphs(*owners: tuple[Any, str]) -> Any:
    """Within the block, the attributes named (``(object, name)``) hold ``None``."""
    saved = [(o, n, getattr(o, n, None)) for o, n in owners]
    for o, n, _ in saved:
        setattr(o, n, None)
    try:
        yield
    finally:
        for o, n, v in saved:
            setattr(o, n, v)


def _compare(runner: ModelRunner, cfg: ServerConfig, spec: Any, label: str,
             batches: list[int], prompts: Any, max_new: int, save: Any, load: Any, eager: Any,
             alone: Any = None) -> list[dict[str, Any]]:
    """Per batch size, a greedy run in which every verify step drafts from the graphs, then,
    from the same state (``load(save())``), with them off (``eager()``, a context), then (if
    given) ``alone(requests)``; the medians, and the share of steps whose drafts agreed."""
    real = spec.proposer.propose
    rows = []
    for bs in batches:
        times: dict[str, list[float]] = {"graphs": [], "batched": [], "alone": []}
        same: list[bool] = []

        def timed(reqs: Sequence[Any]) -> list[Draft]:
            state = save()
            _sync()
            t0 = time.perf_counter()
            drafts = real(reqs)
            _sync()
            t1 = time.perf_counter()
            load(state)
            with eager():
                again = real(reqs)
            _sync()
            t2 = time.perf_counter()
            same.append([d.token_ids for d in drafts] == [d.token_ids for d in again])
            times["graphs"].append(t1 - t0)
            times["batched"].append(t2 - t1)
            if alone is not None:
                alone(reqs)
                _sync()
                times["alone"].append(time.perf_counter() - t2)
            return drafts

        _drafting(runner, cfg, spec, timed, prompts(bs), max_new)
        rows.append({"batch": bs, "algo": label, "steps": len(times["graphs"]),
                     "same": sum(same) / len(same),
                     **{k: _median_ms(v) if v else float("nan") for k, v in times.items()}})
    return rows


def _row_state(p: Any) -> tuple[Any, Any]:
    """save/load of a proposer's row cache: its verified lengths (a row new in the first
    draft holds nothing yet)."""
    def load(fed: dict[int, int]) -> None:
        for r in p.rows.fed:
            p.rows.fed[r] = fed.get(r, 0)
    return (lambda: dict(p.rows.fed)), load


def draft_cost(runner: ModelRunner, batches: list[int], prompt_len: int, max_new: int = 24
               ) -> list[dict[str, Any]]:
    """Draft time per verify step with random drafts of the model's shape. EAGLE3 (3 steps,
    top-1, and an EAGLE-2 tree of 4 steps, top-4, 16 nodes): every request at once replaying
    captured graphs; the same without graphs; each request alone, eagerly (the reference
    path). Then a one-layer DFLASH draft (blocks of 8) and UNO (a block of 4, a random rank-8
    adapter on the noise rows: a forward of the target), from their graphs and eagerly. Each
    step drafts every way from the same state."""
    import tempfile

    from engine.assembly import Assembly

    mc = runner.model_config
    gen = torch.Generator().manual_seed(5)

    def prompts(bs: int) -> list[list[int]]:
        return [torch.randint(0, mc.vocab_size, (prompt_len,), generator=gen).tolist()
                for _ in range(bs)]

    shape = {"hidden_size": mc.hidden_size, "intermediate_size": mc.intermediate_size,
             "num_hidden_layers": 1, "num_attention_heads": mc.num_attention_heads,
             "num_key_value_heads": mc.num_key_value_heads, "head_dim": mc.head_dim,
             "rms_norm_eps": 1e-5}
    head = tempfile.mkdtemp(prefix="eagle3-head-")
    Path(head, "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], **shape, "vocab_size": mc.vocab_size,
        "draft_vocab_size": min(32000, mc.vocab_size)}))
    out = []
    for label, (steps, topk, width) in (("EAGLE3", (3, 1, 4)),
                                        ("EAGLE3 tree", (4, 4, 16))):
        cfg = runner.config.replace(
            speculative_algorithm="EAGLE3", speculative_draft_model_path=head,
            speculative_draft_load_format="dummy", speculative_num_steps=steps,
            speculative_eagle_topk=topk, speculative_num_draft_tokens=width)
        spec = Assembly(cfg).speculative(runner)
        p = spec.proposer
        out += _compare(runner, cfg, spec, label, batches, prompts, max_new, *_row_state(p),
                        lambda p=p: _no_graphs((p, "graphs"), (p, "tree_graphs")),
                        alone=lambda reqs, p=p: [p._propose(r) for r in reqs])
    draft = tempfile.mkdtemp(prefix="dflash-draft-")
    n = mc.num_hidden_layers
    Path(draft, "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], **shape, "block_size": 8,
        "dflash_config": {"target_layer_ids": sorted({min(1, n - 1), n // 2, max(n - 2, 0)}),
                          "mask_token_id": 0}}))
    cfg = runner.config.replace(speculative_algorithm="DFLASH",
                                speculative_draft_model_path=draft,
                                speculative_draft_load_format="dummy")
    spec = Assembly(cfg).speculative(runner)
    p = spec.proposer
    out += _compare(runner, cfg, spec, "DFLASH", batches, prompts, max_new, *_row_state(p),
                    lambda: _no_graphs((p, "graphs")))
    runner.model.feature_sink = None
    runner.verify_graphs = []
    if runner.decode_graphs is not None:
        runner.decode_graphs = runner._make_decode_graphs()
    cfg = runner.config.replace(speculative_algorithm="UNO", speculative_num_draft_tokens=4,
                                speculative_draft_load_format="dummy")
    spec = Assembly(cfg).speculative(runner)
    p = spec.proposer

    @contextlib.contextmanager
    def no_block_graphs() -> Any:
        saved = dict(runner._block_graphs)
        runner._block_graphs.update({k: (None, a) for k, (_, a) in saved.items()})
        try:
            yield
        finally:
            runner._block_graphs.update(saved)

    out += _compare(runner, cfg, spec, "UNO", batches, prompts, max_new, p._gen.get_state,
                    p._gen.set_state, no_block_graphs)
    runner.verify_graphs = []
    return out


def profile(runner: ModelRunner, prompt_len: int, width: int = 4) -> None:
    """Kernel time per replay of a batch-1 decode step and a verify of ``width`` tokens."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    bb = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    row = bb.new_request()
    runner.forward(bb.extend([(row, [3] * prompt_len)]))
    runner.capture_verify_graphs(width)
    batches = {"decode": bb.decode([(row, 5)]), f"verify {width}": verify_batch(bb, [row], width)}
    for name, batch in batches.items():
        timed(lambda: runner.forward(batch), reps=3)
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                runner.forward(batch)
            _sync()
        kernels: dict[str, list[float]] = {}
        for ev in prof.events():
            if ev.device_type.name == "CUDA":
                k = kernels.setdefault(ev.name[:70], [0.0, 0])
                k[0] += ev.device_time / 10
                k[1] += 1 / 10
        total = sum(v[0] for v in kernels.values())
        print(f"\n{name}: {total / 1e3:.2f} ms of kernels per replay")
        print("| kernel | calls | us per replay |\n|---|---|---|")
        for k, (us, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:14]:
            print(f"| {k} | {n:.0f} | {us:.0f} |")
    bb.free(row)


def main() -> None:
    os.environ.setdefault("ENGINE_STEP_TIMING", str(10**9))  # the schedulers' step phases
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--widths", default="2,4,8,12,16")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--skip", default="")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--attention-backend", default="triton")
    ap.add_argument("--model-override", default="",
                    help="JSON over the model config (a smaller model for a smoke run)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    skip = set(args.skip.split(","))
    t0 = time.monotonic()
    runner = ModelRunner(config(args, max(batches)))
    where = torch.cuda.get_device_name() if runner.device.type == "cuda" else "cpu"
    print(f"loaded in {time.monotonic() - t0:.1f} s; {where}", flush=True)
    result: dict[str, Any] = {}
    if "cost" not in skip:
        rows = cost(runner, batches, [int(w) for w in args.widths.split(",")], args.prompt_len)
        result["cost"] = rows
        print("\n| batch | tokens per request | graph ms | eager ms | vs decode step | "
              "capture s |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            g = f"{r['graph_ms']:.2f}" if r["graph_ms"] is not None else "-"
            e = f"{r['eager_ms']:.2f}" if r["eager_ms"] is not None else "-"
            c = f"{r['capture_s']:.1f}" if "capture_s" in r else "-"
            label = "1 (decode)" if r["width"] == 1 else str(r["width"])
            print(f"| {r['batch']} | {label} | {g} | {e} | {r['vs_decode']:.2f}x | {c} |",
                  flush=True)
    if "e2e" not in skip:
        rows = e2e(runner, batches, args.prompt_len, args.max_new)
        result["e2e"] = rows
        print("\n| batch | workload | engine | batch tok/s | request tok/s (median) | speed-up "
              "| accepted / verify | tokens / verify | same output |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            acc = f"{r['accept']:.2f}" if r["accept"] is not None else ""
            tpv = f"{r['tokens_per_verify']:.2f}" if r.get("tokens_per_verify") else ""
            print(f"| {r['batch']} | {r['workload']} | {r['engine']} | {r['tok_s']:.0f} | "
                  f"{r['req_tok_s']:.0f} | {r['speedup']:.2f}x | {acc} | {tpv} | "
                  f"{r['same']:.0%} |", flush=True)
        names = sorted({k for r in rows for k in r["phases"] if k != "steps"})
        print("\n| batch | workload | engine | steps | " + " | ".join(names) + " |")
        print("|---|---|---|---|" + "---|" * len(names))
        for r in rows:
            ph = r["phases"]
            print(f"| {r['batch']} | {r['workload']} | {r['engine']} | {ph['steps']} | "
                  + " | ".join(f"{ph.get(k, 0.0):.2f}" for k in names) + " |", flush=True)
    if "profile" not in skip:
        profile(runner, args.prompt_len)
    if "draft" not in skip:
        rows = draft_cost(runner, batches, args.prompt_len)
        result["draft"] = rows
        print("\n| algorithm | batch | draft ms per verify step: batched, graphs | "
              "batched, eager | per request, eager | graphs draft as eager |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['algo']} | {r['batch']} | {r['graphs']:.2f} | {r['batched']:.2f} | "
                  f"{r['alone']:.2f} | {r['same']:.0%} |", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "spec_gpu.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
