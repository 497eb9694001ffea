"""Build the model of a :class:`ModelConfig` and fill its weights.

Formats: ``safetensors`` (memory-mapped), ``pt`` (``torch.load(mmap=True, weights_only=True)``),
``gguf`` (memory-mapped; quantized tensors arrive as :class:`PackedWeight` blocks, views of the
map: a quantization method that reads them keeps them packed, so does the token embedding
(:class:`~engine.runtime.linear.Embedding`) unless a tied head reads its dense table, every
other parameter gets them dequantized to float32 by the ``gguf`` package: Q4_0, Q4_1, Q8_0,
K-quants...; F16/F32 tensors arrive dense), ``dummy`` (random, seeded by ``--random-seed``).
Checkpoint tensors are yielded under HF names; GGUF and Mistral-native names are mapped, and their Q/K rows (stored in
the interleaved-rotary order) are permuted back to the rotate-half order the model uses.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from typing import Any, Iterator

import torch

from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.models.config import ModelConfig
from engine.models.parsing import open_gguf, release_pages
from engine.models.registry import ArchitectureRegistry
from engine.runtime.linear import PackedWeight, QuantMethod

log = logging.getLogger("engine.models")

Weights = Iterator[tuple[str, "torch.Tensor | PackedWeight"]]

_GGUF_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight",
                "rope_freqs.weight": "model.rotary.freq_factors"}
_GGUF_BLOCK = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_NATIVE_GLOBAL = {"tok_embeddings.weight": "model.embed_tokens.weight",
                  "norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_NATIVE_BLOCK = {"attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                 "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
                 "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
                 "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
                 "feed_forward.w2": "mlp.down_proj"}
_BLOCK = re.compile(r"^(?:blk|layers)\.(\d+)\.(.+)\.(weight|bias)$")


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a Q or K projection from interleaved-pair rotary order (llama.cpp GGUF, Meta and
    Mistral native checkpoints) to the rotate-half order: per head, rows (0,1),(2,3)... become
    (0, d/2), (1, d/2+1)..."""
    rest = w.shape[1:]
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *rest).transpose(1, 2).reshape(w.shape)


def _mapped(name: str, globals_: dict[str, str], blocks: dict[str, str]) -> str | None:
    if name in globals_:
        return globals_[name]
    m = _BLOCK.match(name)
    if m and m.group(2) in blocks:
        return f"model.layers.{m.group(1)}.{blocks[m.group(2)]}.{m.group(3)}"
    return None


def _fix_qk(hf_name: str, t: Any, cfg: ModelConfig) -> Any:
    heads = (cfg.num_attention_heads if ".self_attn.q_proj." in hf_name
             else cfg.num_key_value_heads if ".self_attn.k_proj." in hf_name else None)
    if heads is None:
        return t
    # one gather of whole rows (a strided 4-d copy of uint8 blocks is ~100x slower)
    rows = t.shape[0]
    order = unpermute_rows(torch.arange(rows), heads)
    if isinstance(t, PackedWeight):  # rows of blocks permute like rows of values
        out = t.map_rows(lambda data: data.index_select(0, order))
        release_pages(t.data)  # the file's bytes were read into the copy
        return out
    return t.index_select(0, order)


#: GGUF types that arrive as dense tensors (everything else is block-quantized)
_GGUF_DENSE = ("F32", "F16", "BF16", "F64")


def _gguf_tensor(t: Any) -> "torch.Tensor | PackedWeight":
    """One GGUF tensor without copying its bytes where the layout allows: packed blocks and
    float32 tensors are views of the file's copy-on-write map (:class:`GGUFFile`); other
    float types are converted."""
    import gguf

    shape = tuple(int(x) for x in reversed(t.shape.tolist()))
    data = t.data if t.data.flags.writeable else t.data.copy()  # gguf.GGUFReader: read-only
    if t.tensor_type.name not in _GGUF_DENSE and len(shape) == 2:
        return PackedWeight(torch.from_numpy(data.reshape(shape[0], -1)), t.tensor_type.name,
                            (shape[0], shape[1]))
    if t.tensor_type.name == "F32":
        return torch.from_numpy(data.reshape(shape))
    array = gguf.dequantize(data, t.tensor_type).reshape(shape)
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def gguf_weights(cfg: ModelConfig) -> Weights:
    """The GGUF's tensors under HF names: dense tensors, or :class:`PackedWeight` blocks."""
    reader = open_gguf(cfg.weights_path)
    permuted = str(reader.fields["general.architecture"].contents()) == "llama"
    for t in reader.tensors:
        name = _mapped(t.name, _GGUF_GLOBAL, _GGUF_BLOCK)
        if name is None:
            raise ConfigError(f"{cfg.weights_path}: unexpected GGUF tensor {t.name!r}")
        tensor = _gguf_tensor(t)
        yield name, _fix_qk(name, tensor, cfg) if permuted else tensor


def _files(directory: str, patterns: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for pattern in patterns:
        found += sorted(glob.glob(os.path.join(directory, pattern)))
    return [f for f in found if not os.path.basename(f).startswith("training_args")]


def _native(name: str, t: torch.Tensor, cfg: ModelConfig) -> tuple[str, torch.Tensor] | None:
    """HF names pass through; Mistral/Meta native names are mapped and their Q/K un-permuted."""
    if name.startswith(("model.", "lm_head.")):
        return name, t
    hf = _mapped(name, _NATIVE_GLOBAL, _NATIVE_BLOCK)
    return None if hf is None else (hf, _fix_qk(hf, t, cfg))


def safetensors_weights(cfg: ModelConfig) -> Weights:
    from safetensors import safe_open

    files = _files(cfg.model_path, ("*.safetensors",))
    if not files:
        raise ConfigError(f"{cfg.model_path}: no *.safetensors files (use --load-format)")
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as fh:
            for key in fh.keys():
                item = _native(key, fh.get_tensor(key), cfg)
                if item is not None:
                    yield item


def pt_weights(cfg: ModelConfig) -> Weights:
    files = _files(cfg.model_path, ("*.bin", "*.pt", "*.pth"))
    if not files:
        raise ConfigError(f"{cfg.model_path}: no *.bin/*.pt/*.pth weight files")
    for path in files:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        for key, tensor in state.items():
            item = _native(key, tensor, cfg)
            if item is not None:
                yield item
        del state


def dummy_init(model: torch.nn.Module, seed: int) -> None:
    """Normal(0, 0.02) weights, ones for norms, zeros for biases; reproducible from ``seed`` on
    a given device kind (values are drawn on the parameter's device, so an 8B model initializes
    in seconds on a GPU). A quantized layout (a config's ``quantization_config``): fp8 codes
    drawn so, the scales of floating-point formats ones (each weight then what its codes say),
    integer codes and their parameters zeros."""
    gens: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        data = param.data
        if name.endswith("norm.weight"):
            data.fill_(1.0)
        elif name.endswith(".bias") or not data.is_floating_point():
            data.zero_()
        elif _SCALE.search(name):
            data.fill_(1.0)
        else:
            dev = param.device
            if dev not in gens:
                gens[dev] = torch.Generator(device=dev).manual_seed(seed)
            if data.element_size() == 1:  # fp8 codes: drawn in float32, then rounded
                data.copy_(torch.empty(data.shape, device=dev).normal_(0.0, 0.02,
                                                                       generator=gens[dev]))
            else:
                data.normal_(0.0, 0.02, generator=gens[dev])


#: parameters that scale a layer's codes (``weight_scale``, ``weight_scale_inv``,
#: ``input_scale``, ``k_scale``...)
_SCALE = re.compile(r"(^|[._])(weight|input|k|v|output)_scale(_inv|_2)?$")


def weights_iterator(cfg: ModelConfig, load_format: str) -> Weights:
    fmt = cfg.weights_format if load_format == "auto" else load_format
    if fmt == "gguf":
        if not cfg.gguf_file:
            raise ConfigError(f"--load-format gguf: {cfg.model_path} is not a .gguf file")
        return gguf_weights(cfg)
    if fmt == "safetensors":
        return safetensors_weights(cfg)
    if fmt == "pt":
        return pt_weights(cfg)
    raise ConfigError(f"--load-format {fmt}: unknown format")


def load_model(cfg: ModelConfig, config: ServerConfig, device: torch.device,
               dtype: torch.dtype, *, architectures: ArchitectureRegistry | None = None,
               quant_method: QuantMethod | None = None,
               experts: tuple[Any, Any] | None = None) -> torch.nn.Module:
    """The model of ``cfg`` on ``device`` in ``dtype`` with its weights, in eval mode.

    ``architectures``: the table to find ``cfg.architecture`` in (default: the core's);
    ``quant_method``: the linear layers' method (default: dense weights); ``experts``: the MoE
    (runner, all-to-all) when ``cfg`` has routed experts.
    """
    cls = (architectures or ArchitectureRegistry()).resolve(cfg.architecture)
    method = quant_method
    extra: dict[str, Any] = {} if experts is None else {"experts": experts}
    with torch.device(device):
        model = cls(cfg, dtype=dtype, quant=method.for_layer if method is not None else None,
                    **extra)
    model.quant_method = method
    if config.load_format == "dummy":
        dummy_init(model, config.random_seed)
    else:
        weights = weights_iterator(cfg, config.load_format)
        model.load_weights(weights if method is None else method.checkpoint_weights(weights))
    model.process_weights_after_loading()
    return model.eval()
