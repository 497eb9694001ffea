"""CPU decode at batch 1 against this machine's memory roofline.

A batch-1 decode step reads every weight of the model once (the default model: the file's
Q4_1 / Q8_0 blocks as the gguf plugin keeps them, head included) and every layer's K and V rows
of the context. This script adds those bytes up from the loaded model, measures the rate at
which the process's threads read memory (a float32 sum over ``--probe-mib`` of memory like the
weights', the best of five; on a shared machine it moves with the neighbours), and prints the
step time that rate allows next to the measured one (median of ``--steps`` steps through
``ModelRunner``, after one prompt of each context length).

    python benchmarks/decode_roofline_cpu.py [--contexts 64,1500] [--steps 60] [--probe-mib 1024]
        [--quantization unquant] [--ab VAR=VALUE --rounds 4]

``--ab VAR=VALUE`` compares an environment setting read while the model loads: two runners in
this process, built with and without it, their steps alternating (``--rounds`` blocks).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a forward reads for the linear layers' weights (gguf blocks or panels, or the
    dense weight) and the norms; the embedding is read one row a token, so it is left out."""
    total = 0
    for name, module in model.named_modules():
        blocks, parts = getattr(module, "gguf_blocks", None), getattr(module, "gguf_parts", None)
        if blocks is not None:
            total += blocks.nbytes
        elif parts:
            total += sum(data.nbytes for *_, data in parts)
        elif isinstance(getattr(module, "weight", None), torch.Tensor) \
                and not name.endswith("embed_tokens") and module.weight.device.type == "cpu":
            total += module.weight.nbytes
    return total


def read_rate(mib: int) -> float:
    """Bytes per second the intra-op threads read (a float32 sum, the best of five) from
    memory like the weights' (:func:`engine.api.native.weight_buffer`)."""
    from engine.api.native import weight_buffer

    x = weight_buffer((mib * 1024 * 1024 // 4,), torch.float32).fill_(1.0)
    best = float("inf")
    for _ in range(6):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.nbytes / best


#: the prompts' text (cut to each context's token count)
TEXT = "The history of the city begins with a small settlement on the river, " * 400


def make_runner(args: argparse.Namespace, contexts: list[int]):
    """The default model's runner for these contexts (``--quantization`` as serve's)."""
    from engine.config import ServerConfig
    from engine.runtime.model_runner import ModelRunner

    return ModelRunner(ServerConfig(device="cpu", dtype="float32",
                                    max_total_tokens=max(contexts) + args.steps + 64,
                                    attention_backend="torch_native",
                                    quantization=args.quantization))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="64,1500")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--probe-mib", type=int, default=1024)
    ap.add_argument("--quantization", default=None,
                    help="as engine serve's (unquant: the file dequantized to float32)")
    ap.add_argument("--ab", default=None, help="VAR=VALUE: with against without, alternating")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    if args.ab:
        return compare(args)

    from engine.testing.batches import BatchBuilder

    contexts = [int(c) for c in args.contexts.split(",")]
    runner = make_runner(args, contexts)
    pool = runner.pool
    weights = weight_bytes(runner.model)
    kv_row = 2 * pool.num_kv_heads * pool.head_dim * pool.k[0].element_size()  # K and V, a token
    rate = read_rate(args.probe_mib)
    tokens = runner.tokenizer.encode(TEXT)
    builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    print(f"threads={torch.get_num_threads()} weights read a step: {weights / 1e6:.1f} MB; "
          f"memory read rate {rate / 1e9:.1f} GB/s (sum over {args.probe_mib} MiB)")
    print("| context | MB read a step | roofline ms | measured ms/step | of the roofline |")
    print("|---|---|---|---|---|")
    for ctx in contexts:
        row = builder.new_request()
        logits = runner.forward(builder.extend([(row, tokens[:ctx])]))
        token = int(logits.argmax(-1))
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            logits = runner.forward(builder.decode([(row, token)]))
            token = int(logits.argmax(-1))
            times.append(time.perf_counter() - t0)
        builder.free(row)
        step = statistics.median(times[2:])
        # the mean context over the steps, every layer's K and V rows
        kv = pool.num_layers * kv_row * (ctx + args.steps / 2)
        total = weights + kv
        print(f"| {ctx} | {total / 1e6:.1f} | {total / rate * 1e3:.2f} | {step * 1e3:.2f} | "
              f"{total / rate / step * 100:.0f} % |", flush=True)


def compare(args: argparse.Namespace) -> None:
    """Two runners of the default model in this process, the first built with ``args.ab`` set
    in the environment, the second without; their decode steps alternate (the same machine
    state for both), ``--rounds`` blocks of ``--steps`` steps at each context."""
    from engine.testing.batches import BatchBuilder

    var, _, value = args.ab.partition("=")
    contexts = [int(c) for c in args.contexts.split(",")]
    saved = os.environ.get(var)
    runners = {}
    for side in (f"{var}={value}", "without"):
        if side == "without":
            os.environ.pop(var, None)
            if saved is not None:
                os.environ[var] = saved
        else:
            os.environ[var] = value
        runners[side] = make_runner(args, contexts)
    tokens = next(iter(runners.values())).tokenizer.encode(TEXT)
    print(f"| round | context | {' | '.join(runners)} (ms/step, median) | ratio |")
    print("|---|---|---|---|---|")
    for r in range(args.rounds):
        for ctx in contexts:
            state = {}
            for side, runner in runners.items():
                builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots,
                                       runner.page_size)
                row = builder.new_request()
                logits = runner.forward(builder.extend([(row, tokens[:ctx])]))
                state[side] = [builder, row, int(logits.argmax(-1)), []]
            for _ in range(args.steps):
                for side, runner in runners.items():
                    builder, row, token, times = state[side]
                    t0 = time.perf_counter()
                    logits = runner.forward(builder.decode([(row, token)]))
                    state[side][2] = int(logits.argmax(-1))
                    times.append(time.perf_counter() - t0)
            ms = []
            for builder, row, _, times in state.values():
                builder.free(row)
                ms.append(statistics.median(times[2:]) * 1e3)
            print(f"| {r + 1} | {ctx} | {ms[0]:.2f} | {ms[1]:.2f} | {ms[0] / ms[1]:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
