"""Scoring a prompt on the CPU (the prompt's own log-probabilities, as an evaluation harness
asks with ``echo`` and ``logprobs``): the offline Engine next to transformers on the same
weights, same run.

The default model (SmolLM2-135M-Instruct Q4_1 GGUF), one prompt of ``--tokens`` tokens scored
from position 0 (``max_new_tokens`` 0, ``logprob_start_len`` 0). Ours twice: the default gguf
path (the file's blocks, 8-bit activations) and its exact path (float32 activations, which
equals transformers token for token); transformers: float32, one forward, ``log_softmax`` of
every position gathered at the next token. Prints seconds per prompt (median of ``--rounds``,
the three interleaved) and the largest difference of a token's log-probability against
transformers'.

    python benchmarks/score_cpu.py [--tokens 512] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

EXACT = {"quantization.gguf": {"gguf_activations": "float32"}}
TEXT = "The quick brown fox jumps over the lazy dog; the dog sleeps on in the sun. "


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from engine import Engine

    engines = {"ours, gguf (8-bit activations)": Engine(device="cpu"),
               "ours, gguf exact (float32)": Engine(device="cpu", plugin_options=EXACT)}
    first = next(iter(engines.values()))
    ids = first.tokenizer.encode(TEXT * (args.tokens // 10 + 1))[:args.tokens]
    mc = first.runtime.model_config
    hf = AutoModelForCausalLM.from_pretrained(mc.model_path, gguf_file=mc.gguf_file,
                                              dtype=torch.float32).eval()

    def transformers_scores() -> torch.Tensor:
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, :-1]
            return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]

    def ours(engine: Engine) -> torch.Tensor:
        out = engine.generate([ids], {"max_new_tokens": 0, "logprob_start_len": 0})
        return torch.tensor(out[0]["meta_info"]["input_token_logprobs"][1:])

    runs = {"transformers fp32": transformers_scores,
            **{name: (lambda e=e: ours(e)) for name, e in engines.items()}}
    reference = transformers_scores()
    times: dict[str, list[float]] = {name: [] for name in runs}
    diffs: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            got = fn()
            times[name].append(time.perf_counter() - t0)
            diffs[name] = float((got - reference).abs().max())
    print(f"\nscoring one prompt of {len(ids)} tokens, {torch.get_num_threads()} threads, "
          f"median of {args.rounds}")
    print("| engine | s / prompt | tokens/s | max |logprob - transformers'| |\n|---|---|---|---|")
    for name in runs:
        t = statistics.median(times[name])
        print(f"| {name} | {t:.3f} | {len(ids) / t:.0f} | {diffs[name]:.2e} |")


if __name__ == "__main__":
    main()
