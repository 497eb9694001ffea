"""Where a GPU decode step's time goes: the dummy Llama-3-8B shape through our ModelRunner (CUDA
graphs on), ``--steps`` decode steps under torch.profiler; prints the step's wall time, the sum
of its kernels' times (the rest is gaps between kernels), and a table of kernels by total time
(calls per step, µs per call, µs per step, achieved TB/s for the matrix products whose bytes are
known) next to the bandwidth roofline.

    python3 benchmarks/profile_decode_gpu.py [--batch 1] [--steps 20] [--backend triton]
        [--model-dir tests/data/qwen3-30b-a3b-dummy] [--quantization fp8] [--no-kernel-table]

With programmatic dependent launch each kernel starts early and its wait counts in its
duration, so the table splits the step only with ``ENGINE_PDL=0`` (the wall time is the one to
compare with PDL on). The second table splits it with PDL on: kernels in start order, what each
adds to the chain (its end minus the latest end before it), by (previous kernel, kernel).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_gpu import MODEL_DIR, make_runner  # noqa: E402

from engine.testing.batches import BatchBuilder  # noqa: E402

HBM_TBS = 4.8  # H200 spec; the measured copy bandwidth is ~4.3 (../shared/reference/gpu-h200.md)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--backend", default="triton")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--model-dir", default=MODEL_DIR,
                   help="a dummy model's config folder (default: the Llama-3-8B shape)")
    p.add_argument("--quantization", default=None,
                   help="a --quantization choice that quantizes the dummy weights at load "
                   "(e.g. fp8)")
    p.add_argument("--no-kernel-table", action="store_true",
                   help="print only the chain table")
    p.add_argument("--plain", action="store_true",
                   help="time the steps only, without torch.profiler (for a kernel profiler "
                   "such as Nsight Compute to read them)")
    args = p.parse_args()

    runner = make_runner(args.backend, max(args.batch, 4), args.quantization,
                         model_dir=args.model_dir)
    bb = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    gen = torch.Generator().manual_seed(0)
    rows = [bb.new_request() for _ in range(args.batch)]
    last = runner.forward(bb.extend([(r, torch.randint(0, 32000, (args.context,),
                                                       generator=gen).tolist())
                                     for r in rows])).argmax(-1).tolist()
    for _ in range(5):
        last = runner.forward(bb.decode(list(zip(rows, last)))).argmax(-1).tolist()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        last = runner.forward(bb.decode(list(zip(rows, last)))).argmax(-1).tolist()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1000 / args.steps
    if args.plain:
        print(f"batch {args.batch}, backend {args.backend}: step {wall:.3f} ms wall")
        return 0

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            last = runner.forward(bb.decode(list(zip(rows, last)))).argmax(-1).tolist()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = collections.defaultdict(list)
    spans = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            kernels[ev.name].append(ev.device_time)  # µs
            spans.append((ev.time_range.start, ev.time_range.end, ev.name))
    total = sum(sum(v) for v in kernels.values()) / args.steps
    mc = runner.model_config
    params = sum(t.numel() * t.element_size() for t in runner.model.parameters()
                 if t.device.type == "cuda")
    roof = params / (HBM_TBS * 1e12) * 1e3
    print(f"batch {args.batch}, backend {args.backend}: step {wall:.3f} ms wall; kernels "
          f"{total / 1000:.3f} ms per step ({100 * total / 1000 / wall:.0f} % of the step; the "
          f"rest is gaps and host); weights {params / 1e9:.2f} GB -> roofline {roof:.2f} ms at "
          f"{HBM_TBS} TB/s; {mc.num_hidden_layers} layers")
    print("| kernel | calls/step | µs/call | µs/step | share |")
    print("|---|---|---|---|---|")
    for name, times in sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[
            :0 if args.no_kernel_table else 30]:
        per_step = sum(times) / args.steps
        print(f"| {name[:90]} | {len(times) / args.steps:.1f} | {sum(times) / len(times):.1f} | "
              f"{per_step:.1f} | {100 * per_step / total:.1f} % |")
    chain_table(spans, args.steps)
    return 0


def short(name: str) -> str:
    return name.split("<")[0].split("(")[0][:48]


def chain_table(spans: list[tuple[float, float, str]], steps: int) -> None:
    """What each kernel adds to the step's chain: its end minus the latest end of the kernels
    started before it (0 when it ends inside them), summed by (previous kernel, kernel)."""
    spans.sort()
    added: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    latest, prev = None, "(start)"
    for start, end, name in spans:
        gap = end - latest if latest is not None else 0.0
        added[(prev, short(name))].append(max(0.0, gap))
        latest = end if latest is None else max(latest, end)
        prev = short(name)
    total = sum(sum(v) for v in added.values()) / steps
    print(f"\nthe chain: {total / 1000:.3f} ms a step (the profiled steps' span, idle time "
          "between graph replays included)")
    print("| previous kernel | kernel | calls/step | µs added a call | µs a step |")
    print("|---|---|---|---|---|")
    for (p, n), v in sorted(added.items(), key=lambda kv: -sum(kv[1]))[:24]:
        print(f"| {p} | {n} | {len(v) / steps:.1f} | {sum(v) / len(v):.2f} | "
              f"{sum(v) / steps:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
