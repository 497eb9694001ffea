"""Shared machinery of the model-config parser plugins: HF configs, GGUF metadata, params.json
-> :class:`ModelConfig`. The plugins decide *which* reader applies; the readers live here."""

from __future__ import annotations

import functools
import glob
import json
import os
import weakref
from collections.abc import Sequence
from typing import Any

from engine.errors import ConfigError
from engine.models.config import ModelConfig, eos_tuple
from engine.models.quant_config import read_quant_config

#: HF ``model_type`` / GGUF ``general.architecture`` -> architecture class name
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
               "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM"}


#: GGUF metadata value types -> struct format of one scalar (8: string, 9: array)
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                 11: "q", 12: "d"}
#: GGML tensor types read as typed arrays (the others, BF16 included, as bytes, like gguf-py)
_GGUF_ARRAYS = {"F32": "float32", "F16": "float16", "F64": "float64", "I8": "int8",
                "I16": "int16", "I32": "int32", "I64": "int64"}


class GGUFField:
    """One metadata key's value (``contents()``: an int, float, bool, str or list of them)."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value

    def contents(self) -> Any:
        return self.value


class _Strings(Sequence):
    """A GGUF array of strings, decoded on first access to its items (a 50k-token vocabulary is
    ~0.05 s of decoding that a start with a cached tokenizer never needs); its length is known
    without decoding."""

    def __init__(self, buf: memoryview, start: int, count: int) -> None:
        self._buf, self._start, self._count = buf, start, count
        self._items: list[str] | None = None

    def _decoded(self) -> list[str]:
        if self._items is None:
            import struct

            items, pos, buf = [], self._start, self._buf
            for _ in range(self._count):
                (n,) = struct.unpack_from("<Q", buf, pos)
                items.append(str(buf[pos + 8:pos + 8 + n], "utf-8", "replace"))
                pos += 8 + n
            self._items = items
        return self._items

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):  # type: ignore[override]
        return self._decoded()[index]

    def __iter__(self):
        return iter(self._decoded())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented


class GGUFTensor:
    """One tensor of a GGUF file: ``name``, ``shape`` (GGUF order: fastest-varying first, as
    gguf-py gives it), ``tensor_type`` (``gguf.GGMLQuantizationType``) and ``data``: a numpy view
    of its bytes in the file's copy-on-write memory map (float tensors typed and shaped like
    gguf-py's, quantized ones uint8 ``[rows..., row_bytes]``)."""

    __slots__ = ("data", "name", "shape", "tensor_type")

    def __init__(self, name: str, shape: Any, tensor_type: Any, data: Any) -> None:
        self.name, self.shape, self.tensor_type, self.data = name, shape, tensor_type, data


#: the GGUF files mapped now (:func:`release_pages` only touches their ranges)
_OPEN_MAPS: "weakref.WeakSet[GGUFFile]" = weakref.WeakSet()


def release_pages(t: Any) -> None:
    """Drop this process's resident pages of ``t``, a tensor (or array) of a mapped GGUF file's
    bytes that has been read into a copy and will not be read again: the pages stay in the OS
    page cache (another read maps them back), but no longer count in the process's memory.
    Whole pages inside ``t``'s bytes only; anything not inside a live :class:`GGUFFile` map
    (a copy, an array of another origin) is left alone. Never call it on bytes that were
    written: the map is copy-on-write, and a written page would revert to the file's bytes."""
    import ctypes
    import mmap as _mmap

    try:
        start, size = int(t.data_ptr()), int(t.numel() * t.element_size())
        if not t.is_contiguous():
            return
    except AttributeError:  # a numpy array
        start, size = int(t.ctypes.data), int(t.nbytes)
        if not t.flags.c_contiguous:
            return
    for f in list(_OPEN_MAPS):
        base = int(f.map.ctypes.data)
        if base <= start and start + size <= base + f.map.nbytes:
            break
    else:
        return
    page = _mmap.PAGESIZE
    lo, hi = -(-start // page) * page, (start + size) // page * page
    if hi > lo:
        ctypes.CDLL(None, use_errno=True).madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo),
                                                  _mmap.MADV_DONTNEED)


class GGUFFile:
    """The metadata (``fields``) and tensors of a GGUF file (v2/v3, little-endian).

    The header is parsed with :mod:`struct` straight from the mapped bytes, strings of big
    vocabularies included (tens of milliseconds where ``gguf.GGUFReader`` takes seconds), and
    tensor data are views of one ``np.memmap`` in copy-on-write mode: nothing is read until
    used, pages are shared with the page cache, and the views are writable (so ``torch``
    accepts them without a copy) while writes stay private to the process.
    """

    def __init__(self, path: str) -> None:
        import struct

        import gguf
        import numpy as np

        self.path = path
        self.map = np.memmap(path, mode="c")
        _OPEN_MAPS.add(self)
        buf = memoryview(self.map)  # type: ignore[arg-type]
        unpack = struct.unpack_from
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("no GGUF magic")
        version, n_tensors, n_kv = unpack("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (this reader reads 2 and 3)")
        pos = 24

        def string() -> str:
            nonlocal pos
            (n,) = unpack("<Q", buf, pos)
            pos += 8 + n
            return str(buf[pos - n:pos], "utf-8", "replace")

        def value(kind: int) -> Any:
            nonlocal pos
            if kind == 8:
                return string()
            if kind == 9:
                elem, count = unpack("<IQ", buf, pos)
                pos += 12
                if elem == 8:
                    if count < 256:
                        return [string() for _ in range(count)]
                    start = pos  # a vocabulary or merges: decoded only if read
                    for _ in range(count):
                        (n,) = unpack("<Q", buf, pos)
                        pos += 8 + n
                    return _Strings(buf, start, count)
                if elem == 9:
                    return [value(9) for _ in range(count)]
                fmt = _GGUF_SCALARS[elem]
                items = list(unpack(f"<{count}{fmt}", buf, pos))
                pos += struct.calcsize(f"<{count}{fmt}")
                return items
            fmt = "<" + _GGUF_SCALARS[kind]
            (item,) = unpack(fmt, buf, pos)
            pos += struct.calcsize(fmt)
            return item

        self.fields: dict[str, GGUFField] = {}
        for _ in range(n_kv):
            key = string()
            (kind,) = unpack("<I", buf, pos)
            pos += 4
            self.fields[key] = GGUFField(key, value(kind))
        infos = []
        for _ in range(n_tensors):
            name = string()
            (n_dims,) = unpack("<I", buf, pos)
            dims = unpack(f"<{n_dims}Q", buf, pos + 4)
            kind, offset = unpack("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            infos.append((name, dims, kind, offset))
        align = int(self.fields["general.alignment"].value) \
            if "general.alignment" in self.fields else 32
        start = -(-pos // align) * align
        self.data_offset = start
        self.tensors: list[GGUFTensor] = []
        flat = self.map.view(np.ndarray)  # plain views of the map (np.memmap slices are slow)
        for name, dims, kind, offset in infos:
            qtype = gguf.GGMLQuantizationType(kind)
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            count = 1
            for d in dims:
                count *= d
            nbytes = count // block * type_size
            raw = flat[start + offset:start + offset + nbytes]
            rows = tuple(reversed(dims))
            if qtype.name in _GGUF_ARRAYS:  # as gguf-py types them; everything else is bytes
                data = raw.view(_GGUF_ARRAYS[qtype.name]).reshape(rows)
            else:
                data = raw.reshape(*rows[:-1], rows[-1] // block * type_size)
            self.tensors.append(GGUFTensor(name, np.array(dims, dtype=np.uint64), qtype, data))


@functools.lru_cache(maxsize=2)
def open_gguf(path: str) -> Any:
    """A parsed GGUF file (:class:`GGUFFile`; cached: the config parser, the loader and the
    tokenizer all read it). Files this reader does not parse (GGUF v1, big-endian) fall back to
    ``gguf.GGUFReader``, which reads them all, slowly."""
    import struct

    import gguf

    try:
        return GGUFFile(path)
    except (ValueError, KeyError, IndexError, struct.error):
        pass
    except OSError as exc:
        raise ConfigError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") \
            from None
    try:
        return gguf.GGUFReader(path)
    except Exception as exc:
        raise ConfigError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") \
            from None


def gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def weights_format_of(directory: str) -> str:
    if glob.glob(os.path.join(directory, "*.safetensors")):
        return "safetensors"
    if glob.glob(os.path.join(directory, "*.bin")) or glob.glob(os.path.join(directory, "*.pt")):
        return "pt"
    return "safetensors"  # nothing found: only --load-format dummy will work


def _rope(cfg: Any) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from an HF config of transformers 4.x or 5.x."""
    params = getattr(cfg, "rope_parameters", None) or {}
    scaling = getattr(cfg, "rope_scaling", None) or params
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None)) or 10000.0
    scaling = {k: v for k, v in dict(scaling).items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return float(theta), (None if kind == "default" else scaling)


def from_hf_config(cfg: Any, model_path: str, **extra: Any) -> ModelConfig:
    """A transformers ``PretrainedConfig`` (or anything with its attributes) -> ModelConfig."""
    archs = getattr(cfg, "architectures", None) or []
    architecture = archs[0] if archs else MODEL_TYPES.get(getattr(cfg, "model_type", ""), "")
    if not architecture:
        raise ConfigError(f"{model_path}: config names no architecture")
    heads = cfg.num_attention_heads
    theta, scaling = _rope(cfg)
    dtype = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    qk_norm = architecture.startswith("Qwen3")
    bias = bool(getattr(cfg, "attention_bias", False)) or architecture.startswith("Qwen2")
    fields: dict[str, Any] = dict(
        architecture=architecture, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        vocab_size=cfg.vocab_size, rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
        rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 2048)),
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        attention_bias=bias, qk_norm=qk_norm, hidden_act=getattr(cfg, "hidden_act", "silu"),
        torch_dtype=str(dtype).replace("torch.", "") if dtype is not None else None,
        bos_token_id=getattr(cfg, "bos_token_id", None),
        eos_token_ids=eos_tuple(getattr(cfg, "eos_token_id", None)), model_path=model_path,
        quantization_config=read_quant_config(model_path,
                                              getattr(cfg, "quantization_config", None)),
    )
    fields.update(_moe_fields(cfg, architecture))
    fields.update(extra)
    return ModelConfig(**fields)


def _moe_fields(cfg: Any, architecture: str) -> dict[str, Any]:
    """The routed-expert fields of an HF config (nothing for a dense model).

    Config names differ per family: Mixtral's ``num_local_experts`` and full-width
    ``intermediate_size`` experts (always renormalised); Qwen2/3-MoE's ``num_experts`` and
    ``moe_intermediate_size`` (Qwen2-MoE's ``intermediate_size`` is the shared expert's or dense
    layers' width); OLMoE's ``num_experts`` with ``intermediate_size`` experts, whole-projection
    q/k norms and ``clip_qkv``.
    """
    experts = int(getattr(cfg, "num_local_experts", 0) or getattr(cfg, "num_experts", 0) or 0)
    fields: dict[str, Any] = {}
    if architecture.startswith("Olmoe"):
        fields.update(qk_norm=True, qk_norm_scope="full", clip_qkv=getattr(cfg, "clip_qkv", None))
    if experts <= 0:
        return fields
    width = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    fields.update(
        num_experts=experts, num_experts_per_tok=int(cfg.num_experts_per_tok),
        moe_intermediate_size=int(width),
        norm_topk_prob=bool(getattr(cfg, "norm_topk_prob", architecture.startswith("Mixtral"))),
        shared_expert_intermediate_size=int(getattr(cfg, "shared_expert_intermediate_size", 0)
                                            or 0),
        decoder_sparse_step=int(getattr(cfg, "decoder_sparse_step", 1) or 1),
        mlp_only_layers=tuple(int(i) for i in getattr(cfg, "mlp_only_layers", None) or ()))
    fields["shared_expert_gate"] = fields["shared_expert_intermediate_size"] > 0 and \
        architecture.startswith("Qwen2Moe")
    if architecture.startswith("Mixtral"):
        fields["norm_topk_prob"] = True
    return fields


def refuse_remote_code(directory: str) -> None:
    """Raise :class:`ConfigError` when ``config.json`` needs the model's own code: it names
    custom classes (``auto_map``) for a ``model_type`` transformers does not know. This server
    runs its own architectures only and never runs a model's code, ``--trust-remote-code`` or
    not; a known type with an ``auto_map`` loads as that type."""
    from transformers import CONFIG_MAPPING

    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError):
        return  # AutoConfig reports it
    if isinstance(raw, dict) and raw.get("auto_map") and \
            raw.get("model_type") not in CONFIG_MAPPING:
        raise ConfigError(f"{directory}: config.json needs the model's own code (auto_map for "
                          f"model_type {raw.get('model_type')!r}); this server runs its own "
                          "architectures only and never runs a model's code, "
                          "--trust-remote-code or not")


def read_hf_dir(directory: str) -> ModelConfig:
    """``config.json`` through transformers' AutoConfig (offline)."""
    from transformers import AutoConfig

    refuse_remote_code(directory)
    try:
        cfg = AutoConfig.from_pretrained(directory, local_files_only=True)
    except Exception as exc:
        raise ConfigError(f"{directory}: cannot read config.json ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    gen = os.path.join(directory, "generation_config.json")
    extra: dict[str, Any] = {"weights_format": weights_format_of(directory)}
    if os.path.isfile(gen):
        with open(gen) as fh:
            eos = json.load(fh).get("eos_token_id")
        if eos is not None:
            extra["eos_token_ids"] = eos_tuple(eos)
    return from_hf_config(cfg, directory, **extra)


def read_gguf(path: str) -> ModelConfig:
    """The metadata of a ``.gguf`` file (llama.cpp keys) -> ModelConfig."""
    reader = open_gguf(path)
    arch = gguf_field(reader, "general.architecture")
    if arch not in MODEL_TYPES:
        raise ConfigError(f"{path}: GGUF architecture {arch!r} is not supported "
                          f"({', '.join(MODEL_TYPES)})")
    name = str(gguf_field(reader, "general.name", "")).lower()
    architecture = "MistralForCausalLM" if arch == "llama" and "mistral" in name \
        else MODEL_TYPES[arch]

    def key(suffix: str, default: Any = None) -> Any:
        return gguf_field(reader, f"{arch}.{suffix}", default)

    tensors = {t.name for t in reader.tensors}
    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    tokens = gguf_field(reader, "tokenizer.ggml.tokens")
    vocab = key("vocab_size") or (len(tokens) if tokens is not None else None)
    scaling = None
    if key("rope.scaling.type") in ("linear",):
        scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    eos = gguf_field(reader, "tokenizer.ggml.eos_token_id")
    eot = gguf_field(reader, "tokenizer.ggml.eot_token_id")
    eos_ids = tuple(dict.fromkeys(int(x) for x in (eos, eot) if x is not None))
    return ModelConfig(
        architecture=architecture, hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")), num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length", key("rope.dimension_count", hidden // heads))),
        vocab_size=int(vocab), rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(key("rope.freq_base", 10000.0)), rope_scaling=scaling,
        max_position_embeddings=int(key("context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=eos_ids, model_path=os.path.dirname(os.path.abspath(path)),
        weights_format="gguf", gguf_file=os.path.basename(path),
        quantization_config={"quant_method": "gguf", "weight_types": sorted(
            {t.tensor_type.name for t in reader.tensors})},
    )


def gguf_in(directory: str) -> str | None:
    """The one ``.gguf`` in a directory without config.json, else None."""
    files = sorted(glob.glob(os.path.join(directory, "*.gguf")))
    return files[0] if len(files) == 1 else None


def read_mistral_params(directory: str) -> ModelConfig:
    """Mistral's native ``params.json`` (dim, n_layers, head_dim, hidden_dim, n_heads...)."""
    path = os.path.join(directory, "params.json")
    try:
        with open(path) as fh:
            p = json.load(fh)
        heads = int(p["n_heads"])
        return ModelConfig(
            architecture="MistralForCausalLM", hidden_size=int(p["dim"]),
            intermediate_size=int(p["hidden_dim"]), num_hidden_layers=int(p["n_layers"]),
            num_attention_heads=heads, num_key_value_heads=int(p.get("n_kv_heads", heads)),
            head_dim=int(p.get("head_dim") or int(p["dim"]) // heads),
            vocab_size=int(p["vocab_size"]), rms_norm_eps=float(p.get("norm_eps", 1e-5)),
            rope_theta=float(p.get("rope_theta", 10000.0)),
            max_position_embeddings=int(p.get("max_seq_len", p.get("max_position_embeddings",
                                                                     32768))),
            tie_word_embeddings=bool(p.get("tied_embeddings", False)),
            bos_token_id=1, eos_token_ids=(2,), model_path=directory,
            weights_format=weights_format_of(directory),
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except KeyError as exc:
        raise ConfigError(f"{path}: missing field {exc}") from None
