"""Every extension point of engine, with its contract.

Plugins implement these hooks with ``engine.api.hookimpl`` and import the types named here from
:mod:`engine.api` (the whole public plugin API).

A selected plugin's implementation object (the ``implementation`` of its manifest: a module or
an instance carrying ``@hookimpl`` functions) is registered with the plugin manager and called
through these hooks, so pluggy validates argument names at registration and ``--trace-plugins``
can time every call.

Family hooks are ``firstresult`` and are always called on one plugin: the one the user (or
``auto``) selected for that family. Cross-cutting hooks are called on every registered plugin.
All hook arguments are keyword-only; an implementation may accept any subset of them.
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "engine"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --------------------------------------------------------------------------- family hooks
#
# Every family hook receives ``options``: this plugin's own parsed options
# (:class:`engine.api.Options`; each option its manifest declares, at its default when unset).
# Families whose ``auto`` is a plugin also receive ``delegate(name) -> product``: the product of
# another plugin of the same family, built by the start-up assembly with that plugin's own
# options (and traced like any hook call); an auto plugin picks a name and delegates to it.


@hookspec(firstresult=True)
def engine_create_attention_backend(pool: Any, model_config: Any, config: Any,
                                    options: Any) -> Any:
    """Build the attention backend for one model runner.

    :param pool: the :class:`engine.api.attention.KVPool` (its ``device`` is the model's,
        ``compute_dtype`` the model's activations, ``dtype`` what it stores: the same, or fp8 /
        fp4 bytes under ``--kv-cache-dtype``; ``page_size`` is the configured page size)
    :param model_config: the normalized :class:`engine.api.models.ModelConfig`
    :param config: the frozen :class:`engine.config.ServerConfig` (read-only core settings)
    :return: an :class:`engine.api.attention.AttentionBackend`. It receives one
        :class:`engine.api.attention.Batch` per forward through ``prepare(batch)``, then
        ``forward(...)`` per layer; it writes the new K/V into the paged pool and must never
        silently hand work to another backend.
    """


@hookspec(firstresult=True)
def engine_create_moe_runner(model_config: Any, config: Any, device: Any, options: Any) -> Any:
    """Build the routed-experts runner of a model with sparse layers (called only when
    ``model_config.num_experts`` > 0).

    :param device: the ``torch.device`` the model is built on
    :return: an :class:`engine.api.moe.MoERunner`: one object serves every sparse layer; its
        ``supports(experts)`` is asked per layer at load (a reason fails start-up),
        ``apply(experts, hidden, topk_ids, topk_weights)`` returns the weighted sum of the
        experts' outputs in ``hidden``'s dtype and must match
        :func:`engine.api.moe.torch_reference` (the conformance kit checks it).
    """


@hookspec(firstresult=True)
def engine_create_moe_a2a(model_config: Any, config: Any, options: Any) -> Any:
    """Build the expert-parallel token dispatcher of a model with sparse layers.

    :return: an :class:`engine.api.moe.MoEAllToAll`: ``local_experts(E)`` says which expert
        weights this rank loads; ``dispatch`` gives the runner its tokens with ids local to those
        experts (-1 for the others); ``combine`` returns this rank's tokens' outputs.
    """


@hookspec(firstresult=True)
def engine_create_quant_method(model_config: Any, config: Any, quant_config: Any,
                               device: Any, options: Any) -> Any:
    """Build the quantization method for linear layers.

    :param quant_config: the checkpoint's ``quantization_config`` dict (a GGUF file's is
        ``{"quant_method": "gguf", "weight_types": [...]}``), or ``None``
    :param device: the ``torch.device`` the model is built on
    :return: an :class:`engine.api.quant.QuantMethod`: ``for_layer(name)`` (the method per
        layer, or None for a dense layer), ``create_weights(layer, ...)``,
        ``process_weights_after_loading(layer)``, ``apply(layer, x, bias)``; optionally
        ``native_kernel(layer)`` (an :class:`engine.api.quant.NativeKernel`: a C function equal
        to ``apply`` for up to its ``rows`` float32 rows, which lets the CPU decode plan run the
        layer). Raise :class:`engine.api.PluginError` with the reason when it cannot serve this
        model on this device. Quantized GGUF tensors reach a parameter's ``weight_loader`` as
        :class:`engine.api.quant.PackedWeight` blocks.
    """


@hookspec(firstresult=True)
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: Any) -> Any:
    """Build a draft-token proposer (:class:`engine.api.speculative.Proposer`), once the target
    model is loaded.

    :param context: an :class:`engine.api.speculative.SpecContext`: the user's step, top-k and
        width values (None when unset), the draft-model loader and the target's embedding and
        head
    :return: the proposer; raise :class:`engine.api.ConfigError` for a combination it cannot
        serve (its reason is printed at start-up, exit status 2)
    """


@hookspec(firstresult=True)
def engine_create_hicache_storage(config: Any, options: Any, storage_config: Any) -> Any:
    """Build the KV page store behind the host tier (called once, at start-up, when
    ``--enable-hierarchical-cache`` and ``--hicache-storage-backend`` are set).

    :param storage_config: the :class:`engine.api.hicache.StorageConfig`: value length, the
        model/layout identity the keys belong to, and the backend's part of
        ``--hicache-storage-backend-extra-config``
    :return: an :class:`engine.api.hicache.HiCacheStorage`. Raise
        :class:`engine.api.PluginError` with the reason when the store cannot be reached or
        configured (missing service, bad extra config): the server refuses to start with it.
    """


@hookspec(firstresult=True)
def engine_create_eviction_policy(config: Any, options: Any, params: Any) -> Any:
    """Build the radix cache's eviction order (called once, at start-up).

    :param params: the ``--radix-eviction-policy-config`` JSON object (a dict, empty when
        unset): the policy's tuning parameters
    :return: an :class:`engine.api.eviction.EvictionPolicy`; raise
        :class:`engine.api.ConfigError` naming an unknown or invalid parameter.
    """


@hookspec(firstresult=True)
def engine_create_reasoning_parser(options: Any, chat_template: str | None,
                                   delegate: Any) -> Any:
    """Return a factory that builds one reasoning parser per response. Called once, at
    start-up; the factory is kept with the server and called per response.

    :param chat_template: the served model's chat template source, or ``None`` when unknown;
        ``auto`` detects its parser from it, others may read whether it pre-opens reasoning
    :return: a callable ``factory(*, chat_template_kwargs: dict, reasoning_effort: str | None)
        -> engine.api.parsers.ReasoningParser`` (the request decides whether reasoning is on)
    """


@hookspec(firstresult=True)
def engine_create_tool_parser(options: Any, chat_template: str | None, delegate: Any) -> Any:
    """Return a factory that builds one tool-call parser per response (called once, at
    start-up).

    :return: a callable ``factory(*, tools: list[dict]) -> engine.api.parsers.ToolParser``;
        ``tools`` is the request's OpenAI ``tools`` array.
    """


@hookspec(firstresult=True)
def engine_create_grammar_backend(tokenizer: Any, vocab_size: int, config: Any,
                                  options: Any) -> Any:
    """Build the grammar backend of constrained decoding (called once, at start-up).

    :param tokenizer: the served model's tokenizer (:class:`engine.models.tokenizer.Tokenizer`):
        ``tokenizer.backend`` its ``tokenizers`` (Rust) tokenizer (None for a Python-only one),
        ``tokenizer.hf`` its transformers tokenizer (loaded on first access: a backend that can
        work from ``backend`` starts faster), ``tokenizer.special_tokens()`` its special tokens
        by text, ``tokenizer.eos_token_ids`` the ids that end a generation
    :param vocab_size: the width of the model's logits (may exceed the tokenizer's length)
    :param config: the frozen :class:`engine.config.ServerConfig` (read-only core settings)
    :return: an :class:`engine.api.grammar.GrammarBackend`: ``compile(spec)`` (thread-safe,
        called off the scheduler thread; raises :class:`engine.api.grammar.InvalidGrammar`
        with the library's message) and ``matcher(compiled)`` (one per sequence).
    """


@hookspec(firstresult=True)
def engine_parse_model_config(model_path: str, config: Any, options: Any, delegate: Any) -> Any:
    """Read a model directory or file into a :class:`engine.api.models.ModelConfig`.

    :return: the config, or ``None`` when this parser does not recognise the path.
    """


# --------------------------------------------------------------------------- cross-cutting hooks


@hookspec
def engine_register_architectures(registry: Any) -> None:
    """Add model architectures: ``registry.register("LlamaForCausalLM", "module:Class")``.

    Called on every registered plugin before the model is built; the registry imports the class
    only when that architecture is served.
    """


@hookspec
def engine_startup(config: Any) -> None:
    """Called once after the runtime is built and before the server accepts requests."""


@hookspec
def engine_shutdown() -> None:
    """Called once when the server stops."""


@hookspec
def engine_on_request(request: Any) -> None:
    """Observe a request as it is admitted (read-only)."""


@hookspec
def engine_after_forward(batch: Any, next_token_ids: Any) -> None:
    """Observe a forward step after sampling (read-only). Only called when implemented."""
