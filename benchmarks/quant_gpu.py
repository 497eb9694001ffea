"""Decode-step cost of the linear layers of Llama-3-8B (32 layers: qkv 4096->6144, o, gate_up
4096->28672, down 14336->4096) under each quantization format, against bf16, at batch 1 and 32.

Dummy weights are quantized by the checkpoint writers of :mod:`engine.testing.quant`, loaded
through each choice's plugin and timed with CUDA events (one layer per shape, times 32). Skips
without CUDA. Attention is not included: this isolates what the choice changes.

    python benchmarks/quant_gpu.py [scheme ...]     (schemes: engine.testing.quant.CHOICE)
"""

from __future__ import annotations

import importlib
import sys

import torch

from engine.api.quant import Linear
from engine.testing import quant as tq

SHAPES = {"self_attn.qkv_proj": (4096, (4096, 1024, 1024)), "self_attn.o_proj": (4096, (4096,)),
          "mlp.gate_up_proj": (4096, (14336, 14336)), "mlp.down_proj": (14336, (4096,))}
PARTS = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "self_attn.o_proj": ("o_proj",),
         "mlp.gate_up_proj": ("gate_proj", "up_proj"), "mlp.down_proj": ("down_proj",)}
LAYERS = 32


def build(scheme: str | None, key: str) -> Linear:
    k, shards = SHAPES[key]
    prefix = "model.layers.0." + key.split(".")[0]
    dense = {f"{prefix}.{p}.weight": torch.randn(n, k) * k ** -0.5
             for p, n in zip(PARTS[key], shards)}
    if scheme is None:
        layer = Linear(k, sum(shards), dtype=torch.bfloat16, shards=shards)
        layer.weight.data.copy_(torch.cat(list(dense.values())))
        return layer.cuda()
    tensors, qcfg, _ = tq.quantize_state(dense, scheme, group=128)
    impl = importlib.import_module(f"engine_quant_{tq.CHOICE[scheme].replace('-', '_')}.impl")
    method = impl.engine_create_quant_method(quant_config={"quant_method": "", **qcfg})
    layer = Linear(k, sum(shards), dtype=torch.bfloat16, shards=shards,
                   quant_method=method.for_layer("model.layers.0." + key))
    layer = layer.cuda()
    params, start = dict(layer.named_parameters()), 0
    for p, n in zip(PARTS[key], shards):
        base = f"{prefix}.{p}"
        for name, t in tensors.items():
            if name.startswith(base + "."):
                leaf = name[len(base) + 1:]
                params[leaf].weight_loader(params[leaf], t.cuda(), start, n)
        start += n
    layer.process_weights_after_loading()
    return layer


def step_ms(layers: dict[str, Linear], batch: int, iters: int = 50) -> float:
    xs = {key: torch.randn(batch, SHAPES[key][0], dtype=torch.bfloat16, device="cuda")
          for key in layers}
    for _ in range(5):
        for key, layer in layers.items():
            layer(xs[key])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        for key, layer in layers.items():
            layer(xs[key])
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * LAYERS


def main() -> None:
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    schemes = sys.argv[1:] or ["ct_fp8_dynamic", "fp8_tensor", "fp8_block", "ct_w8a8_int8",
                               "gptq", "awq", "ct_wna16", "modelopt_fp8"]
    base = {b: step_ms({k: build(None, k) for k in SHAPES}, b) for b in (1, 32)}
    print("| format (choice) | batch 1 ms/step | batch 32 ms/step | vs bf16 (1 / 32) |")
    print("|---|---|---|---|")
    print(f"| bf16 | {base[1]:.3f} | {base[32]:.3f} | 1.00 / 1.00 |")
    for s in schemes:
        layers = {k: build(s, k) for k in SHAPES}
        ms = {b: step_ms(layers, b) for b in (1, 32)}
        print(f"| {s} ({tq.CHOICE[s]}) | {ms[1]:.3f} | {ms[32]:.3f} | "
              f"{ms[1] / base[1]:.2f} / {ms[32] / base[32]:.2f} |", flush=True)
        del layers
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
