"""Start-up assembly: from the frozen config to the typed products the runtime and server use.

This is the one place a family choice is turned into an object. The sequence, from argv:

1. ``engine serve`` builds the :class:`~engine.plugins.registry.Registry` (discovery: manifests
   only) and parses argv + ``--config`` YAML into the frozen
   :class:`~engine.config.ServerConfig`; an unknown, unavailable or unserved choice is refused
   there with its reason (exit status 2).
2. :class:`Assembly` takes that config: it parses the model config with the chosen
   ``model_config_parser``, then resolves every other family choice once against the model's
   features and this machine (exact name, ``name@distribution``, ``auto``), and logs the picks.
3. The runtime asks the assembly for products as their inputs come to exist: the quantization
   method (model config + device), the architecture table, the attention backends (the KV
   pool), the parser factories (the tokenizer's chat template), the grammar backend (the
   tokenizer) and the cross-cutting observers.
   Each family hook receives its plugin's own :class:`~engine.api.Options`; an ``auto`` plugin
   receives ``delegate(name)`` to build another plugin of its family the same way.

There is one plugin manager per process that serves, so ``--trace-plugins`` (flag or YAML key)
sees every hook call. Nothing is resolved per request, and no runtime component holds the
registry.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from engine.config import ServerConfig
from engine.errors import ConfigError, NoAnswerError, PluginError
from engine.plugins.discovery import PluginRecord
from engine.plugins.families import FAMILIES, family_for_flag
from engine.plugins.manifest import Options
from engine.plugins.registry import Registry

if TYPE_CHECKING:
    import torch

    from engine.models.config import ModelConfig
    from engine.models.registry import ArchitectureRegistry

log = logging.getLogger("engine.assembly")

#: flags that only mean something for a model with routed experts
_SPARSE_ONLY = ("moe_runner_backend", "moe_a2a_backend")


@dataclass(frozen=True)
class ParserFactories:
    """The chat parsers of a server, built once: ``reasoning(chat_template_kwargs=...,
    reasoning_effort=...)`` and ``tool(tools=...)`` build one parser per response."""

    reasoning: Callable[..., Any] | None = None
    tool: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Observers:
    """The cross-cutting hooks of the selected plugins; ``None`` where no plugin implements
    one (nothing is called on the hot path then)."""

    startup: Callable[[ServerConfig], None]
    shutdown: Callable[[], None]
    on_request: Callable[[Any], None] | None = None
    after_forward: Callable[[Any, list[int]], None] | None = None


def refuse_unserved(config: ServerConfig) -> None:
    """Raise :class:`ConfigError` when a family flag whose runtime consumer does not exist yet
    is set to anything but its default (the choice would otherwise be silently ignored)."""
    for dest, (fam, fl) in family_for_flag().items():
        value = getattr(config, dest)
        if fam.unserved and value is not None and value != fl.default:
            raise ConfigError(f"{fl.flag} {value}: not served by this build: {fam.unserved}")


class Assembly:
    """Resolves the family choices of one config and builds their products (see the module
    docstring for the order). ``chosen`` maps each flag to the plugin serving it."""

    def __init__(self, config: ServerConfig, registry: Registry | None = None) -> None:
        self.config = config
        self.registry = registry if registry is not None else Registry()
        refuse_unserved(config)
        if config.trace_plugins:
            self.registry.enable_trace()
        self.chosen: dict[str, PluginRecord] = {}

    # ------------------------------------------------------------------ generic

    def options(self, record: PluginRecord) -> Options:
        """``record``'s options: what the user set, else the manifest's defaults."""
        values = {o.dest: o.default for o in record.manifest.options} if record.manifest else {}
        for key, value in self.config.options_for(record.qualified).items():
            if value is not None:
                values[key] = value
        return Options(values)

    def build(self, record: PluginRecord, **kwargs: Any) -> Any:
        """Call ``record``'s family hook with its options (and ``delegate`` where the hook
        takes one) plus ``kwargs``; return the product."""
        hook = FAMILIES[record.family].hook
        args = dict(kwargs, options=self.options(record))
        if "delegate" in self.registry.hook_argnames(hook):
            args["delegate"] = lambda name: self.build(
                self.registry.resolve(record.family, name), **kwargs)
        return self.registry.call_family_hook(record, **args)

    def choose(self, dest: str, *, model_features: frozenset[str] | None = None,
               fallback: str | None = None) -> PluginRecord | None:
        """The plugin serving flag ``dest`` (``fallback``: the flag whose value applies when
        this one is unset); ``None`` when the family is off. A flag is resolved once: later
        calls return the first answer."""
        fam, fl = family_for_flag()[dest]
        if fl.flag in self.chosen:
            return self.chosen[fl.flag]
        label, value = fl.flag, getattr(self.config, dest)
        if value is None and fallback is not None:
            label, value = family_for_flag()[fallback][1].flag, getattr(self.config, fallback)
        unset = value is None
        if unset:
            if fam.auto is None:
                return None
            value = "auto"
        if fam.unserved and value == fl.default:
            return None
        try:
            record = self.registry.resolve(fam.name, value, flag=label,
                                           model_features=model_features)
        except PluginError as exc:
            if unset and fam.optional:
                return None
            raise ConfigError(str(exc)) from None
        self.chosen[fl.flag] = record
        return record

    def resolve_all(self, model_features: frozenset[str]) -> None:
        """Resolve every family choice against the model once (an unavailable one is refused
        here, before any weight is loaded) and log the picks."""
        fallbacks = {"prefill_attention_backend": "attention_backend",
                     "decode_attention_backend": "attention_backend"}
        for dest in family_for_flag():
            if dest == "quantization":
                continue  # the checkpoint may name the method: see quant_method
            if dest in _SPARSE_ONLY and "moe" not in model_features:
                self._note_unused(dest)
                continue
            self.choose(dest, model_features=model_features, fallback=fallbacks.get(dest))
        for flag, rec in self.chosen.items():
            log.info("%s %s (%s %s)", flag, rec.name, rec.distribution, rec.version)

    def _note_unused(self, dest: str) -> None:
        fam, fl = family_for_flag()[dest]
        value = getattr(self.config, dest)
        if value is not None and value != fl.default:
            log.warning("%s %s: the model has no routed experts; the flag has no effect",
                        fl.flag, value)

    # ------------------------------------------------------------------ products

    def model_config(self) -> "ModelConfig":
        """Parse the model path with the chosen model-config parser, apply
        ``--json-model-override-args``, then resolve every other choice against it."""
        from engine.models.config import resolve_model_path

        path = resolve_model_path(self.config.model_path)
        record = self.choose("model_config_parser")
        assert record is not None, "the model-config family always has a choice"
        try:
            model_config = self.build(record, model_path=path, config=self.config)
        except NoAnswerError:
            raise ConfigError(f"--model-path {path}: not a model the {record.name} model-config "
                              "parser recognises") from None
        if self.config.json_model_override_args:
            try:
                overrides = json.loads(self.config.json_model_override_args)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"--json-model-override-args: not JSON: {exc}") from None
            if not isinstance(overrides, dict):
                raise ConfigError("--json-model-override-args: expected a JSON object")
            model_config = model_config.override(overrides)
        self.resolve_all(model_config.features)
        return model_config

    def quant_method(self, model_config: "ModelConfig", device: "torch.device") -> Any:
        """The quantization method of the linear layers, or ``None`` for dense weights.

        ``--quantization`` wins; otherwise the checkpoint's ``quantization_config`` names the
        method. A method named by the checkpoint that cannot run here is an error, except for
        GGUF blocks, which the loader can dequantize itself: those load dense, and the log says
        why.
        """
        cfg = self.config
        name, quant_cfg = cfg.quantization, model_config.quantization_config
        detected = name is None and bool(quant_cfg)
        if detected:
            name = str(quant_cfg.get("quant_method", ""))
        if name is None:
            return None
        kwargs = dict(model_config=model_config, config=cfg, quant_config=quant_cfg,
                      device=device)
        try:
            record = self.registry.resolve("quantization", name, flag="--quantization")
            method = self.build(record, **kwargs)
        except PluginError as exc:
            if not detected:
                raise ConfigError(str(exc)) from None
            if model_config.weights_format != "gguf" or cfg.load_format not in ("auto", "gguf"):
                raise ConfigError(f"the checkpoint is quantized with {name!r} and no installed "
                                  f"quantization plugin serves it here ({exc})") from None
            log.info("GGUF blocks are dequantized to dense %s weights (%s)", cfg.dtype, exc)
            return None
        self.chosen["--quantization"] = record
        log.info("quantization: %s (%s)", name,
                 "named by the checkpoint" if detected else "--quantization")
        return method

    def experts(self, model_config: "ModelConfig", device: "torch.device") -> Any:
        """(runner, all-to-all) of the sparse layers, or ``None`` for a dense model."""
        if model_config.num_experts <= 0:
            return None
        features = model_config.features
        runner_rec = self.choose("moe_runner_backend", model_features=features)
        a2a_rec = self.choose("moe_a2a_backend", model_features=features)
        assert runner_rec is not None and a2a_rec is not None, "a served model's MoE choices"
        runner = self.build(runner_rec, model_config=model_config, config=self.config,
                            device=device)
        a2a = self.build(a2a_rec, model_config=model_config, config=self.config)
        log.info("experts: %d routed (top-%d), runner %s, all-to-all %s",
                 model_config.num_experts, model_config.num_experts_per_tok, runner_rec.name,
                 a2a_rec.name)
        return runner, a2a

    def architectures(self) -> "ArchitectureRegistry":
        """The architecture table: the core's, plus what the selected plugins register."""
        from engine.models.registry import ArchitectureRegistry

        table = ArchitectureRegistry()
        self.registry.broadcast("engine_register_architectures", registry=table)
        return table

    def attention_backends(self, pool: Any, model_config: "ModelConfig") -> tuple[Any, Any]:
        """The (prefill, decode) attention backends over ``pool``: one object when both flags
        resolve to one plugin. Their names are ``self.chosen``'s."""
        features = model_config.features
        prefill = self.choose("prefill_attention_backend", model_features=features,
                              fallback="attention_backend")
        decode = self.choose("decode_attention_backend", model_features=features,
                             fallback="attention_backend")
        assert prefill is not None and decode is not None, "attention always has a choice"
        built: dict[str, Any] = {}
        for rec in (prefill, decode):
            if rec.qualified not in built:
                built[rec.qualified] = self.build(rec, pool=pool, model_config=model_config,
                                                  config=self.config)
        log.info("attention: prefill %s, decode %s", prefill.name, decode.name)
        return built[prefill.qualified], built[decode.qualified]

    def speculative(self, runner: Any) -> Any:
        """The verify step of ``--speculative-algorithm`` over the loaded target ``runner`` (a
        :class:`~engine.runtime.speculative.SpecDecoder`), or ``None`` when the flag is unset.

        The proposer states what it needs: a tree needs a verify backend that verifies trees;
        lossy acceptance thresholds are refused."""
        if self.config.speculative_algorithm is None:
            return None
        record = self.choose("speculative_algorithm", model_features=runner.model_config.features)
        if record is None:
            return None
        from engine.api.speculative import SpecContext
        from engine.runtime.speculative import SpecDecoder, TargetView, load_draft_runner

        cfg = self.config
        for flag, value in (("--speculative-accept-threshold-single",
                             cfg.speculative_accept_threshold_single),
                            ("--speculative-accept-threshold-acc",
                             cfg.speculative_accept_threshold_acc)):
            if value != 1.0:
                raise ConfigError(f"{flag} {value}: only 1.0 is served (a lower threshold "
                                  "accepts tokens the target would not draw: lossy)")
        for flag, value in (("--speculative-num-steps", cfg.speculative_num_steps),
                            ("--speculative-eagle-topk", cfg.speculative_eagle_topk),
                            ("--speculative-num-draft-tokens", cfg.speculative_num_draft_tokens)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} {value}: must be at least 1")
        target = TargetView(runner)
        context = SpecContext(
            num_steps=cfg.speculative_num_steps, eagle_topk=cfg.speculative_eagle_topk,
            num_draft_tokens=cfg.speculative_num_draft_tokens, device=runner.device,
            target=target,
            draft_loader=lambda: load_draft_runner(cfg, runner, self.registry))
        proposer = self.build(record, model_config=runner.model_config, config=cfg,
                              context=context)
        backend = runner.verify_backend
        if proposer.drafts_trees and not backend.supports_tree_verify:
            name = self.chosen[f"--{cfg.speculative_attention_mode}-attention-backend"].name
            raise ConfigError(
                f"--speculative-algorithm {record.name} drafts trees, and the "
                f"{cfg.speculative_attention_mode} attention backend {name} cannot verify a "
                "tree (no custom mask); use --speculative-eagle-topk 1 (a chain) or a backend "
                "with tree verify (torch_native)")
        log.info("speculative: %s (%s %s): %s", record.name, record.distribution,
                 record.version, proposer.describe())
        return SpecDecoder(proposer, runner, target)

    def parser_factories(self, chat_template: str | None) -> ParserFactories:
        """The reasoning and tool-call parser factories (``None`` where the flag is unset)."""
        made: dict[str, Any] = {}
        for dest in ("reasoning_parser", "tool_call_parser"):
            record = self.choose(dest)
            if record is not None:
                made[dest] = self.build(record, chat_template=chat_template)
        return ParserFactories(reasoning=made.get("reasoning_parser"),
                               tool=made.get("tool_call_parser"))

    def grammar_backend_name(self) -> str | None:
        """The chosen grammar backend (:meth:`grammar_backend` builds it), or None."""
        record = self.choose("grammar_backend")
        return record.name if record is not None else None

    def grammar_backend(self, tokenizer: Any, vocab_size: int) -> Any:
        """The grammar backend of constrained decoding (an
        :class:`engine.api.grammar.GrammarBackend`), built once the tokenizer is loaded;
        ``None`` when ``--grammar-backend`` is unset and no grammar plugin is available."""
        record = self.choose("grammar_backend")
        if record is None:
            return None
        return self.build(record, tokenizer=tokenizer, vocab_size=vocab_size, config=self.config)

    def eviction_policy(self) -> Any:
        """The radix cache's eviction order (an :class:`engine.api.eviction.EvictionPolicy`)
        from ``--radix-eviction-policy`` and ``--radix-eviction-policy-config``."""
        record = self.choose("radix_eviction_policy")
        if record is None:
            return None
        params = json.loads(self.config.radix_eviction_policy_config or "{}")
        try:
            return self.build(record, config=self.config, params=params)
        except PluginError as exc:
            raise ConfigError(f"--radix-eviction-policy {record.name}: {exc}") from None

    def hicache_storage(self, storage_config: Any) -> Any:
        """The hierarchical cache's store (an :class:`engine.api.hicache.HiCacheStorage`) for
        ``storage_config``, or None when ``--hicache-storage-backend`` is unset. A store that
        cannot be built refuses the start with its reason."""
        record = self.choose("hicache_storage_backend")
        if record is None:
            return None
        try:
            store = self.build(record, config=self.config, storage_config=storage_config)
        except PluginError as exc:
            raise ConfigError(f"--hicache-storage-backend {record.name}: {exc}") from None
        log.info("hicache storage: %s (%s %s)", record.name, record.distribution, record.version)
        return store

    def observers(self) -> Observers:
        """The cross-cutting hooks, bound to this assembly's plugin manager."""
        hook, has = self.registry.pm.hook, self.registry.has_impls
        return Observers(
            startup=lambda config: hook.engine_startup(config=config),
            shutdown=lambda: hook.engine_shutdown(),
            on_request=(lambda request: hook.engine_on_request(request=request))
            if has("engine_on_request") else None,
            after_forward=(lambda batch, ids: hook.engine_after_forward(batch=batch,
                                                                        next_token_ids=ids))
            if has("engine_after_forward") else None)


_standalone: Assembly | None = None


def parser_factory(family: str, name: str, *, chat_template: str | None = None,
                   options: dict[str, Any] | None = None) -> Any:
    """A parser factory by name, outside a server (``engine parse``, the Python parser API,
    tests): built through a default-config assembly kept for the process, with the plugin's
    declared option defaults updated by ``options``. A server builds its own once
    (:meth:`Assembly.parser_factories`)."""
    global _standalone
    if _standalone is None:
        _standalone = Assembly(ServerConfig())
    assembly = _standalone
    record = assembly.registry.resolve(family, name)
    hook_args: dict[str, Any] = {"chat_template": chat_template}
    if options:
        merged = dict(assembly.options(record), **options)
        assembly = Assembly(assembly.config.replace(plugin_options={record.qualified: merged}),
                            assembly.registry)
    return assembly.build(record, **hook_args)
