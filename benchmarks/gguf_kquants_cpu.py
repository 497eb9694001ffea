"""Batch-1 matmuls straight from GGUF K-quant blocks (the gguf plugin's kquants.c) next to
torch's ``F.linear`` on the same weight dequantized to float32, same run, taking turns in
chunks of calls, medians of many rounds (the machine may be shared and noisy).

Shapes are [out, in] weights of SmolLM2-135M's MLP widths (hidden 576, MLP 1536). K-quant rows
hold 256-value super-blocks, so ``in`` must be a multiple of 256: the down projection
576x1536 is exact; the up projection's 1536x576 cannot be a K-quant (llama.cpp stores those
tensors in another type), so 1536x768 stands for it. ``--large`` adds a 4096x4096 weight
(Llama-3-8B's attention width) whose blocks no longer sit in the L2 cache.

GB/s is the bytes of weight read per call (the blocks; the float32 weight for F.linear) over
the median time. Q4_0 and Q8_0 rows (kernels.c, blocks of 32) are there for reference.

    python benchmarks/gguf_kquants_cpu.py [--rounds 400] [--threads N] [--large]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

SHAPES = [(576, 1536), (1536, 768)]
#: byte offsets of the fp16 super-block scale (and minimum scale) in each type's block
FP16_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
               "Q6_K": (208,), "Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,)}


def random_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> torch.Tensor:
    """Random but valid rows: random code and sub-block scale bytes, small fp16 scales."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    nb = cols // block
    raw = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)
    for off in FP16_FIELDS[qtype]:
        scale = rng.uniform(1e-4, 1e-3, size=(rows, nb)).astype(np.float16)
        raw[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, nb, 2)
    return torch.from_numpy(raw.reshape(rows, -1))


def timed(fns: dict[str, object], rounds: int, chunk: int = 25) -> dict[str, float]:
    """Median seconds per call of each function. The functions take turns in chunks of
    ``chunk`` calls (not call by call: MKL's and the kernels' OpenMP workers would then keep
    waking into each other's spin-waits on a small machine)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(max(1, rounds // chunk)):
        for name, fn in fns.items():
            for _ in range(5):
                fn()
            for _ in range(chunk):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--threads", type=int, default=0, help="torch (and kernel) threads; 0: "
                    "torch's default")
    ap.add_argument("--large", action="store_true", help="also a 4096x4096 weight")
    args = ap.parse_args()
    from engine_quant_gguf import kernels

    if args.threads:
        torch.set_num_threads(args.threads)
    lib = kernels.library()
    path = {2: "AVX512-VNNI", 1: "AVX-VNNI", 0: "AVX2"}[lib.engine_gguf_kq_path()]
    shapes = SHAPES + ([(4096, 4096)] if args.large else [])
    print(f"kquants.c path: {path}; threads: {torch.get_num_threads()}; rounds: {args.rounds} "
          "(medians); batch 1")
    print(f"| type | weight [out, in] | blocks KiB | kernel ms | kernel GB/s | F.linear fp32 ms "
          f"| F.linear GB/s | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for n, k in shapes:
        x = torch.randn(1, k)
        # for reference, kernels.c's blocks of 32 (int8 activations where it has them)
        others = {q: kernels.QTYPES[q] for q in ("Q4_0", "Q8_0")}
        for qtype, qid in {**kernels.KQTYPES, **others}.items():
            blocks = random_blocks(qtype, n, k, rng)
            dense = kernels.dequantize(qid, blocks, n, k)
            out = torch.empty(1, n)
            mm = getattr(kernels, "matmul_q8", kernels.matmul)
            t = timed({"kernel": lambda: mm(qid, blocks, n, x, out=out),
                       "dense": lambda: F.linear(x, dense)}, args.rounds)
            kb, db = blocks.numel(), dense.numel() * 4
            print(f"| {qtype} | {n}x{k} | {kb / 1024:.0f} | {t['kernel'] * 1e3:.4f} "
                  f"| {kb / t['kernel'] / 1e9:.1f} | {t['dense'] * 1e3:.4f} "
                  f"| {db / t['dense'] / 1e9:.1f} | {t['dense'] / t['kernel']:.1f}x |")


if __name__ == "__main__":
    main()
