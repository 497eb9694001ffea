"""CPU decode of an OLMoE-shaped model (64 experts, top-8, whole-projection q/k norms; smaller
widths so it runs on a laptop-class CPU): our ModelRunner with the torch MoE runner next to
transformers on the same random weights, same run, interleaved rounds. Also checks that both
produce the same greedy tokens.

    python benchmarks/moe_cpu.py [--steps 24] [--rounds 3] [--layers 4] [--hidden 512]
                                 [--bf16-checkpoint]

``--bf16-checkpoint`` writes the weights in bfloat16 (both sides still compute in float32): ours
then keeps its weights in 16 bits, and is also timed with them widened to float32 at load
(``ENGINE_CPU_HALF_WEIGHTS=0``) in the same rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from decode_cpu import ours, transformers_side  # noqa: E402


def make_checkpoint(layers: int, hidden: int, dtype: torch.dtype = torch.float32) -> str:
    from transformers import OlmoeConfig, OlmoeForCausalLM

    cfg = OlmoeConfig(vocab_size=50304, hidden_size=hidden, intermediate_size=hidden // 2,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64,
                      num_key_value_heads=hidden // 64, num_experts=64, num_experts_per_tok=8,
                      norm_topk_prob=False, max_position_embeddings=4096, pad_token_id=1,
                      eos_token_id=50279, bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    path = tempfile.mkdtemp(prefix="olmoe-bench-")
    OlmoeForCausalLM(cfg).to(dtype).save_pretrained(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--quantization", nargs="*", default=[],
                    help="online choices also timed against ours dense, in the same rounds "
                         "(fp8, nvfp4_online, quark_int4fp8_moe, mxfp4...)")
    ap.add_argument("--bf16-checkpoint", action="store_true",
                    help="bfloat16 weights in the file; also time ours with them widened")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from engine.config import ServerConfig
    from engine.runtime.model_runner import ModelRunner

    path = make_checkpoint(args.layers, args.hidden,
                           torch.bfloat16 if args.bf16_checkpoint else torch.float32)
    def build(quantization=None):
        return ModelRunner(ServerConfig(model_path=path, device="cpu", dtype="float32",
                                        skip_tokenizer_init=True,
                                        attention_backend="torch_native", max_total_tokens=4096,
                                        max_running_requests=8, quantization=quantization))

    runner = build()
    quantized = {q: build(q) for q in args.quantization}
    if args.bf16_checkpoint:  # the same file, its weights widened to float32 at load
        os.environ["ENGINE_CPU_HALF_WEIGHTS"] = "0"
        quantized["(none) float32 weights"] = build()
        del os.environ["ENGINE_CPU_HALF_WEIGHTS"]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = torch.randint(0, 50000, (64,), generator=torch.Generator().manual_seed(1)).tolist()

    # the same greedy tokens (16 steps, batch 1)
    from engine.testing.batches import BatchBuilder
    bb = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    row = bb.new_request()
    tok = [int(runner.forward(bb.extend([(row, prompt)])).argmax(-1))]
    for _ in range(15):
        tok.append(int(runner.forward(bb.decode([(row, tok[-1])])).argmax(-1)))
    bb.free(row)
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                           pad_token_id=1, eos_token_id=None)[0, 64:].tolist()
    print(f"greedy tokens equal to transformers: {tok == want}")

    load = os.getloadavg()[0]
    rows, qrows = [], []
    for batch in (1, 8):
        a, b = [], []
        qs: dict[str, list[float]] = {q: [] for q in quantized}
        for _ in range(args.rounds):  # interleaved A, B, A, B...
            a.append(ours(prompt, batch, args.steps, runner))
            b.append(transformers_side(prompt, batch, args.steps, hf))
            for q, r in quantized.items():
                qs[q].append(ours(prompt, batch, args.steps, r))
        ma, mb = statistics.median(a), statistics.median(b)
        rows.append((batch, ma, mb, batch * 1000 / ma, batch * 1000 / mb, mb / ma))
        qrows += [(q, batch, statistics.median(t), statistics.median(t) / ma)
                  for q, t in qs.items()]
    print(f"\nOLMoE-shaped ({args.layers} layers, hidden {args.hidden}, 64 experts top-8), "
          f"float32, {torch.get_num_threads()} threads, load {load:.2f} -> "
          f"{os.getloadavg()[0]:.2f}")
    print("| batch | ours ms/step | transformers ms/step | ours tok/s | transformers tok/s | "
          "speed-up |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.0f} | {r[4]:.0f} | {r[5]:.2f}x |")
    if qrows:
        print("\n| --quantization | batch | ms/step | vs ours dense |\n|---|---|---|---|")
        for q, batch, ms, ratio in qrows:
            print(f"| {q} | {batch} | {ms:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
