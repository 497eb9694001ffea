"""The families: every extension point a user chooses on the command line, declared once.

Adding a family is one entry in :data:`FAMILIES`. Everything else reads this table: entry-point
discovery, the ``engine serve`` flags with their help and defaults, the config fields they fill
(:class:`engine.config.ServerConfig`), ``engine plugins list/show``, the scaffold, the
conformance dispatcher, and the start-up assembly (:mod:`engine.assembly`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    """A CLI flag a family serves; its value is a choice name of the family."""

    flag: str
    help: str
    default: str | None = None  #: None: the core decides (auto pick, or the feature is off)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Family:
    """One extension point."""

    name: str  #: key, also the ``family`` field of manifests
    group: str  #: entry-point group
    folder: str  #: where choices live in this repository: ``plugins/<folder>``
    prefix: str  #: distribution prefix after ``engine-``: ``engine-<prefix><choice>``
    flags: tuple[Flag, ...]
    hook: str  #: the family hook in :mod:`engine.plugins.hookspecs` its plugins implement
    interface: str  #: ``"module:attribute"`` in :mod:`engine.api` the hook's product implements
    conformance: str  #: ``"module:function"`` running the family's conformance suite
    #: None when the runtime uses this family's product; else why it does not yet (a choice on
    #: the command line is then refused with this reason instead of being silently ignored)
    unserved: str | None = None
    #: how ``auto`` is resolved when no plugin named ``auto`` is installed:
    #: "priority" (highest-priority available plugin) or None (no auto: unset means off)
    auto: str | None = "priority"
    #: what an unset flag means when ``auto`` is None (listings)
    unset: str = "off unless chosen"
    #: an unset flag whose ``auto`` finds no available plugin means off, not an error (the
    #: runtime serves without the family)
    optional: bool = False
    summary: str = ""
    folder_prefix: str = ""  #: choice folder: ``plugins/<folder>/<folder_prefix><choice>``
    #: choices match whatever their case (``--speculative-algorithm NGRAM`` is ``ngram``)
    ignore_case: bool = False

    @property
    def dist_prefix(self) -> str:
        return "engine-" + self.prefix


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            name="attention",
            group="engine.attention",
            folder="attention",
            prefix="attention-",
            flags=(
                Flag("--attention-backend", "Attention kernels for prefill/extend and decode."),
                Flag(
                    "--prefill-attention-backend",
                    "Attention kernels for prefill/extend batches (overrides --attention-backend).",
                ),
                Flag(
                    "--decode-attention-backend",
                    "Attention kernels for decode batches (overrides --attention-backend).",
                ),
            ),
            hook="engine_create_attention_backend",
            interface="engine.api.attention:AttentionBackend",
            conformance="engine.testing.attention:check",
            summary="paged attention kernels: extend (cached prefix + new tokens) and decode",
        ),
        Family(
            name="moe",
            group="engine.moe",
            folder="moe",
            prefix="moe-",
            flags=(Flag("--moe-runner-backend", "Runner for routed experts.", default="auto"),),
            hook="engine_create_moe_runner",
            interface="engine.api.moe:MoERunner",
            conformance="engine.testing.moe:check_runner",
            summary="routed experts: hidden states + top-k ids/weights -> combined output",
        ),
        Family(
            name="moe_a2a",
            folder_prefix="a2a-",
            group="engine.moe_a2a",
            folder="moe",
            prefix="moe-a2a-",
            flags=(Flag("--moe-a2a-backend", "All-to-all for expert parallelism.", default="none"),),
            hook="engine_create_moe_a2a",
            interface="engine.api.moe:MoEAllToAll",
            conformance="engine.testing.moe:check_a2a",
            auto=None,
            unset="none (every expert on this rank)",
            summary="token dispatch/combine across expert-parallel ranks",
        ),
        Family(
            name="quantization",
            group="engine.quantization",
            folder="quant",
            prefix="quant-",
            flags=(
                Flag(
                    "--quantization",
                    "Quantization method (default: detected from the checkpoint, else none).",
                ),
            ),
            hook="engine_create_quant_method",
            interface="engine.api.quant:QuantMethod",
            conformance="engine.testing.quant:check",
            auto=None,
            unset="the checkpoint's own method (a .gguf: gguf where it can run), else none",
            summary="creates a linear layer's weights, post-processes them, applies the matmul",
        ),
        Family(
            name="speculative",
            group="engine.speculative",
            folder="spec",
            prefix="spec-",
            flags=(Flag("--speculative-algorithm", "Speculative decoding algorithm."),),
            hook="engine_create_speculative_proposer",
            interface="engine.api.speculative:Proposer",
            conformance="engine.testing.speculative:check",
            auto=None,
            ignore_case=True,
            unset="off (plain decoding)",
            summary="proposes draft tokens; the core verifies them in one target forward",
        ),
        Family(
            name="hicache_storage",
            group="engine.hicache_storage",
            folder="cache",
            prefix="cache-",
            flags=(Flag("--hicache-storage-backend",
                        "Storage tier behind the host KV cache (with "
                        "--enable-hierarchical-cache)."),),
            hook="engine_create_hicache_storage",
            interface="engine.api.hicache:HiCacheStorage",
            conformance="engine.testing.hicache:check",
            auto=None,
            summary="page-granular get/set/exists of KV pages keyed by prefix hash",
        ),
        Family(
            name="eviction_policy",
            group="engine.eviction_policy",
            folder="eviction",
            prefix="eviction-",
            flags=(Flag("--radix-eviction-policy",
                        "Order in which cached prefixes are evicted (device and host tiers; "
                        "default: least recently used)."),),
            hook="engine_create_eviction_policy",
            interface="engine.api.eviction:EvictionPolicy",
            conformance="engine.testing.eviction:check",
            auto=None,
            unset="least recently used (the cache's own order, which the lru plugin also gives)",
            summary="scores evictable radix-cache nodes: the lowest is evicted first",
        ),
        Family(
            name="reasoning_parser",
            folder_prefix="reasoning-",
            group="engine.reasoning_parser",
            folder="parsers",
            prefix="reasoning-",
            flags=(Flag("--reasoning-parser", "Splits model output into reasoning and content."),),
            hook="engine_create_reasoning_parser",
            interface="engine.api.parsers:ReasoningParser",
            conformance="engine.testing.reasoning:check",
            auto=None,
            summary="split model text into reasoning and content, whole or streamed",
        ),
        Family(
            name="tool_parser",
            folder_prefix="tool-",
            group="engine.tool_parser",
            folder="parsers",
            prefix="tool-",
            flags=(Flag("--tool-call-parser", "Extracts tool calls from model output."),),
            hook="engine_create_tool_parser",
            interface="engine.api.parsers:ToolParser",
            conformance="engine.testing.tools:check",
            auto=None,
            summary="extract tool calls (name, JSON arguments) from content, whole or streamed",
        ),
        Family(
            name="grammar",
            group="engine.grammar",
            folder="grammar",
            prefix="grammar-",
            flags=(Flag("--grammar-backend", "Choose the backend for grammar-guided decoding."),),
            hook="engine_create_grammar_backend",
            interface="engine.api.grammar:GrammarBackend",
            conformance="engine.testing.grammar:check",
            optional=True,
            summary="compiles JSON schemas, regexes and grammars; masks each step's tokens",
        ),
        Family(
            name="model_config_parser",
            folder_prefix="model-config-",
            group="engine.model_config_parser",
            folder="parsers",
            prefix="model-config-",
            flags=(
                Flag(
                    "--model-config-parser",
                    "Reads a model directory or file into a normalized model config.",
                    default="auto",
                ),
            ),
            hook="engine_parse_model_config",
            interface="engine.api.models:ModelConfig",
            conformance="engine.testing.contract:check",
            summary="model directory -> normalized model config",
        ),
    )
}


def family_for_flag() -> dict[str, tuple[Family, Flag]]:
    """Map each flag's ``dest`` to its family and flag."""
    return {fl.dest: (fam, fl) for fam in FAMILIES.values() for fl in fam.flags}
