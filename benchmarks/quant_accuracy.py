"""Accuracy of each quantization format on the default model (SmolLM2-135M-Instruct, its GGUF
dequantized to float32), against float32: teacher-forced top-1 agreement and KL(fp32 || q)
over a held-out text. Writes the markdown table to stdout.

    python benchmarks/quant_accuracy.py [scheme ...] [online:CHOICE ...] [kv:DTYPE ...]

``online:CHOICE`` serves the dense checkpoint with ``--quantization CHOICE`` (a method that
quantizes at load: fp8, mxfp8, quark_mxfp4, mxfp_w4a8...); ``kv:DTYPE`` serves it with
``--kv-cache-dtype DTYPE`` (fp8_e4m3, fp8_e5m2, fp4_mx_block16: every position's K and V
read back from the quantized cache, scales 1.0).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

from engine.config import ServerConfig
from engine.runtime.model_runner import ModelRunner
from engine.testing import quant as tq
from engine.testing.batches import BatchBuilder

SCHEMES = {"ct_w8a16": {}, "ct_w8a8_int8": {}, "ct_fp8_dynamic": {},
           "fp8_block": {"block": (64, 64)}, "modelopt_fp8": {}, "quark_fp8": {},
           "gptq": {"group": 64}, "awq": {"group": 64, "sym": False}, "ct_wna16": {"group": 64},
           "mlx4": {"group": 64}, "mlx8": {"group": 64}, "modelopt_nvfp4": {}, "bnb_nf4": {},
           "mxfp8": {}, "quark_mxfp4": {}, "bnb_int8": {}, "modelslim_w8a8": {},
           "modelslim_w8a8_dynamic": {}, "modelslim_w4a4": {}}
SEQ, N_SEQ = 512, 4


def held_out_text() -> str:
    """English README text of installed packages (their metadata descriptions)."""
    from importlib import metadata

    return "\n\n".join(metadata.metadata(p).get_payload() or "" for p in
                       ("httpx", "pydantic", "fastapi", "uvicorn"))


def calibration_text() -> str:
    """Other README text, for the static activation scales (never the evaluated text)."""
    from importlib import metadata

    return "\n\n".join(metadata.metadata(p).get_payload() or "" for p in
                       ("openai", "transformers", "safetensors"))


INPUT_AMAX: dict[str, float] = {}


def calibrate(runner: ModelRunner, ids: list[int]) -> dict[str, float]:
    """Largest input magnitude of every linear layer over ``ids``, under checkpoint names (a
    fused layer's input is each of its parts')."""
    from engine.api.quant import Linear, checkpoint_names

    amax: dict[str, float] = {}
    hooks = []
    for name, mod in runner.model.named_modules():
        if isinstance(mod, Linear) and name.startswith("model.layers."):
            def hook(_m, args, name=name):
                for part in checkpoint_names(name):
                    amax[part] = max(amax.get(part, 0.0), float(args[0].abs().max()))
            hooks.append(mod.register_forward_pre_hook(hook))
    builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    row = builder.new_request()
    runner.forward(builder.extend([(row, ids)]))
    builder.free(row)
    runner.req_to_token.zero_()
    for h in hooks:
        h.remove()
    return amax


def dense_checkpoint(dst: str) -> list[list[int]]:
    from safetensors.torch import save_file

    runner = ModelRunner(ServerConfig(device="cpu", dtype="float32", quantization="unquant",
                                      attention_backend="torch_native", max_total_tokens=2048))
    mc, state = runner.model_config, {}
    q, kv = mc.num_attention_heads * mc.head_dim, mc.num_key_value_heads * mc.head_dim
    for name, p in runner.model.state_dict().items():
        if ".qkv_proj." in name:
            for part, t in zip(("q_proj", "k_proj", "v_proj"), p.split([q, kv, kv])):
                state[name.replace("qkv_proj", part)] = t.clone()
        elif ".gate_up_proj." in name:
            for part, t in zip(("gate_proj", "up_proj"), p.chunk(2)):
                state[name.replace("gate_up_proj", part)] = t.clone()
        elif name == "model.embed_tokens.weight" and p.numel() == 0:
            # the table is served packed (rows dequantized on lookup): write it dense
            state[name] = runner.model.model.embed_tokens.packed.dequantize().clone()
        elif not name.startswith("lm_head"):
            state[name] = p.clone()
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": mc.hidden_size, "intermediate_size": mc.intermediate_size,
              "num_hidden_layers": mc.num_hidden_layers,
              "num_attention_heads": mc.num_attention_heads,
              "num_key_value_heads": mc.num_key_value_heads, "vocab_size": mc.vocab_size,
              "rms_norm_eps": mc.rms_norm_eps, "rope_theta": mc.rope_theta,
              "max_position_embeddings": mc.max_position_embeddings, "tie_word_embeddings": True,
              "hidden_act": "silu", "torch_dtype": "float32"}
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(config, fh)
    save_file(state, os.path.join(dst, "model.safetensors"))
    global INPUT_AMAX
    INPUT_AMAX = calibrate(runner, runner.tokenizer.encode(calibration_text())[:1024])
    ids = runner.tokenizer.encode(held_out_text())
    assert len(ids) >= SEQ * N_SEQ, len(ids)
    return [ids[i * SEQ:(i + 1) * SEQ] for i in range(N_SEQ)]


def all_logits(path: str, seqs: list[list[int]], quantization: str | None = None,
               kv_cache_dtype: str = "auto") -> torch.Tensor:
    runner = ModelRunner(ServerConfig(model_path=path, device="cpu", dtype="float32",
                                      skip_tokenizer_init=True, attention_backend="torch_native",
                                      max_total_tokens=2048, max_running_requests=4,
                                      quantization=quantization, kv_cache_dtype=kv_cache_dtype))
    out = []
    for ids in seqs:  # every position's logits from one extend
        builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
        row = builder.new_request()
        out.append(runner.forward(builder.extend([(row, ids)], all_logits=True)))
        builder.free(row)
        runner.req_to_token.zero_()
    return torch.cat(out)


def main() -> None:
    names = sys.argv[1:] or list(SCHEMES)
    with tempfile.TemporaryDirectory() as tmp:
        dense = os.path.join(tmp, "dense")
        seqs = dense_checkpoint(dense)
        base = F.log_softmax(all_logits(dense, seqs), -1)
        print("| format (choice) | top-1 agreement % | KL(fp32 ‖ q) nats |\n|---|---|---|")
        for name in names:
            if name.startswith("online:"):
                choice = name.partition(":")[2]
                lp = F.log_softmax(all_logits(dense, seqs, choice), -1)
                label = f"{choice}, online"
            elif name.startswith("kv:"):
                kv = name.partition(":")[2]
                lp = F.log_softmax(all_logits(dense, seqs, kv_cache_dtype=kv), -1)
                label = f"--kv-cache-dtype {kv}"
            else:
                qdir = os.path.join(tmp, name)
                tq.write_checkpoint(dense, qdir, name, input_amax=INPUT_AMAX, **SCHEMES[name])
                lp = F.log_softmax(all_logits(qdir, seqs), -1)
                label = f"{name} ({tq.CHOICE[name]})"
            top1 = (lp.argmax(-1) == base.argmax(-1)).float().mean().item() * 100
            kl = (base.exp() * (base - lp)).sum(-1).mean().item()
            print(f"| {label} | {top1:.1f} | {kl:.4f} |", flush=True)


if __name__ == "__main__":
    main()
