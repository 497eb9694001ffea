"""How fast one kernel can read N bytes on this GPU: the ceiling a matrix-vector product of
that many weight bytes could reach (it reads its weights once and writes almost nothing).

For each size (the decode step's products: dense bf16, 8-bit and 4-bit Llama-3-8B layers, the
Qwen3-30B-A3B sparse layer's experts), a Triton kernel streams the buffer (each program a
contiguous slice, UNROLL tiles of BLOCK 32-bit words in flight an iteration, xor-folded so the
loads stay) over a grid of launch shapes; the copies of the buffer (past the L2) are read one
after another in one CUDA graph, as a step runs its products, with programmatic dependent
launch (each kernel starts while the previous one finishes; it waits for it only before its
final store). The best launch per size is reported in TB/s, and its time against the size at
4.3 TB/s (the device-to-device copy rate measured on the H200).

    python3 benchmarks/read_gpu.py [--sizes-mb 8,16,25,34,50,75,117,235,1050]

Writes read_gpu.json to $OUT when set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.runtime.triton_pdl import launch_options, pdl_trigger, pdl_wait  # noqa: E402
from quant_gpu import replay_ms  # noqa: E402

BW = 4.3e12


@triton.jit
def _read(ptr, out_ptr, n_per, BLOCK: tl.constexpr, UNROLL: tl.constexpr, PDL: tl.constexpr):
    pdl_trigger(PDL)
    base = ptr + tl.program_id(0).to(tl.int64) * n_per
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in range(0, n_per, BLOCK * UNROLL):
        for u in tl.static_range(UNROLL):
            acc ^= tl.load(base + i + u * BLOCK + offs)
    pdl_wait(PDL)
    tl.store(out_ptr + tl.program_id(0) * BLOCK + offs, acc)


def time_reads(bufs: list[torch.Tensor], programs: int, block: int, unroll: int, warps: int,
               pdl: bool) -> float:
    """Seconds per read of one buffer, the buffers read in turn in one CUDA graph."""
    n = bufs[0].numel()
    n_per = n // programs
    out = torch.empty(programs * block, dtype=torch.int32, device="cuda")
    opts = launch_options(bufs[0].device) if pdl else {"PDL": False}

    def run():
        for b in bufs:
            _read[(programs,)](b, out, n_per, BLOCK=block, UNROLL=unroll, num_warps=warps,
                               **opts)

    return min(replay_ms(run, 10) for _ in range(3)) / 1e3 / len(bufs)


def buffers(words: int) -> list[torch.Tensor]:
    """Copies of a buffer of ``words`` 32-bit words, enough to be past the L2 together."""
    copies = max(2, int(-(-400e6 // (words * 4))))
    return [torch.randint(0, 1 << 30, (words,), dtype=torch.int32, device="cuda")
            for _ in range(copies)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="8,16,25,34,50,75,117,235,1050")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for mb in (float(s) for s in args.sizes_mb.split(",")):
        shapes = [(p * sms, b, u, w) for p in (1, 2, 4, 8, 16) for b in (512, 1024, 2048)
                  for u in (1, 4) for w in (4, 8)]
        scores = []
        for programs, block, unroll, warps in shapes:
            step = programs * block * unroll
            words = round(mb * 1e6 / 4 / step) * step  # whole iterations a program
            if not words or abs(words * 4 / (mb * 1e6) - 1) > 0.1:
                continue  # (a launch too wide for this size)
            bufs = buffers(words)
            t = time_reads(bufs, programs, block, unroll, warps, True)
            scores.append((words * 4 / t, t, words * 4, (programs, block, unroll, warps)))
            del bufs
        scores.sort(key=lambda s: -s[0])
        rate, t, nbytes, shape = scores[0]
        t_nopdl = time_reads(buffers(nbytes // 4), *shape, False)
        rows.append([mb, round(nbytes / 1e6, 1), round(t * 1e6, 2), round(rate / 1e12, 2),
                     f"{nbytes / BW / t:.0%}", round(nbytes / t_nopdl / 1e12, 2),
                     json.dumps(shape)])
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    print("\n| MB asked | MB read | us | TB/s (PDL) | of 4.3 TB/s | TB/s (no PDL) | "
          "launch (programs, BLOCK, UNROLL, warps) |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "read_gpu.json"), "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
