"""Every reference ``serve`` option and what ``engine serve`` does with it: the status table.

The options themselves (spellings, kind, choices, default, help) are
:data:`engine.cli.reference_options.OPTIONS`, generated from the reference help text. Each gets
one status:

* ``implemented``: a :class:`~engine.config.ServerConfig` field serves it (the field's flag or
  one of its aliases is the reference flag);
* ``family``: a plugin family flag (:data:`engine.plugins.families.FAMILIES`) or an option a
  plugin declares (:data:`PLUGIN_OPTIONS`);
* ``accepted``: :data:`ACCEPTED` — a value that changes nothing here; start-up says so. With
  ``values``, only those are accepted (a parallelism size at 1) and others are refused;
* ``not yet``: :data:`NOT_YET` — what it needs. Set to anything but its default, it is refused
  (exit 2) with that reason.

Imported by ``engine serve`` only (it is plain data: no torch, no plugin import).
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass
from typing import Any, Callable

from engine.cli.reference_options import OPTIONS

IMPLEMENTED, FAMILY = "implemented", "family"
ACCEPTED_STATUS, NOT_YET_STATUS = "accepted", "not yet"
STATUSES = (IMPLEMENTED, ACCEPTED_STATUS, FAMILY, NOT_YET_STATUS)


@dataclass(frozen=True)
class Accept:
    """An option accepted as a no-op: ``why`` it changes nothing; ``values`` (converted with
    ``type``) the only values accepted, or empty for any value."""

    why: str
    values: tuple[Any, ...] = ()
    type: Callable[[str], Any] | None = None


_ONE_DEVICE = "one server runs one model replica on one device"

ACCEPTED: dict[str, Accept] = {
    "--trust-remote-code": Accept(
        "no remote code is ever run: models use this server's own architectures, and a model "
        "whose config names custom code (auto_map) is refused"),
    "--revision": Accept("models load from local paths only; a revision names no version of a "
                         "local directory"),
    "--download-dir": Accept("models load from local paths only; nothing is downloaded"),
    "--file-storage-path": Accept("this server has no file endpoints; nothing is stored"),
    "--enable-metrics": Accept("Prometheus metrics are always served at /metrics"),
    "--tokenizer-backend": Accept("the HuggingFace tokenizers library is the one backend",
                                  ("huggingface",)),
    "--tokenizer-worker-num": Accept("tokenizing runs in the server process", (1,), int),
    "--detokenizer-worker-num": Accept("detokenizing runs in the scheduler thread", (1,), int),
    "--gpu-id-step": Accept("one GPU per server (--base-gpu-id); the step spaces the GPUs of "
                            "further ranks, and there are none", (), int),
    "--nnodes": Accept(_ONE_DEVICE, (1,), int),
    "--node-rank": Accept(_ONE_DEVICE, (0,), int),
    "--tp-size": Accept(_ONE_DEVICE, (1,), int),
    "--pp-size": Accept(_ONE_DEVICE, (1,), int),
    "--dp-size": Accept(_ONE_DEVICE, (1,), int),
    "--dcp-size": Accept(_ONE_DEVICE, (1,), int),
    "--attn-dp-size": Accept(_ONE_DEVICE, (1,), int),
    "--attn-cp-size": Accept(_ONE_DEVICE, (1,), int),
    "--moe-dp-size": Accept(_ONE_DEVICE, (1,), int),
    "--ep-size": Accept(_ONE_DEVICE, (1,), int),
    "--dwdp-size": Accept(_ONE_DEVICE, (1,), int),
    "--enable-p2p-check": Accept(_ONE_DEVICE + "; there is no peer access to check"),
    "--disable-custom-all-reduce": Accept(_ONE_DEVICE + "; there is no all-reduce"),
    "--enforce-disable-flashinfer-allreduce-fusion": Accept(
        _ONE_DEVICE + "; there is no all-reduce"),
    "--disable-aiter-allreduce-fusion-in-prefill": Accept(_ONE_DEVICE + "; there is no all-reduce"),
    "--disable-aiter-allreduce-fusion-in-decode": Accept(_ONE_DEVICE + "; there is no all-reduce"),
    "--sleep-on-idle": Accept("the scheduler always sleeps on its inbox when idle"),
    "--speculative-use-rejection-sampling": Accept(
        "drafts are deterministic proposals, for which the sampled verify already is the "
        "rejection rule (accept with the target's probability, else draw from the rest)"),
}

#: options of the reference that a plugin declares (its manifest's ``Option``): flag -> plugin
PLUGIN_OPTIONS: dict[str, str] = {
    "--triton-attention-reduce-in-fp32": "attention.triton",
    "--triton-attention-num-kv-splits": "attention.triton",
    "--triton-attention-split-tile-size": "attention.triton",
    "--constrained-json-whitespace-pattern": "grammar.llguidance",
    "--constrained-json-disable-any-whitespace": "grammar.llguidance",
    "--constrained-json-max-whitespace-cnt": "grammar.xgrammar",
    "--speculative-ngram-min-bfs-breadth": "speculative.ngram",
    "--speculative-ngram-max-bfs-breadth": "speculative.ngram",
    "--speculative-ngram-match-type": "speculative.ngram",
    "--speculative-ngram-max-trie-depth": "speculative.ngram",
    "--speculative-ngram-capacity": "speculative.ngram",
    "--speculative-dflash-block-size": "speculative.dflash",
    "--uno-lora-path": "speculative.uno",
    "--speculative-dspark-block-size": "speculative.dspark",
}

#: what each remaining option needs: reason -> flags (a trailing ``*`` matches a prefix)
NOT_YET: dict[str, tuple[str, ...]] = {
    "multi-GPU and multi-node parallelism: " + _ONE_DEVICE: (
        "--nccl-port", "--dist-timeout", "--dist-init-addr", "--gated-launch-port",
        "--pp-max-micro-batch-size", "--pp-async-batch-depth", "--load-balance-method",
        "--dcp-comm-backend", "--dcp-replicate-q-proj", "--enable-prefill-cp", "--cp-strategy",
        "--enable-dsa-cache-layer-split", "--enable-cp-decode-attn-tp",
        "--enable-kv-cache-sharding", "--enable-dp-attention-local-control-broadcast",
        "--enable-dp-lm-head", "--enable-tp-lm-head-all-to-all", "--enable-attn-tp-input-scattered",
        "--enable-shared-experts-attn-tp", "--shared-experts-tp-size", "--enable-dense-mlp-attn-tp",
        "--enable-layernorm-sp", "--disable-attn-tp-gather", "--use-ray", "--enable-nccl-nvls",
        "--enable-symm-mem", "--enable-mscclpp", "--enable-torch-symm-mem", "--pre-warm-nccl",
        "--boundary-reduction", "--enable-quant-communications",
        "--flashinfer-allreduce-fusion-backend", "--enable-aiter-allreduce-fusion",
        "--enable-dp-attention", "--enable-flashinfer-allreduce-fusion",
        "--enable-fused-moe-sum-all-reduce", "--enable-scattered-sconv", "--moe-dense-tp-size",
        "--enable-two-batch-overlap", "--enable-single-batch-overlap",
        "--tbo-token-distribution-threshold", "--enable-metrics-for-all-schedulers",
        "--sm-group-num", "--numa-node"),
    "this speculative decoding option is not built (drafts come from --speculative-algorithm "
    "with one draft model in the target's process; see docs/architecture.md)": (
        "--speculative-draft-attention-backend",
        "--speculative-dsa-topk-backend", "--speculative-draft-kv-cache-dtype",
        "--speculative-draft-window-size", "--speculative-draft-sink-size",
        "--speculative-moe-*", "--speculative-enable-w4a4-mxfp4-megamoe",
        "--speculative-skip-dp-mlp-sync", "--speculative-adaptive*",
        "--speculative-ngram-external-*", "--speculative-domino-*",
        "--speculative-use-block-verification", "--spec-trace-dir", "--decoupled-spec-*",
        "--enable-multi-layer-eagle"),
    "DSPARK's ragged verify (compact, cap-accept) is not built: it schedules verify lengths from "
    "a trained confidence head; this build verifies the whole block (static mode)": (
        "--speculative-dspark-sps-table-path", "--speculative-dspark-confidence-sts-path",
        "--speculative-dspark-align-verify-tokens-to-graph-tier"),
    "expert parallelism across ranks, EPLB, DeepEP and shared-expert fusion: this build runs every "
    "routed expert in one process (--moe-runner-backend, --moe-a2a-backend none)": (
        "--enable-w4a4-mxfp4-megamoe", "--deepep-*", "--flashinfer-mxfp4-moe-precision",
        "--fuseep-mode", "--ep-*", "--init-expert-location", "--enable-eplb", "--eplb-*",
        "--expert-distribution-recorder-*", "--expert-balancedness-report-mode", "--elastic-ep-*",
        "--enable-elastic-expert-backup", "--mooncake-ib-device", "--enable-waterfill",
        "--max-ep-size", "--disable-flashinfer-cutlass-moe-fp4-allgather",
        "--disable-shared-experts-fusion", "--enforce-shared-experts-fusion",
        "--enable-return-routed-experts", "--kt-*", "--flashinfer-a2a-dispatch-type"),
    "hybrid models (Mamba, linear attention, sliding window): only full-attention decoders are "
    "built": (
        "--*mamba-*", "--max-mamba-cache-size", "--int8-mamba-ckpt-size", "--linear-attn-*",
        "--enable-linear-replayssm*", "--linear-replayssm-cache-len", "--swa-full-tokens-ratio",
        "--disable-hybrid-swa-memory", "--enable-page-major-kv-layout", "--enable-unified-memory",
        "--swa-prefix-tails", "--enable-encoder-swa-bounded-replay",
        "--enable-decoder-swa-bounded-replay"),
    "DeepSeek MLA/sparse attention models are not built (one Llama-family decoder)": (
        "--dsa-*", "--dsv4-*", "--enable-deepseek-v4-fp4-indexer", "--c128-page-size",
        "--qsa-indexer-dtype", "--enable-dsa-fused-indexer", "--flashinfer-mla-disable-ragged",
        "--disable-chunked-prefix-cache", "--enable-return-indexer-topk",
        "--enable-linker-mla-dedup", "--enable-lean-attention"),
    "other external KV caches are not integrated (the hierarchical cache and its storage "
    "family serve this)": (
        "--enable-unified-cache-external-linker",
        "--unified-cache-external-linker-backend", "--enable-lmcache", "--lmcache-config-file",
        "--enable-flexkv", "--flexkv-config-file", "--enable-hisparse", "--hisparse-config"),
    "multimodal inputs: requests carry text or token ids only": (
        "--enable-multimodal", "--mm-*", "--enable-broadcast-mm-inputs-process",
        "--enable-prefix-mm-cache", "--allowed-media-domains", "--media-url-max-file-size-mb",
        "--trust-mm-content-hashes", "--limit-mm-data-per-request", "--enable-mm-global-cache",
        "--image-processor-backend", "--disable-fast-image-processor",
        "--enable-precise-embedding-interpolation", "--asr-*", "--encoder-*", "--language-only",
        "--language-model-only", "--enable-adaptive-dispatch-to-encoder"),
    "LoRA adapters are not built": (
        "--enable-lora*", "--max-lora-*", "--lora-*", "--experts-shared-outer-loras",
        "--max-loaded-loras", "--max-loras-per-batch"),
    "prefill/decode disaggregation: one server runs both": (
        "--disaggregation-*", "--num-reserved-decode-tokens", "--optimistic-prefill-attempts",
        "--enable-pdmux", "--pdmux-config-path", "--enable-pd-role-switch",
        "--engine-info-bootstrap-port"),
    "diffusion language models are not built": ("--dllm-*",),
    "quantization toolkits are not integrated; quantized checkpoints load through "
    "--quantization": (
        "--modelopt-*", "--quantize-and-serve", "--rl-quant-profile"),
    "the only quantized KV caches are fp8 (--kv-cache-dtype), read by the attention "
    "backends directly": ("--prefill-kv-cache-dequant-dtype",),
    "weights load once, from local files, with the built-in loader": (
        "--model-loader-extra-config", "--startup-weight-load-mode", "--custom-weight-loader",
        "--weight-loader-*", "--remote-instance-weight-loader-*", "--modelexpress-config",
        "--model-checksum", "--delete-ckpt-after-loading", "--decrypted-config-file",
        "--decrypted-draft-config-file", "--checkpoint-engine-wait-weights-before-ready",
        "--weight-cache-*", "--enable-memory-saver", "--enable-weights-cpu-backup",
        "--enable-draft-weights-cpu-backup", "--cpu-offload-gb", "--offload-*", "--ple-offload-*",
        "--weight-version"),
    "CUDA graphs are captured per decode batch-size bucket and per prefill token-count "
    "bucket (breakable at attention); these settings are not built": (
        "--cuda-graph-*", "--enable-profile-cuda-graph", "--enable-cudagraph-gc"),
    "kernel choices beyond the attention backend and quantization are not pluggable yet": (
        "--fp8-gemm-backend", "--fp4-gemm-backend", "--bf16-gemm-backend",
        "--disable-flashinfer-autotune", "--flashinfer-autotune-skip-ops",
        "--enable-torch-compile*",
        "--torch-compile-max-bs", "--enable-fused-qk-norm-rope", "--sampling-backend",
        "--radix-cache-backend", "--enable-tf32-matmul", "--enable-fp32-lm-head", "--enable-mis",
        "--mlx-enable-sampling"),
    "this grammar option is not built (the grammar family compiles each constraint once and "
    "caches it in memory)": ("--sampling-mask-max-tokens", "--disable-outlines-disk-cache"),
    "this scheduling feature is not built (continuous batching with chunked prefill and a "
    "radix cache)": (
        "--prefill-decode-interval", "--enable-dynamic-chunking", "--prefill-max-requests",
        "--disable-priority-preemption", "--abort-on-priority-when-disabled",
        "--priority-scheduling-preemption-threshold",
        "--prefill-only-disable-kv-cache", "--num-continuous-decode-steps",
        "--scheduler-recv-interval", "--enable-prefill-delayer", "--prefill-delayer-*",
        "--min-free-slots-delay", "--batch-notify-size"),
    "the server speaks HTTP/1.1 only (no gRPC, HTTP/2 or sidecar)": (
        "--smg-grpc-mode", "--grpc-mode", "--grpc-port", "--sidecar", "--sidecar-args",
        "--enable-http2", "--http2-*", "--smg-http-sidecar-port", "--grpc-response-timeout-secs"),
    "TLS is not built: serve behind a TLS-terminating proxy": ("--ssl-*", "--enable-ssl-refresh"),
    "this HTTP server feature is not built": (
        "--fastapi-root-path", "--warmups", "--log-level-http", "--log-requests-target",
        "--uvicorn-access-log-exclude-prefixes", "--stream-response-default-include-usage",
        "--return-input-ids", "--return-output-ids", "--enable-response-store", "--tool-server",
        "--enable-streaming-session", "--enable-session-radix-cache", "--enable-watermark",
        "--watermark-config"),
    "chat template choices beyond --chat-template are not built": (
        "--trust-request-chat-template", "--hf-chat-template-name",
        "--default-chat-template-kwargs", "--strip-thinking-cache", "--enable-strict-thinking"),
    "metrics are the built-in Prometheus set at /metrics; they are not configurable yet": (
        "--enable-mfu-metrics", "--load-snapshot-publish-interval", "--tokenizer-metrics-*",
        "--extra-metric-labels", "--bucket-*", "--prompt-tokens-buckets",
        "--generation-tokens-buckets", "--gc-warning-threshold-secs", "--decode-log-interval",
        "--kv-events-config", "--load-publish-endpoint",
        "--enable-forward-pass-metrics", "--export-metrics-to-file*"),
    "OpenTelemetry tracing is not built": (
        "--enable-trace", "--trace-modules", "--otlp-traces-endpoint", "--otlp-service-name"),
    "debugging dumps and hooks are not built": (
        "--debug-tensor-dump-*", "--forward-hooks", "--msprobe-dump-config", "--kv-canary*",
        "--crash-dump-folder", "--enable-return-hidden-states", "--return-hidden-states-mode",
        "--enable-layerwise-nvtx-marker", "--gc-threshold"),
    "tokenizing runs in the server process, one request at a time": (
        "--enable-dynamic-batch-tokenizer", "--dynamic-batch-tokenizer-*",
        "--enable-tokenizer-batch-encode", "--disable-tokenizer-batch-decode"),
    "each architecture has one implementation, this server's own": ("--model-impl",),
    "reinforcement-learning integration is not built": ("--rl-on-policy-target",),
}


#: implemented options whose reference lists choices this server does not serve: flag -> why.
#: Those choices parse (they are the reference's) and are refused with the reason, exit 2.
_LOADER = ("weights load once, from local safetensors, pt or gguf files (or dummy weights), "
           "with the built-in loader")
UNSERVED_CHOICES: dict[str, str] = {
    "--load-format": _LOADER,
    "--speculative-draft-load-format": _LOADER,
}


@dataclass(frozen=True)
class RefOption:
    """One reference option, its status here, and (for accepted / family / not yet) why."""

    flag: str
    aliases: tuple[str, ...]
    kind: str  #: switch, negatable, value, list, optlist, optional
    metavar: str | None
    choices: tuple[str, ...]
    default: Any
    help: str
    status: str
    reason: str = ""

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)


def not_yet_reason(flag: str) -> str | None:
    """The :data:`NOT_YET` reason naming ``flag`` (an exact entry first, else the longest
    matching pattern), or None."""
    best: tuple[int, str] | None = None
    for reason, patterns in NOT_YET.items():
        for pat in patterns:
            if pat == flag:
                return reason
            if pat.endswith("*") and fnmatch.fnmatchcase(flag, pat) and \
                    (best is None or len(pat) > best[0]):
                best = (len(pat), reason)
    return best[1] if best else None


@functools.lru_cache(maxsize=1)
def surface() -> tuple[RefOption, ...]:
    """Every reference option with its status, in the reference's order."""
    from engine.config import core_fields, flag_of
    from engine.plugins.families import family_for_flag

    fields: dict[str, str] = {}
    for f in core_fields():
        if not f.metadata.get("family"):
            for spelling in (flag_of(f), *f.metadata["aliases"]):
                fields[spelling] = f.name
    families = {fl.flag: fam.name for fam, fl in family_for_flag().values()}
    out = []
    for flag, aliases, kind, metavar, choices, default, help_text in OPTIONS:
        spellings = (flag, *aliases)
        if any(s in fields for s in spellings):
            status, reason = IMPLEMENTED, ""
        elif flag in families:
            status, reason = FAMILY, f"the {families[flag]} plugin family"
        elif flag in PLUGIN_OPTIONS:
            status, reason = FAMILY, f"an option of the {PLUGIN_OPTIONS[flag]} plugin"
        elif flag in ACCEPTED:
            status, reason = ACCEPTED_STATUS, ACCEPTED[flag].why
        else:
            status, reason = NOT_YET_STATUS, not_yet_reason(flag) or ""
        out.append(RefOption(flag, aliases, kind, metavar, choices, default, help_text, status,
                             reason))
    return tuple(out)


def by_spelling() -> dict[str, RefOption]:
    """Every spelling of every reference option -> the option."""
    return {s: o for o in surface() for s in o.spellings}


def counts() -> dict[str, int]:
    """How many reference options have each status (and ``total``)."""
    table = surface()
    out = {s: sum(1 for o in table if o.status == s) for s in STATUSES}
    out["total"] = len(table)
    return out
