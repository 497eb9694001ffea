"""Where a prefill step's time goes on a GPU, and how much of it does not scale with the tokens:
the dummy Llama-3-8B shape through our ModelRunner, three kinds of extend step, each timed as
the server runs it (the forward, then the sampled token read back):

* ``recompute``: ``--prefix + --new`` tokens from scratch (a cache miss);
* ``hit``: ``--new`` tokens over a cached ``--prefix`` (a prefix-cache hit);
* ``small``: ``--small`` tokens over the same prefix (what a step costs with almost no work).

For each it prints the wall time (median of ``--rounds``), the host time until the forward
call returned (the launches; close to the wall time means the host, not the GPU, sets the
pace), the summed kernel time from torch.profiler (the rest of the wall time is gaps between
kernels) and the number of kernels (host time per kernel launched), the achieved TFLOP/s of
the linear layers, and the host synchronizations inside the
forward with their call sites (``torch.cuda.set_sync_debug_mode``): a synchronization between
layers stops the host from queueing ahead, so every launch after it is paid in full.

    python3 benchmarks/profile_extend_gpu.py [--prefix 1920] [--new 540] [--small 16]
        [--backend triton] [--page-size 64] [--rounds 5] [--model-dir DIR] [--host-profile N]
        [--modes graphs,eager] [--kernels N]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import time
import traceback
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_gpu import MODEL_DIR, make_runner  # noqa: E402

from engine.runtime.model_runner import ModelRunner  # noqa: E402
from engine.testing.batches import BatchBuilder  # noqa: E402


def linear_flops_per_token(runner: ModelRunner) -> float:
    """2 x the parameters of the layers' linear products (the head runs on one row a request)."""
    n = 0
    for name, p in runner.model.named_parameters():
        if p.dim() == 2 and ".layers." in name:
            n += p.numel()
    return 2.0 * n


class SyncLog:
    """Host synchronizations reported by ``torch.cuda.set_sync_debug_mode('warn')``, by the
    engine frame that asked for them."""

    def __init__(self) -> None:
        self.sites: collections.Counter[str] = collections.Counter()

    def __enter__(self) -> "SyncLog":
        self._show = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            frames = [f for f in traceback.extract_stack()[:-1]
                      if "/engine" in f.filename or "/plugins/" in f.filename]
            where = (f"{os.path.relpath(frames[-1].filename)}:{frames[-1].lineno} "
                     f"({frames[-1].name})" if frames else f"{filename}:{lineno}")
            self.sites[f"{str(message).splitlines()[0][:60]} at {where}"] += 1

        warnings.showwarning = show
        warnings.simplefilter("always")
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: object) -> None:
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._show


class HostProfile:
    """cProfile over the timed forward: where the host's launch time goes, by function and by
    package (triton's launcher, torch's Python, the engine, C calls such as the launches)."""

    def __init__(self) -> None:
        import cProfile

        self.prof = cProfile.Profile()

    def __enter__(self) -> "HostProfile":
        self.prof.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        self.prof.disable()

    def report(self, kind: str, top: int) -> list[str]:
        import pstats

        stats = pstats.Stats(self.prof).stats  # (file, line, fn) -> (cc, nc, tt, ct, callers)
        total = sum(v[2] for v in stats.values()) or 1e-9
        groups: collections.Counter[str] = collections.Counter()
        for (file, _, _), v in stats.items():
            g = ("triton" if "/triton/" in file else "torch" if "/torch/" in file
                 else "engine" if "/engine/" in file or "/plugins/" in file
                 else "C calls" if file == "~" else "other")
            groups[g] += v[2]
        lines = [f"  {kind}: host {total * 1e3:.2f} ms under cProfile: " + ", ".join(
            f"{g} {t * 1e3:.2f}" for g, t in groups.most_common())]
        rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
        for (file, line, fn), (_, nc, tt, ct, _) in rows:
            where = fn if file == "~" else f"{'/'.join(file.split('/')[-2:])}:{line} {fn}"
            lines.append(f"    {tt * 1e3:7.2f} ms self {ct * 1e3:7.2f} ms cum {nc:5d} calls  "
                         f"{where}")
        return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=1920)
    ap.add_argument("--new", type=int, default=540)
    ap.add_argument("--small", type=int, default=16)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model-dir", default=MODEL_DIR)
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="a tiny random Llama on the CPU (torch_native): the script's own check")
    ap.add_argument("--modes", default="graphs,eager",
                    help="graphs: the runner's forward (breakable prefill graphs where the step "
                    "fits); eager: the eager forward")
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="also print each step's N costliest kernels (summed by name)")
    ap.add_argument("--host-profile", type=int, default=0, metavar="N",
                    help="also run each step under cProfile and print its N costliest functions")
    args = ap.parse_args()

    device, vocab = "cuda", 32000
    if args.cpu_smoke:
        import tempfile

        from transformers import LlamaConfig

        args.model_dir, args.backend, device, vocab = tempfile.mkdtemp(), "torch_native", "cpu", 512
        LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                    max_position_embeddings=8192).save_pretrained(args.model_dir)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    total = args.prefix + args.new
    runner = make_runner(args.backend, 4, model_dir=args.model_dir, page_size=args.page_size,
                         max_total_tokens=4 * total + 4096, device=device)
    bb = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    prefix_ids = ids(args.prefix)
    kinds = {"recompute": (0, args.prefix + args.new), "hit": (args.prefix, args.new),
             "small": (args.prefix, args.small)}

    def step(label: str, around=None) -> tuple[float, float]:
        """One step of ``label`` (kind, mode) on a fresh request: (wall ms, host ms until the
        forward returned); ``around``: a context manager entered for the timed part only."""
        kind, mode = label
        forward = runner.forward if mode == "graphs" else runner._forward
        pre, new = kinds[kind]
        row = bb.new_request()
        try:
            if pre:
                runner.forward(bb.extend([(row, prefix_ids[:pre])])).argmax(-1).tolist()
            batch = bb.extend([(row, ids(new))])
            sync()
            with around if around is not None else contextlib.nullcontext():
                t0 = time.perf_counter()
                logits = forward(batch)
                t1 = time.perf_counter()
                logits.argmax(-1).tolist()  # the sampled token read back, as the server does
                t2 = time.perf_counter()
                sync()
            return (t2 - t0) * 1e3, (t1 - t0) * 1e3
        finally:
            bb.free(row)

    from torch.profiler import ProfilerActivity, profile

    graphs = runner.prefill_graphs
    modes = [m for m in args.modes.split(",") if m != "graphs" or graphs is not None]
    labels = [(kind, mode) for kind in kinds for mode in modes]
    for label in labels:  # warm-up: every kernel variant built
        step(label)
        step(label)
    flops = linear_flops_per_token(runner)
    rows, host_lines, kernel_lines = [], [], []
    for label in labels:
        kind = label[0]
        walls, hosts = zip(*(step(label) for _ in range(args.rounds)))
        syncs = SyncLog()
        step(label, around=syncs)
        prof = profile(activities=[ProfilerActivity.CUDA if device == "cuda"
                                   else ProfilerActivity.CPU])
        step(label, around=prof)
        cuda_events = [ev for ev in prof.events()
                       if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0]
        kern = sum(ev.device_time for ev in cuda_events)
        if args.kernels:
            by_name: collections.defaultdict[str, list[float]] = collections.defaultdict(list)
            for ev in cuda_events:
                by_name[ev.name[:70]].append(ev.device_time)
            kernel_lines.append(f"  {' '.join(label)}: {kern / 1000:.2f} ms of kernels")
            for name, ts in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:args.kernels]:
                kernel_lines.append(f"    {sum(ts) / 1000:7.3f} ms {len(ts):5d} x "
                                    f"{sum(ts) / len(ts):8.1f} us  {name}")
        if args.host_profile:
            hp = HostProfile()
            step(label, around=hp)
            host_lines.extend(hp.report(" ".join(label), args.host_profile))
        wall, host = statistics.median(walls), statistics.median(hosts)
        pre, new = kinds[kind]
        rows.append((" ".join(label), pre, new, wall, host, kern / 1000, len(cuda_events),
                     flops * new / (wall * 1e-3) / 1e12, syncs))

    print(f"{args.backend}, page {args.page_size}, {args.rounds} rounds (median); linear "
          f"layers {flops / 2e6:.1f} M parameters")
    if graphs is not None:
        print(f"breakable prefill graphs: {len(graphs.buckets)} token counts up to "
              f"{graphs.max_tokens}, captured in "
              f"{runner.startup_seconds.get('prefill graphs', 0):.1f} s "
              "('graphs' rows replay them where the step fits; 'eager' rows run the forward "
              "eagerly)")
    print("| step | prefix | new tokens | wall ms | host ms until the forward returned | "
          "kernels ms | kernels | µs of host per kernel | linear TFLOP/s over the wall | "
          "host syncs in the forward |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind, pre, new, wall, host, kern, n, tf, syncs in rows:
        print(f"| {kind} | {pre} | {new} | {wall:.2f} | {host:.2f} | {kern:.2f} | {n} | "
              f"{1000 * host / max(n, 1):.1f} | {tf:.0f} | {sum(syncs.sites.values())} |")
    for kind, *_, syncs in rows:
        for site, n in syncs.sites.most_common(12):
            print(f"  {kind}: {n} x {site}")
    print("\n".join(kernel_lines))
    print("\n".join(host_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
