"""CPU decode speed: our ModelRunner next to transformers, same weights, same run.

Both sides: the default model (SmolLM2-135M-Instruct Q4_1 GGUF), greedy, float32 activations.
Ours: torch_native attention, extend then decode batches built as the scheduler would; once with
the default ``gguf`` quantization plugin (the file's blocks read directly, 8-bit activations,
the CPU decode plan) and once with ``--quantization unquant`` (weights dequantized to float32,
like transformers).
transformers: fp32, SDPA attention, its KV cache, one forward per step.
Prints batch-1 decode ms/token and batch-8 ms/step (median of the timed steps).

    python benchmarks/decode_cpu.py [--steps 32] [--prompt-len 64] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def ours(prompt: list[int], batch: int, steps: int, runner) -> float:
    from engine.testing.batches import BatchBuilder

    builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    rows = [builder.new_request() for _ in range(batch)]
    logits = runner.forward(builder.extend([(r, prompt) for r in rows]))
    tokens = logits.argmax(-1).tolist()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = runner.forward(builder.decode(list(zip(rows, tokens))))
        tokens = logits.argmax(-1).tolist()
        times.append(time.perf_counter() - t0)
    for r in rows:
        builder.free(r)
    return statistics.median(times[2:]) * 1000


def transformers_side(prompt: list[int], batch: int, steps: int, model) -> float:
    from transformers import DynamicCache

    ids = torch.tensor([prompt] * batch)
    cache = DynamicCache()
    with torch.inference_mode():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        tokens = out.logits[:, -1].argmax(-1, keepdim=True)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            out = model(input_ids=tokens, past_key_values=cache, use_cache=True)
            tokens = out.logits[:, -1].argmax(-1, keepdim=True)
            times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]) * 1000


#: llama.cpp on this machine class (Q4_1, 2 threads), measured earlier: ms/step (see
#: benchmarks/cpu_vs_llamacpp.py for a side-by-side run)
LLAMA_CPP = {1: "8-9.5", 8: "38-45"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from engine.config import ServerConfig
    from engine.runtime.model_runner import ModelRunner

    runners, loads = {}, {}
    slots = max(4096, 8 * (args.prompt_len + args.steps + 16))  # (batch 8's KV)
    for label, quant in (("gguf", None), ("unquant", "unquant")):
        t0 = time.perf_counter()
        runners[label] = ModelRunner(ServerConfig(device="cpu", dtype="float32",
                                                  max_total_tokens=slots, quantization=quant,
                                                  attention_backend="torch_native"))
        loads[label] = time.perf_counter() - t0
    runner = runners["gguf"]
    mc = runner.model_config
    t0 = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(mc.model_path, gguf_file=mc.gguf_file,
                                              dtype=torch.float32,
                                              attn_implementation="sdpa").eval()
    load_hf = time.perf_counter() - t0
    text = ("The history of the city begins with a small settlement on the river, "
            * (20 + args.prompt_len // 10))
    prompt = runner.tokenizer.encode(text)[: args.prompt_len]

    rows = []
    for batch in (1, 8):
        a = ours(prompt, batch, args.steps, runners["gguf"])
        d = ours(prompt, batch, args.steps, runners["unquant"])
        b = transformers_side(prompt, batch, args.steps, hf)
        rows.append((batch, a, d, b))
    print(f"threads={torch.get_num_threads()} prompt={len(prompt)} steps={args.steps} load: "
          f"ours {loads['gguf']:.1f}s (unquant {loads['unquant']:.1f}s), "
          f"transformers {load_hf:.1f}s")
    print("| batch | ours (gguf blocks) ms/step | ours (unquant, fp32) | transformers fp32 "
          "| llama.cpp Q4_1 (earlier) | ours tok/s | transformers tok/s | speed-up vs transformers |")
    print("|---|---|---|---|---|---|---|---|")
    for batch, a, d, b in rows:
        print(f"| {batch} | {a:.1f} | {d:.1f} | {b:.1f} | {LLAMA_CPP[batch]} "
              f"| {batch * 1000 / a:.0f} | {batch * 1000 / b:.0f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
