"""The attention conformance kit on the GPU (eager steps, CUDA-graph replays for backends that
capture, speculative verify), per backend, with optional case filters; prints one line per
backend and the first failures.

    python3 benchmarks/attention_kit_gpu.py [--backends triton,flashinfer] [--page-sizes 16]
        [--gqa 4] [--head-dims 128]
"""

from __future__ import annotations

import argparse
import time

from engine.testing import attention as kit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="triton,flashinfer")
    ap.add_argument("--page-sizes", default="")
    ap.add_argument("--gqa", default="")
    ap.add_argument("--head-dims", default="")
    args = ap.parse_args()

    def ints(text: str, default):
        return tuple(int(x) for x in text.split(",") if x) or default

    bad = 0
    for name in [b for b in args.backends.split(",") if b]:
        t0 = time.perf_counter()
        failures = kit.check(name, kit.plugin_backend(name), "cuda",
                             page_sizes=ints(args.page_sizes, None),
                             gqa_ratios=ints(args.gqa, kit.GQA_RATIOS),
                             head_dims=ints(args.head_dims, kit.HEAD_DIMS))
        print(f"{name}: {'PASS' if not failures else f'{len(failures)} failures'} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        for f in failures[:8]:
            print("   ", f[:300])
        bad += bool(failures)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
