"""Writers of quantized checkpoints and the conformance kit of quantization plugins.

:func:`quantize_state` turns a dense HF state dict into one format's tensors by round-to-nearest
and returns, beside them, the *reference* weights: the float32 values the format's codes stand
for, computed here from the integer codes and scales before packing (independently of the
engine's unpackers). :func:`write_checkpoint` writes a directory the engine loads. The
layouts follow the producers (auto-round / AutoGPTQ / AutoAWQ, llmcompressor's
compressed-tensors, ModelOpt, Quark, mlx) as the quantization fact sheet describes them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

import torch

from engine.runtime import quant_formats as qf

#: the linear layers a writer quantizes: attention, dense MLPs and routed experts (per expert)
LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.(?:experts\.\d+\.)?"
                    r"(q|k|v|o|gate|up|down)_proj\.weight$")

#: msModelSlim scheme -> the type its description file gives the quantized tensors
MODELSLIM_TYPES = {"modelslim_w8a8": "W8A8", "modelslim_w8a8_dynamic": "W8A8_DYNAMIC",
                   "modelslim_w4a4": "W4A4_DYNAMIC"}

#: scheme -> the ``--quantization`` choice that reads it
CHOICE = {"gptq": "gptq", "awq": "awq", "auto_round": "auto-round",
          "ct_wna16": "compressed-tensors", "ct_w8a8_int8": "w8a8_int8",
          "ct_fp8_dynamic": "w8a8_fp8", "ct_fp8_static": "compressed-tensors",
          "ct_fp8_block": "compressed-tensors", "ct_w8a16": "compressed-tensors",
          "fp8_block": "fp8", "fp8_tensor": "fp8", "modelopt_fp8": "modelopt_fp8",
          "modelopt_nvfp4": "modelopt_fp4", "quark_fp8": "quark", "bnb_nf4": "bitsandbytes",
          "mlx4": "mlx_q4", "mlx8": "mlx_q8", "mxfp8": "mxfp8", "modelopt_mxfp8": "modelopt",
          "bnb_int8": "bitsandbytes", "w4afp8": "w4afp8", "modelslim_w8a8": "modelslim",
          "modelslim_w8a8_dynamic": "modelslim", "modelslim_w4a4": "modelslim",
          "quark_mxfp4": "quark"}


def _groups(w: torch.Tensor, g: int) -> torch.Tensor:
    n, k = w.shape
    return w.reshape(n, k // g, g)


def _int_rtn(w: torch.Tensor, bits: int, g: int, sym: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes [N, K] in [0, 2^b), scales [N, K/g], zeros [N, K/g] (ints) with W ~ (q - z) s."""
    wg = _groups(w, g)
    top = (1 << bits) - 1
    if sym:
        s = (2 * wg.abs().amax(-1) / top).clamp(min=1e-8)
        z = torch.full_like(s, 1 << (bits - 1))
    else:
        lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
        s = ((hi - lo) / top).clamp(min=1e-8)
        z = torch.round(-lo / s).clamp(0, top)
    q = torch.round(wg / s[..., None] + z[..., None]).clamp(0, top)
    return q.reshape(w.shape).to(torch.int32), s.to(torch.float16), z.to(torch.int32)


def _ref(q: torch.Tensor, s: torch.Tensor, z: torch.Tensor, g: int) -> torch.Tensor:
    return (q - z.repeat_interleave(g, 1)).float() * s.float().repeat_interleave(g, 1)


def _fp8(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)


def quantize_state(state: dict[str, torch.Tensor], scheme: str, *, bits: int = 4,
                   group: int = 64, sym: bool = True, desc_act: bool = False,
                   block: tuple[int, int] = (128, 128), seed: int = 0,
                   input_amax: dict[str, float] | None = None
                   ) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, torch.Tensor]]:
    """(tensors, quantization config, reference float32 weights of the quantized layers).
    Static activation scales are ``input_amax[module] / 448`` (calibrated by the caller), else
    arbitrary values in [0.02, 0.03] (enough for layer-level tests)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    ref: dict[str, torch.Tensor] = {}
    for name, w in state.items():
        if not LINEAR.match(name):
            out[name] = w
            continue
        base, w = name[:-len(".weight")], w.float()
        n, k = w.shape
        if scheme in ("gptq", "auto_round"):
            perm = torch.randperm(k, generator=gen) if desc_act else torch.arange(k)
            g_idx = torch.empty(k, dtype=torch.int32)
            g_idx[perm] = (torch.arange(k) // group).to(torch.int32)
            wp = w[:, perm]  # columns in act order, grouped consecutively
            q, s, z = _int_rtn(wp, bits, group, sym)
            inv = torch.argsort(perm)
            q, r = q[:, inv], _ref(q, s, z, group)[:, inv]
            out[base + ".qweight"] = qf.pack_int32(q.t(), bits, 0)
            out[base + ".qzeros"] = qf.pack_int32((z - 1).t(), bits, 1)
            out[base + ".scales"] = s.t().contiguous()
            out[base + ".g_idx"] = g_idx
        elif scheme == "awq":
            q, s, z = _int_rtn(w, 4, group, sym)
            r = _ref(q, s, z, group)
            out[base + ".qweight"] = qf.awq_pack(q.t().contiguous())
            out[base + ".qzeros"] = qf.awq_pack(z.t().contiguous())
            out[base + ".scales"] = s.t().contiguous()
        elif scheme == "ct_wna16":
            q, s, z = _int_rtn(w, bits, group, sym)
            r = _ref(q, s, z, group)
            out[base + ".weight_packed"] = qf.pack_int32(q, bits, 1)
            out[base + ".weight_scale"] = s.to(torch.bfloat16)
            r = _ref(q, s.to(torch.bfloat16), z, group)
            out[base + ".weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
            if not sym:
                # signed zero points, stored offset by 2^(b-1) like the codes
                out[base + ".weight_zero_point"] = qf.pack_int32(z, bits, 0)
        elif scheme in ("ct_w8a8_int8", "ct_w8a16"):
            s = (w.abs().amax(1, keepdim=True) / 127).clamp(min=1e-8).to(torch.bfloat16)
            q = torch.round(w / s.float()).clamp(-128, 127).to(torch.int8)
            out[name], out[base + ".weight_scale"] = q, s
            r = q.float() * s.float()
        elif scheme in ("ct_fp8_dynamic", "quark_fp8", "ct_fp8_static", "fp8_tensor",
                        "modelopt_fp8"):
            per_tensor = scheme != "ct_fp8_dynamic"
            amax = w.abs().amax() if per_tensor else w.abs().amax(1, keepdim=True)
            s = (amax / 448).clamp(min=1e-8).to(torch.float32)
            if scheme in ("ct_fp8_dynamic", "quark_fp8"):
                s = s.to(torch.bfloat16).float()
            q = _fp8(w, s)
            out[name] = q
            out[base + ".weight_scale"] = (s.reshape(1) if scheme.startswith("ct_") and per_tensor
                                           else s.to(torch.bfloat16) if scheme == "quark_fp8"
                                           else s)
            r = q.float() * s
            if scheme in ("ct_fp8_static", "fp8_tensor", "modelopt_fp8", "quark_fp8"):
                value = (input_amax[base] / 448 if input_amax is not None
                         else 0.02 + 0.01 * torch.rand((), generator=gen).item())
                out[base + ".input_scale"] = torch.tensor(value, dtype=torch.float32)
        elif scheme == "w4afp8" and ".experts." in name:
            # signed int4 per group along K (scale amax / 7), two per byte; a static fp8 input
            # scale per projection
            g = _groups(w, group)
            s = (g.abs().amax(-1) / 7).clamp(min=1e-8)
            q = torch.round(g / s[..., None]).clamp(-8, 7).reshape(n, k)
            out[name] = qf.pack_int4_pairs(q)
            out[base + ".weight_scale_inv"] = s
            value = (input_amax[base] / 448 if input_amax is not None
                     else 0.02 + 0.01 * torch.rand((), generator=gen).item())
            out[base + ".input_scale"] = torch.tensor(value, dtype=torch.float32)
            r = q * s.repeat_interleave(group, 1)
        elif scheme == "modelslim_w8a8":
            # per-channel symmetric int8 weights; a static asymmetric activation scale and
            # offset per layer; the kernel's quant_bias and deq_scale
            ws = (w.abs().amax(1) / 127).clamp(min=1e-8)
            q = torch.round(w / ws[:, None]).clamp(-128, 127)
            amax = input_amax[base] if input_amax is not None else 4.0
            s_in = torch.tensor(2 * amax / 255, dtype=torch.float32)
            offset = float(torch.randint(-3, 4, (), generator=gen))
            out[name] = q.to(torch.int8)
            out[base + ".weight_scale"], out[base + ".weight_offset"] = ws[:, None], \
                torch.zeros(n, 1)
            out[base + ".input_scale"] = s_in.reshape(1)
            out[base + ".input_offset"] = torch.tensor([offset])
            out[base + ".deq_scale"] = (s_in * ws).to(torch.float32)
            out[base + ".quant_bias"] = (-offset * q.sum(1)).to(torch.int32)
            r = q * ws[:, None]
        elif scheme in ("modelslim_w8a8_dynamic", "modelslim_w4a4"):
            b = 8 if scheme == "modelslim_w8a8_dynamic" else 4
            top = (1 << (b - 1)) - 1
            ws = (w.abs().amax(1) / top).clamp(min=1e-8)
            q = torch.round(w / ws[:, None]).clamp(-top - 1, top)
            out[name] = q.to(torch.int8)
            out[base + ".weight_scale"], out[base + ".weight_offset"] = ws[:, None], \
                torch.zeros(n, 1)
            r = q * ws[:, None]
        elif scheme in ("fp8_block", "ct_fp8_block", "w4afp8"):
            bn, bk = block
            pad = torch.nn.functional.pad(w, (0, (-k) % bk, 0, (-n) % bn))
            blocks = pad.reshape(pad.shape[0] // bn, bn, pad.shape[1] // bk, bk)
            s = (blocks.abs().amax((1, 3)) / 448).clamp(min=1e-8)
            full = qf.expand_blocks(s, n, k, block)
            q = _fp8(w, full)
            out[name] = q
            out[base + (".weight_scale" if scheme == "ct_fp8_block" else ".weight_scale_inv")] = s
            r = q.float() * full
        elif scheme in ("mxfp8", "modelopt_mxfp8"):
            # UE8M0 scale per 1x32: the power of two just above amax / 448 (no saturation)
            e = torch.ceil(torch.log2(_groups(w, 32).abs().amax(-1).clamp(min=1e-30) / 448))
            scale = torch.pow(2.0, e).repeat_interleave(32, 1)
            q = _fp8(w, scale)
            out[name], out[base + ".weight_scale"] = q, (e + 127).to(torch.uint8)
            r = q.float() * scale
        elif scheme == "bnb_int8":
            # LLM.int8's row-wise absmax (SCB) and int8 codes, as Int8Params quantizes
            scb = w.abs().amax(1)
            q = torch.round(w * (127.0 / scb.unsqueeze(-1))).to(torch.int8)
            out[name], out[base + ".SCB"] = q, scb
            out[base + ".weight_format"] = torch.tensor(0, dtype=torch.uint8)
            r = q.float() * scb.view(-1, 1) / 127
        elif scheme == "quark_mxfp4":
            # OCP MX: scale 2^(floor(log2 amax) - 2); nearest E2M1, ties to the even code
            g = _groups(w, 32)
            e = torch.floor(torch.log2(g.abs().amax(-1).clamp(min=1e-30))) - 2
            scale = torch.pow(2.0, e)
            vals = torch.tensor(qf.E2M1_VALUES[:8])
            a = (g / scale[..., None]).abs().clamp(max=6.0)
            idx = ((a[..., None] - vals).abs() + 1e-7 * (torch.arange(8) % 2)).argmin(-1)
            codes = (idx | (((g < 0) & (idx > 0)).long() << 3)).reshape(n, k)
            out[name] = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
            out[base + ".weight_scale"] = (e + 127).to(torch.uint8)
            r = torch.tensor(qf.E2M1_VALUES)[codes] * scale.repeat_interleave(32, 1)
        elif scheme == "modelopt_nvfp4":
            s2 = (w.abs().amax() / (448 * 6)).clamp(min=1e-8)
            bs = (_groups(w, 16).abs().amax(-1) / 6 / s2).to(torch.float8_e4m3fn)
            scale = bs.float().clamp(min=1e-8) * s2
            vals = torch.tensor(qf.E2M1_VALUES[:8])
            x = (_groups(w, 16) / scale[..., None]).reshape(n, k)
            idx = (x.abs()[..., None] - vals).abs().argmin(-1)
            codes = idx | ((x < 0) & (idx > 0)).long() << 3
            out[name] = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
            out[base + ".weight_scale"] = bs
            out[base + ".weight_scale_2"] = s2
            r = torch.tensor(qf.E2M1_VALUES)[codes] * bs.float().repeat_interleave(16, 1) * s2
        elif scheme == "bnb_nf4":
            table = torch.tensor(qf.NF4_VALUES)
            blocks = w.reshape(-1, 64)
            absmax = blocks.abs().amax(1).clamp(min=1e-8)
            codes = ((blocks / absmax[:, None])[..., None] - table).abs().argmin(-1)
            offset = absmax.mean()
            centered = absmax - offset
            nabs = torch.nn.functional.pad(centered, (0, (-centered.numel()) % 256)).reshape(
                -1, 256).abs().amax(1).clamp(min=1e-8)
            nmap = torch.linspace(-1, 1, 256)
            acodes = torch.round((centered / nabs.repeat_interleave(256)[:centered.numel()] + 1)
                                 * 127.5).clamp(0, 255).long()
            deq_absmax = nmap[acodes] * nabs.repeat_interleave(256)[:acodes.numel()] + offset
            flat = codes.reshape(-1)
            out[name] = ((flat[0::2] << 4) | flat[1::2]).to(torch.uint8).reshape(-1, 1)
            state = {"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [n, k],
                     "nested_blocksize": 256, "nested_dtype": "float32",
                     "nested_offset": float(offset)}
            out[name + ".absmax"] = acodes.to(torch.uint8)
            out[name + ".quant_map"] = table
            out[name + ".nested_absmax"] = nabs
            out[name + ".nested_quant_map"] = nmap
            out[name + ".quant_state.bitsandbytes__nf4"] = torch.tensor(
                list(json.dumps(state).encode()), dtype=torch.uint8)
            r = (table[codes] * deq_absmax[:, None]).reshape(n, k)
        elif scheme in ("mlx4", "mlx8"):
            b = 4 if scheme == "mlx4" else 8
            lo = _groups(w, group).amin(-1)
            s = ((_groups(w, group).amax(-1) - lo) / ((1 << b) - 1)).clamp(min=1e-8)
            q = torch.round((_groups(w, group) - lo[..., None]) / s[..., None]).clamp(
                0, (1 << b) - 1).reshape(n, k).to(torch.int32)
            s, lo = s.to(torch.bfloat16), lo.to(torch.bfloat16)
            out[name] = qf.pack_int32(q, b, 1).view(torch.uint32)
            out[base + ".scales"], out[base + ".biases"] = s, lo
            r = q.float() * s.float().repeat_interleave(group, 1) + lo.float().repeat_interleave(
                group, 1)
        else:
            raise ValueError(f"unknown scheme {scheme!r}")
        ref[name] = r.float()
    qcfg = _config(scheme, bits, group, sym, desc_act, block)
    if scheme.startswith("modelslim"):  # each tensor's type, as quant_model_description.json
        kind = MODELSLIM_TYPES[scheme]
        qcfg["description"] = {k: kind if k[:k.rfind(".")] + ".weight" in ref else "FLOAT"
                               for k in out}
        qcfg["model_quant_type"] = kind
    return out, qcfg, ref


def _config(scheme: str, bits: int, group: int, sym: bool, desc_act: bool,
            block: tuple[int, int]) -> dict[str, Any]:
    def ct(weights: dict, acts: dict | None, fmt: str) -> dict[str, Any]:
        return {"quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head"],
                "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                              "input_activations": acts}}}
    fp8w = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
    return {
        "gptq": {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym,
                 "desc_act": desc_act, "checkpoint_format": "gptq"},
        "auto_round": {"quant_method": "auto-round", "bits": bits, "group_size": group,
                       "sym": sym, "data_type": "int", "packing_format": "auto_round:auto_gptq"},
        "awq": {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": not sym,
                "version": "gemm"},
        "ct_wna16": ct({"num_bits": bits, "type": "int", "symmetric": sym, "strategy": "group",
                        "group_size": group}, None, "pack-quantized"),
        "ct_w8a16": ct({"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
                       None, "int-quantized"),
        "ct_w8a8_int8": ct({"num_bits": 8, "type": "int", "symmetric": True,
                            "strategy": "channel"},
                           {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                            "dynamic": True}, "int-quantized"),
        "ct_fp8_dynamic": ct({**fp8w, "strategy": "channel"},
                             {**fp8w, "strategy": "token", "dynamic": True}, "float-quantized"),
        "ct_fp8_static": ct({**fp8w, "strategy": "tensor"}, {**fp8w, "strategy": "tensor"},
                            "float-quantized"),
        "ct_fp8_block": ct({**fp8w, "strategy": "block", "block_structure": list(block)},
                           {**fp8w, "strategy": "group", "group_size": block[1],
                            "dynamic": True}, "float-quantized"),
        "fp8_block": {"quant_method": "fp8", "activation_scheme": "dynamic",
                      "weight_block_size": list(block)},
        "fp8_tensor": {"quant_method": "fp8", "activation_scheme": "static"},
        "modelslim_w8a8": {"quant_method": "modelslim"},
        "modelslim_w8a8_dynamic": {"quant_method": "modelslim"},
        "modelslim_w4a4": {"quant_method": "modelslim"},
        "w4afp8": {"quant_method": "w4afp8", "group_size": group,
                   "weight_block_size": list(block)},
        "modelopt_fp8": {"quant_method": "modelopt", "quant_algo": "FP8",
                         "exclude_modules": ["lm_head"]},
        "modelopt_nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                           "exclude_modules": ["lm_head"]},
        "modelopt_mxfp8": {"quant_method": "modelopt", "quant_algo": "MXFP8", "group_size": 32,
                           "exclude_modules": ["lm_head"]},
        "mxfp8": {"quant_method": "mxfp8", "ignored_layers": ["lm_head"]},
        "quark_mxfp4": {"quant_method": "quark", "exclude": ["lm_head"], "global_quant_config": {
            "weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32,
                       "scale_format": "e8m0", "is_dynamic": False},
            "input_tensors": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32,
                              "scale_format": "e8m0", "is_dynamic": True},
            "output_tensors": None}},
        "quark_fp8": {"quant_method": "quark", "exclude": ["lm_head"], "global_quant_config": {
            "weight": {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False},
            "input_tensors": {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False},
            "output_tensors": None}},
        "bnb_int8": {"quant_method": "bitsandbytes", "load_in_8bit": True,
                     "llm_int8_threshold": 6.0, "llm_int8_skip_modules": ["lm_head"],
                     "llm_int8_has_fp16_weight": False},
        "bnb_nf4": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                    "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                    "bnb_4bit_quant_storage": "uint8", "llm_int8_skip_modules": ["lm_head"]},
        "mlx4": {"group_size": group, "bits": 4},
        "mlx8": {"group_size": group, "bits": 8},
    }[scheme]


def write_checkpoint(src: str, dst: str, scheme: str,
                     state: dict[str, torch.Tensor] | None = None,
                     **kw: Any) -> dict[str, torch.Tensor]:
    """Quantize the dense HF checkpoint directory ``src`` (or ``state`` with ``src``'s
    config.json) into ``dst``; returns the reference weights. mlx configs go to config.json's
    ``quantization`` block, ModelOpt's to ``hf_quant_config.json``, the rest to
    ``quantization_config``."""
    from safetensors.torch import load_file, save_file

    if state is None:
        state = {}
        for f in sorted(os.listdir(src)):
            if f.endswith(".safetensors"):
                state.update(load_file(os.path.join(src, f)))
    tensors, qcfg, ref = quantize_state(state, scheme, **kw)
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if not f.endswith(".safetensors") and os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)
    with open(os.path.join(src, "config.json")) as fh:
        config = json.load(fh)
    if scheme.startswith("mlx"):
        config["quantization"] = qcfg
    elif scheme.startswith("modelslim"):
        with open(os.path.join(dst, "quant_model_description.json"), "w") as fh:
            json.dump({"model_quant_type": qcfg["model_quant_type"], **qcfg["description"]}, fh)
    elif scheme.startswith("modelopt"):
        with open(os.path.join(dst, "hf_quant_config.json"), "w") as fh:
            json.dump({"producer": {"name": "modelopt"},
                       "quantization": {k: v for k, v in qcfg.items() if k != "quant_method"}},
                      fh)
    else:
        config["quantization_config"] = qcfg
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1)
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(dst, "model.safetensors"))
    return ref


def tiny_llama(dst: str, *, layers: int = 2, vocab: int = 512, seed: int = 0,
               hidden: int = 576, heads: int = 9, kv_heads: int = 3,
               intermediate: int = 1536) -> dict[str, torch.Tensor]:
    """A random Llama checkpoint at SmolLM2-135M's widths (float32, tied embeddings)."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    d = hidden // heads
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv_heads * d, hidden),
              "self_attn.v_proj": (kv_heads * d, hidden), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (intermediate, hidden), "mlp.up_proj": (intermediate, hidden),
              "mlp.down_proj": (hidden, intermediate)}
    state = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen),
             "model.norm.weight": torch.ones(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, shape in shapes.items():
            state[p + name + ".weight"] = torch.randn(*shape, generator=gen) * shape[1] ** -0.5
        state[p + "input_layernorm.weight"] = torch.ones(hidden)
        state[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    os.makedirs(dst, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": hidden, "intermediate_size": intermediate,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "vocab_size": vocab, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "max_position_embeddings": 2048,
              "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32",
              "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1)
    save_file(state, os.path.join(dst, "model.safetensors"))
    return state


# ---------------------------------------------------------------- conformance kit

#: schemes whose activations are quantized (their reference tolerance is the activation grid's)
ACTIVATION_QUANTIZED = ("ct_w8a8_int8", "ct_fp8_dynamic", "ct_fp8_static", "ct_fp8_block",
                        "fp8_block", "fp8_tensor", "modelopt_fp8", "quark_fp8", "mxfp8",
                        "modelopt_mxfp8", "quark_mxfp4", "bnb_int8", "modelslim_w8a8",
                        "modelslim_w8a8_dynamic", "modelslim_w4a4")
KIT_SCHEMES = {"gptq": {"desc_act": True, "group": 32}, "awq": {"sym": False, "group": 32},
               "auto_round": {}, "ct_wna16": {"sym": False, "group": 32}, "ct_w8a16": {},
               "ct_w8a8_int8": {}, "ct_fp8_dynamic": {}, "ct_fp8_static": {},
               "ct_fp8_block": {"block": (64, 64)}, "fp8_block": {"block": (64, 64)},
               "fp8_tensor": {}, "modelopt_fp8": {}, "modelopt_nvfp4": {}, "quark_fp8": {},
               "mlx4": {"group": 32}, "mlx8": {"group": 32}, "bnb_nf4": {}, "mxfp8": {},
               "modelopt_mxfp8": {}, "quark_mxfp4": {}, "bnb_int8": {}, "modelslim_w8a8": {},
               "modelslim_w8a8_dynamic": {}, "modelslim_w4a4": {}}


def normalized_config(scheme: str, qcfg: dict[str, Any]) -> dict[str, Any]:
    """The ``quantization_config`` the engine reads for a written scheme (mlx's block and
    ModelOpt's file normalized as :mod:`engine.models.quant_config` does)."""
    if scheme.startswith("mlx"):
        return {"quant_method": f"mlx_q{qcfg['bits']}", **qcfg}
    return dict(qcfg)


def load_fused_layer(method: Any, tensors: dict[str, torch.Tensor], prefix: str,
                     parts: dict[str, int], in_features: int,
                     dtype: torch.dtype = torch.float32) -> Any:
    """A fused :class:`Linear` of ``method`` filled shard by shard through its parameters'
    ``weight_loader`` (as the model loader does), then processed."""
    from engine.runtime.linear import Linear

    layer = Linear(in_features, sum(parts.values()), dtype=dtype, quant_method=method,
                   shards=tuple(parts.values()))
    params, start = dict(layer.named_parameters()), 0
    for part, n in parts.items():
        base = f"{prefix}.{part}"
        for key, t in tensors.items():
            if key.startswith(base + ".") and key[len(base) + 1:] in params:
                leaf = key[len(base) + 1:]
                params[leaf].weight_loader(params[leaf], t, start, n)
        start += n
    layer.process_weights_after_loading()
    return layer


#: the fused q/k/v layer the kit and the layer tests load: SmolLM2's output widths
QKV_PARTS = {"q_proj": 576, "k_proj": 192, "v_proj": 192}


def qkv_weights(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random dense q/k/v weights of layer 0 (576 inputs, scale 0.04), checkpoint names."""
    return {f"model.layers.0.self_attn.{p}.weight": torch.randn(n, 576, generator=gen) * 0.04
            for p, n in QKV_PARTS.items()}


def check(name: str, build: Any) -> list[str]:
    """The quantization kit: every checkpoint kind the writers produce that the plugin accepts
    (its hook raises ConfigError for the others) loads into a fused q/k/v layer at SmolLM2's
    widths, and its output equals x @ W_ref^T, W_ref the format's own dequantized values:
    within float32 summation error for weight-only formats, within the activation grid for
    activation-quantized ones; a method that says ``batch_invariant`` is checked row by row;
    a tensor of the wrong shape is a ConfigError. A plugin reading none of these kinds passes
    with nothing to check."""
    from types import SimpleNamespace

    from engine.config import ServerConfig
    from engine.errors import ConfigError, PluginError

    failures: list[str] = []
    parts = QKV_PARTS
    gen = torch.Generator().manual_seed(0)
    dense = qkv_weights(gen)
    x = torch.randn(7, 576, generator=gen)
    for scheme, kw in KIT_SCHEMES.items():
        tensors, qcfg, ref = quantize_state(dense, scheme, **kw)
        try:
            qc = normalized_config(scheme, qcfg)
            top = build(quant_config=qc, config=ServerConfig(), device=torch.device("cpu"),
                        model_config=SimpleNamespace(weights_format="safetensors",
                                                     quantization_config=qc))
        except (ConfigError, PluginError):
            continue  # not a kind this plugin reads
        tensors = dict(top.checkpoint_weights(iter(tensors.items())))
        method = top.for_layer("model.layers.0.self_attn.qkv_proj")
        if method is None:
            failures.append(f"{scheme}: for_layer left a quantized layer dense")
            continue
        layer = load_fused_layer(method, tensors, "model.layers.0.self_attn", parts, 576)
        w = torch.cat([ref[k] for k in dense])
        got, want = layer(x), (x.double() @ w.double().T).float()
        scale = (x.abs() @ w.abs().T).max().item()
        tol = (0.05 if scheme in ACTIVATION_QUANTIZED else 1e-5) * scale
        err = (got - want).abs().max().item()
        if err > tol:
            failures.append(f"{scheme}: max error {err:.3g} against the dequantized reference "
                            f"(allowed {tol:.3g})")
        if getattr(layer.quant_method, "batch_invariant", False):
            rows = torch.cat([layer(x[i:i + 1]) for i in range(x.shape[0])])
            if not torch.equal(rows, got):
                failures.append(f"{scheme}: says batch_invariant, but rows depend on the batch")
        bad = dict(tensors)
        key = next(k for k in bad if k.startswith("model.layers.0.self_attn.k_proj.")
                   and not k.endswith((".g_idx", ".weight_shape", "input_scale",
                                       "weight_scale_2", "quant_map", "nested_offset")))
        bad[key] = torch.cat([bad[key], bad[key]])
        try:
            load_fused_layer(top.for_layer("model.layers.0.self_attn.qkv_proj"), bad,
                             "model.layers.0.self_attn", parts, 576)
            failures.append(f"{scheme}: {key} of the wrong shape loaded without an error")
        except ConfigError:
            pass
    return failures
