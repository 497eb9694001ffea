"""The one frozen server configuration, built once from the command line (and ``--config`` YAML).

Every core option is a field of :class:`ServerConfig`; its flag, help and converter live in the
field's metadata, so argparse, YAML validation and the dataclass cannot drift apart. Family flags
(``--attention-backend``...) are fields too, generated from the family table
(:data:`engine.plugins.families.FAMILIES`); their choices come from the installed plugins.
Plugin-specific options land in ``plugin_options["<family>.<name>"]``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_size(text: str) -> int:
    """``'4096'``, ``'1k'`` -> 1000, ``'25.6k'`` -> 25600, ``'1Ki'`` -> 1024."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|k|M|G|T)?\s*", str(text))
    if not m:
        raise ValueError(f"not a size: {text!r}")
    num, suffix = m.groups()
    if suffix in _IEC:
        if "." in num:
            raise ValueError(f"decimals are not allowed with IEC suffixes: {text!r}")
        return int(num) * _IEC[suffix]
    value = float(num) * _SI.get(suffix or "", 1)
    if value != int(value):
        raise ValueError(f"not a whole number: {text!r}")
    return int(value)


def parse_list(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``'a.example, b.example'`` (or a YAML list) -> ``('a.example', 'b.example')``."""
    items = text.split(",") if isinstance(text, str) else [str(t) for t in text]
    return tuple(t.strip() for t in items if t.strip())


def parse_json_object(text: str) -> str:
    """A JSON object given as text, checked and kept as text (the config stays hashable)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    return text


def parse_extra_config(text: str) -> str:
    """A JSON object, or ``@path`` of a JSON/YAML/TOML file holding one; kept as given (read
    with :func:`load_extra_config`)."""
    if not text.startswith("@"):
        return parse_json_object(text)
    load_extra_config(text)
    return text


def load_extra_config(text: str | None) -> dict[str, Any]:
    """The object of :func:`parse_extra_config`'s ``text`` (``{}`` for None)."""
    if not text:
        return {}
    if not text.startswith("@"):
        return json.loads(text)
    path = text[1:]
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    if path.endswith(".toml"):
        import tomllib

        value: Any = tomllib.loads(raw.decode())
    elif path.endswith((".yaml", ".yml")):
        import yaml

        value = yaml.safe_load(raw)
    else:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected an object")
    return value


def _opt(default: Any, help: str, *, type: Callable[[str], Any] | None = str,
         flag: str | None = None, aliases: tuple[str, ...] = (), choices: tuple[Any, ...] = (),
         family: str | None = None, nargs: str | None = None) -> Any:
    """A config field: ``type`` converts one command-line value (None: a switch); ``nargs``
    ``"+"`` takes one or more values (a tuple); ``choices`` restrict the converted value."""
    meta = {"help": help, "type": type, "flag": flag, "aliases": aliases, "choices": choices,
            "family": family, "nargs": nargs}
    return field(default=default, metadata=meta)


def _with_family_fields(cls: type) -> type:
    """Add one ``str | None`` field per family flag of
    :data:`engine.plugins.families.FAMILIES`, with the table's default and help."""
    from engine.plugins.families import family_for_flag

    for dest, (fam, fl) in family_for_flag().items():
        cls.__annotations__[dest] = "str | None"
        setattr(cls, dest, _opt(fl.default, fl.help, flag=fl.flag, family=fam.name))
    return cls


@dataclass(frozen=True)
@_with_family_fields
class ServerConfig:
    """Everything ``engine serve`` was asked to do. Frozen: built once, read everywhere."""

    # model
    model_path: str | None = _opt(
        None, "Model directory (config.json + safetensors) or .gguf file; default: the bundled "
        "SmolLM2-135M-Instruct Q4_1 GGUF.", aliases=("--model",))
    tokenizer_path: str | None = _opt(None, "Tokenizer directory (default: the model's).")
    tokenizer_mode: str = _opt("auto", "auto: the fast (Rust) tokenizer; slow: the Python "
                               "tokenizer where the model has one.", choices=("auto", "slow"))
    chat_template: str | None = _opt(
        None, "Chat template for /v1/chat/completions: a Jinja file, or the template itself "
        "(default: the tokenizer's).")
    skip_tokenizer_init: bool = _opt(False, "Load no tokenizer; requests must give input_ids.",
                                      type=None)
    is_embedding: bool = _opt(
        False, "Serve the model as an embedding model: /v1/embeddings answers the normalized "
        "final hidden state of each input's last token; the generation endpoints are refused.",
        type=None)
    load_format: str = _opt("auto", "Weights format.",
                            choices=("auto", "safetensors", "pt", "gguf", "dummy"))
    dtype: str = _opt("auto", "Weights and activations dtype (auto: float32 on CPU, the "
                      "checkpoint's 16-bit type on GPU).",
                      choices=("auto", "half", "float16", "bfloat16", "float", "float32"))
    kv_cache_dtype: str = _opt(
        "auto", "KV cache storage: auto (the model dtype, unless the quantization method asks "
        "for another: a GGUF with int8 activations on CPU stores float16), bf16/bfloat16, "
        "fp8_e4m3/fp8_e5m2 (stored divided by the per-layer k/v scales of "
        "--quantization-param-path or the checkpoint, else 1.0, and dequantized on read by "
        "backends that support it); fp4_mx_block16 (4-bit E2M1 values with a power-of-two "
        "scale per 16, read by torch_native, flex_attention and triton); mxfp8 and nvfp4 need "
        "SM100 GPUs.",
        choices=("auto", "fp8_e4m3", "fp8_e5m2", "bf16", "bfloat16", "fp4_mx_block16", "mxfp8",
                 "nvfp4"))
    quantization_param_path: str | None = _opt(
        None, "JSON file of per-layer KV cache scaling factors for an fp8 KV cache "
        "({\"kv_cache\": {\"dtype\": \"float8_e4m3fn\", \"scaling_factor\": {\"0\": "
        "{\"<layer>\": <scale>}}}}: one tensor-parallel rank, every layer; the one scale "
        "serves k and v). Overrides the checkpoint's scales; unused (with a warning) when the KV "
        "cache is not fp8.")
    context_length: int | None = _opt(None, "Maximum context length (default: the model's); "
                                      "accepts 1k, 32Ki...", type=parse_size)
    device: str = _opt("auto", "Device: auto, cpu, cuda, cuda:N.")
    served_model_name: str | None = _opt(None, "Model name reported by the API.")
    json_model_override_args: str | None = _opt(None, "JSON object overriding model config fields.")
    random_seed: int = _opt(0, "Seed for dummy weights and unseeded sampling.", type=int)
    enable_deterministic_inference: bool = _opt(
        False, "Batch-invariant inference: a request's tokens and logprobs do not depend on the "
        "other requests batched with it (matmuls row by row or with row-invariant kernels, "
        "attention one token at a time, sampling row by row; slower). Needs an attention "
        "backend with a batch-invariant path (torch_native).", type=None)
    # memory and scheduling
    mem_fraction_static: float | None = _opt(
        None, "Fraction of free device memory for weights + KV cache (GPU); on CPU, of a "
        "2 GiB KV budget (at most 64Ki tokens).", type=float)
    max_total_tokens: int | None = _opt(None, "KV cache capacity in tokens (overrides "
                                        "--mem-fraction-static). Default on CPU: one full "
                                        "context (--context-length, else the model's context "
                                        "up to 8192 tokens).", type=parse_size)
    page_size: int = _opt(1, "Tokens per KV cache page.", type=int)
    chunked_prefill_size: int | None = _opt(None, "Longest prefill chunk in tokens "
                                            "(default 2048 on CPU, 8192 on GPU; -1 disables).",
                                            type=int)
    max_running_requests: int | None = _opt(None, "Most requests in a running batch.", type=int)
    max_queued_requests: int | None = _opt(None, "Most waiting requests; beyond it HTTP 503.",
                                           type=int)
    max_prefill_tokens: int = _opt(16384, "Most new tokens in one prefill batch.", type=int)
    schedule_policy: str = _opt(
        "fcfs", "Order of waiting requests: fcfs (arrival), lpm (longest cached prefix), "
        "random, dfs-weight (shared prefixes together, largest groups first), lof (longest "
        "output first), priority (the request's priority, then arrival), routing-key (the "
        "request's routing_key, keys already running first), hrrn (highest response ratio), "
        "shortest-prefill-first (fewest uncached prompt tokens).",
        choices=("fcfs", "lpm", "random", "dfs-weight", "lof", "priority", "routing-key", "hrrn",
                 "shortest-prefill-first"))
    enable_priority_scheduling: bool = _opt(
        False, "Order waiting requests by their priority first (higher first), then by "
        "--schedule-policy.", type=None)
    default_priority_value: int = _opt(0, "Priority of a request that gives none (default 0).",
                                       type=int)
    schedule_low_priority_values_first: bool = _opt(
        False, "Lower priority values run first.", type=None)
    schedule_conservativeness: float = _opt(
        1.0, "Scales the decode room a new request must leave free for the running ones "
        "(default 1.0; larger: fewer retractions, smaller batches).", type=float)
    retraction_policy: str | None = _opt(
        None, "Which running request a full KV cache retracts: length (longest prompt, then "
        "shortest output), priority (lowest priority); default: the most recently admitted.",
        choices=("length", "priority"))
    disable_radix_cache: bool = _opt(False, "Turn off prefix reuse.", type=None)
    radix_eviction_policy_config: str | None = _opt(
        None, "Tuning parameters of --radix-eviction-policy, a JSON object (slru: "
        "protected_threshold; tlru: threshold, next_prompt_estimate).", type=parse_json_object)
    # hierarchical KV cache (engine.runtime.hiradix_cache)
    enable_hierarchical_cache: bool = _opt(
        False, "Keep prefixes evicted from the device KV pool in a host pool, and behind it in "
        "--hicache-storage-backend.", type=None)
    hicache_ratio: float | None = _opt(
        None, "Host KV pool size as a multiple of the device pool (default 2.0; 1.2 with "
        "--hicache-host-memory-mode buffer_only).", type=float)
    hicache_host_memory_fraction: float | None = _opt(
        None, "With neither --hicache-ratio nor --hicache-size: the fraction of the host's "
        "available memory (also bounded by cgroup limits, less a 10 GiB reserve) the host pool "
        "may use; the default ratio shrinks until the pool fits.", type=float)
    hicache_host_memory_mode: str = _opt(
        "cache", "cache: the host pool is a persistent tier between the device and storage; "
        "buffer_only: it only stages pages between the device and the storage backend (needs "
        "--hicache-storage-backend): a page written to storage, or loaded to the device, "
        "leaves it.", choices=("cache", "buffer_only"))
    hicache_size: float = _opt(0.0, "Host KV pool size in GB (overrides --hicache-ratio; 0: "
                               "use the ratio).", type=float)
    hicache_write_policy: str = _opt(
        "write_through", "When device pages are copied to the host tier: write_through (when "
        "cached), write_through_selective (on the second hit), write_back (when evicted).",
        choices=("write_back", "write_through", "write_through_selective"))
    hicache_io_backend: str | None = _opt(
        None, "Host<->device copies: direct (runs of pages; on a GPU the copy engines, one 2-D "
        "copy per run covering several layers, so loads overlap the forward), kernel (on a GPU "
        "one Triton gather/scatter over pinned host memory, using the multiprocessors; on CPU "
        "index copies). Default: direct on a GPU, kernel on CPU (the faster measured on each).",
        choices=("direct", "kernel", "kernel_ascend"))
    hicache_mem_layout: str = _opt(
        "layer_first", "Host pool layout: layer_first (as the device pool), page_first / "
        "page_first_direct (each page contiguous: stores read and write it in place).",
        choices=("layer_first", "page_first", "page_first_direct", "page_first_kv_split",
                 "page_head"))
    hicache_storage_prefetch_policy: str = _opt(
        "best_effort", "How long admission waits for pages being fetched from storage: "
        "best_effort (not at all), wait_complete (until fetched, at most prefetch_timeout_max), "
        "timeout (a budget growing with the prompt).",
        choices=("best_effort", "wait_complete", "timeout"))
    hicache_storage_prefetch_retry_poll_interval: int = _opt(
        0, "Scheduling passes a queued request whose storage read found none of its pages "
        "waits before that read is issued again (a backup, by another server sharing the "
        "store, may still be committing); 0: no retries.", type=int)
    hicache_storage_prefetch_retry_max_attempts: int = _opt(
        3, "Storage reads a queued request may issue again; past them it is admitted with what "
        "the faster tiers hold (0: none).", type=int)
    hicache_storage_backend_extra_config: str | None = _opt(
        None, "Storage backend settings: a JSON object, or @FILE (JSON, YAML or TOML). The core "
        "reads prefetch_threshold, prefetch_timeout_base/_per_ki_token/_max; the rest goes to "
        "the backend.", type=parse_extra_config)
    enable_mixed_chunk: bool = _opt(
        False, "Let a prefill chunk of any size share its forward with the running requests' "
        "decode tokens (by default only prefills of at most 128 new tokens do, and larger ones "
        "alternate with decode steps); not with a prefill attention backend that pads every "
        "request of an extend batch to the longest (torch_native).", type=None)
    disable_overlap_schedule: bool = _opt(
        False, "On a GPU, do not prepare the next step while the current forward runs (the "
        "overlap scheduler reads each step's tokens back one step later).", type=None)
    disable_cuda_graph: bool = _opt(
        False, "Run every step eagerly on GPU (no CUDA graphs for decode, prefill or "
        "speculative verify).", type=None)
    disable_decode_cuda_graph: bool = _opt(
        False, "Run decode steps eagerly on GPU (prefill graphs stay).", type=None)
    cuda_graph_backend_prefill: str = _opt(
        "breakable", "Prefill forwards on GPU: 'breakable' replays everything but attention "
        "from CUDA graphs, one per layer gap and token-count bucket (attention runs eagerly "
        "between them, with the batch's own lengths); 'disabled' runs them eagerly. 'full' "
        "(attention inside the graph) is not built.", choices=("full", "breakable", "disabled"))
    disable_prefill_cuda_graph: bool = _opt(
        False, "Run prefill forwards eagerly (--cuda-graph-backend-prefill disabled).",
        type=None)
    cuda_graph_max_bs_prefill: int | None = _opt(
        None, "Most tokens of a prefill forward replayed from the breakable graphs (default "
        "1024; a longer forward's device work outlasts its launches, and it runs eagerly).",
        type=int)
    cuda_graph_bs_prefill: tuple[int, ...] | None = _opt(
        None, "Prefill token counts to capture (default: every 16 up to 256, then every 32 up "
        "to --cuda-graph-max-bs-prefill); a forward is padded to the smallest that holds it.",
        type=int, nargs="+")
    disable_cuda_graph_padding: bool = _opt(
        False, "Replay a CUDA graph only for a batch of exactly a captured size (decode and "
        "verify: requests; prefill: tokens); other batches run eagerly instead of padded.",
        type=None)
    debug_cuda_graph: bool = _opt(
        False, "Run prefill forwards through the breakable graphs' breaks, buffers and padding "
        "without capturing them (each operation eager).", type=None)
    cuda_graph_max_bs_decode: int | None = _opt(
        None, "Largest decode batch replayed from a CUDA graph (default: --max-running-requests, "
        "up to 256).", type=int)
    cuda_graph_bs_decode: tuple[int, ...] | None = _opt(
        None, "Decode batch sizes to capture CUDA graphs for (default: 1 2 4 8 12 16 24 32 ...).",
        type=int, nargs="+")
    base_gpu_id: int = _opt(0, "The GPU that --device cuda (or auto) means (default 0).", type=int)
    # server
    host: str = _opt("127.0.0.1", "Address to listen on.")
    port: int = _opt(30000, "Port to listen on.", type=int)
    api_key: str | None = _opt(None, "Require 'Authorization: Bearer KEY' on every route "
                               "except /health.")
    admin_api_key: str | None = _opt(
        None, "Require 'Authorization: Bearer KEY' with this key on the admin routes "
        "(/flush_cache, /get_server_info, /server_info), which then do not accept --api-key.")
    allowed_hosts: tuple[str, ...] = _opt(
        (), "Without --api-key, the Host names a request may address besides localhost, IP "
        "addresses and --host (comma-separated; '*.example.com' and '*' match many); "
        "others get 403.", type=parse_list)
    cors_allow_origins: tuple[str, ...] = _opt(
        (), "Origins whose web pages may call the API (CORS), e.g. https://app.example "
        "(comma-separated; '*' for any). Other cross-origin requests get 403.",
        type=parse_list)
    timeout_keep_alive: int = _opt(5, "Seconds an idle keep-alive connection stays open "
                                   "(default 5).", type=int)
    request_read_timeout: float = _opt(
        30.0, "Seconds a client has to send a request's headers, and then its body; a slower "
        "connection is closed (a slow body gets HTTP 408 first; default 30).", type=float)
    limit_concurrency: int = _opt(2048, "Most open connections (and requests in progress); "
                                  "beyond it HTTP 503 (default 2048).", type=int)
    timeout_graceful_shutdown: float = _opt(
        20.0, "On SIGTERM or SIGINT: seconds the requests in flight get to finish while new "
        "ones get 503; those still running then end with an error (default 20). A second "
        "signal stops at once.", type=float)
    log_level: str = _opt("info", "Logging level; 'debug' also prints tracebacks.",
                          choices=("debug", "info", "warning", "error", "critical"))
    trace_plugins: bool = _opt(False, "Log every plugin hook call with its plugin and time.",
                               type=None)
    skip_server_warmup: bool = _opt(False, "Do not run one warm-up request at start-up.",
                                    type=None)
    watchdog_timeout: float = _opt(
        300.0, "Seconds a model forward may take: beyond it /health fails and the server "
        "exits with status 1 after dumping every thread's stack (default 300).", type=float)
    soft_watchdog_timeout: float | None = _opt(
        None, "Seconds after which a forward still running dumps every thread's stack to the "
        "log once (the server keeps running).", type=float)
    show_time_cost: bool = _opt(False, "Log where the scheduler's steps spend their time "
                                "(every 100 steps).", type=None)
    # requests and responses
    sampling_defaults: str = _opt(
        "model", "Sampling defaults of requests that give none: model (temperature, top_p, "
        "top_k of the model's generation_config.json) or openai (1.0, 1.0, all).",
        choices=("openai", "model"))
    preferred_sampling_params: str | None = _opt(
        None, "JSON object of sampling defaults (e.g. '{\"temperature\": 0.6}'); over "
        "--sampling-defaults, under what a request gives.", type=parse_json_object)
    allow_auto_truncate: bool = _opt(
        False, "Cut prompts that do not fit from the left (keeping their end) instead of "
        "refusing them with HTTP 400.", type=None)
    enable_cache_report: bool = _opt(
        False, "Report the prompt tokens served from the prefix cache in "
        "usage.prompt_tokens_details.cached_tokens.", type=None)
    stream_interval: int = _opt(1, "Streamed responses send a delta every N tokens "
                                "(default 1).", type=int)
    incremental_streaming_output: bool = _opt(
        False, "Streamed /generate responses carry only the new text and ids in each event "
        "(default: all so far).", type=None)
    log_requests: bool = _opt(False, "Log every finished request (see --log-requests-level).",
                              type=None)
    log_requests_level: int = _opt(
        2, "0: ids, token counts, finish reason and latency; 1: and sampling parameters; 2: "
        "and the first 2048 characters of input and output; 3: all of them (default 2).",
        type=int, choices=(0, 1, 2, 3))
    log_requests_format: str = _opt("text", "Request log lines as text or one JSON object.",
                                    choices=("text", "json"))
    enable_request_time_stats_logging: bool = _opt(
        False, "Log where each finished request's time went: waiting to be scheduled, its "
        "prefill until the first token was on the host, the hand-over to the HTTP side, "
        "time to first token and decoding (one line a request, as --log-requests-format).",
        type=None)
    enable_custom_logit_processor: bool = _opt(
        False, "Let requests choose a custom logit processor by name: custom_logit_processor "
        "{\"callable\": NAME} with custom_params; NAME is built in (disallowed_tokens) or "
        "installed under the engine.logit_processors entry points. Serialized code is refused.",
        type=None)
    completion_template: str | None = _opt(
        None, "Fill-in-the-middle template of /v1/completions requests with a suffix: "
        "deepseek_coder, star_coder, qwen_coder, or a JSON file (fim_begin_token, "
        "fim_middle_token, fim_end_token, fim_position MIDDLE or END).")
    # what one request may ask for (beyond it HTTP 400 naming the field)
    max_sequences_per_request: int = _opt(
        256, "Most sequences one request may generate: its prompts times n "
        "(default 256).", type=int)
    max_stop_strings: int = _opt(32, "Most stop strings per request (default 32).", type=int)
    max_stop_length: int = _opt(512, "Longest stop string, in characters (default 512).", type=int)
    max_tools: int = _opt(128, "Most tools in one chat request (default 128).", type=int)
    # speculative decoding (--speculative-algorithm is the family flag; these reach the core
    # verify step and every proposer; a proposer's own options are its plugin's)
    speculative_draft_model_path: str | None = _opt(
        None, "The draft model (directory or .gguf) of draft-model algorithms (STANDALONE, "
        "EAGLE...); it must share the target's tokenizer.", aliases=("--speculative-draft-model",))
    speculative_draft_model_revision: str | None = _opt(
        None, "Accepted for compatibility: draft models load from local paths only.")
    speculative_draft_load_format: str | None = _opt(
        None, "Weights format of the draft model (default: --load-format).",
        choices=("auto", "safetensors", "pt", "gguf", "dummy"))
    speculative_draft_model_quantization: str | None = _opt(
        None, "Quantization method of the draft model (default: its checkpoint's).")
    speculative_num_steps: int | None = _opt(
        None, "Draft steps per verify (default: the algorithm's).", type=int)
    speculative_eagle_topk: int | None = _opt(
        None, "Candidates kept per draft step; above 1 the draft is a tree (default: the "
        "algorithm's).", type=int)
    speculative_num_draft_tokens: int | None = _opt(
        None, "Verify width per request: the last token plus draft nodes (default: the "
        "algorithm's).", type=int)
    speculative_accept_threshold_single: float = _opt(
        1.0, "Sampled verify accepts a draft token whose target probability reaches this; "
        "only 1.0 (lossless) is served.", type=float)
    speculative_accept_threshold_acc: float = _opt(
        1.0, "Sampled verify raises a draft token's acceptance from p to min(1, p / this); "
        "only 1.0 (lossless) is served.", type=float)
    speculative_token_map: str | None = _opt(
        None, "FR-Spec hot-token table of an EAGLE draft (a .pt list of token ids).")
    speculative_attention_mode: str = _opt(
        "prefill", "Attention kernels of the verify forward: prefill (the extend backend) or "
        "decode (the decode backend).", choices=("prefill", "decode"))
    # family flags (--attention-backend...): one field each, added from the family table
    # per-plugin options: {"attention.triton": {"triton_attention_num_kv_splits": 8}}
    plugin_options: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: MappingProxyType({}), metadata={"internal": True})
    #: reference options accepted as no-ops that were set: {"--tp-size": 1}
    #: (:data:`engine.cli.surface.ACCEPTED` says why each changes nothing)
    accepted: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}), metadata={"internal": True})

    def replace(self, **changes: Any) -> "ServerConfig":
        return dataclasses.replace(self, **changes)

    def options_for(self, qualified: str) -> dict[str, Any]:
        return dict(self.plugin_options.get(qualified, {}))

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["plugin_options"] = {k: dict(v) for k, v in self.plugin_options.items()}
        out["accepted"] = dict(self.accepted)
        for secret in ("api_key", "admin_api_key"):
            if out.get(secret):
                out[secret] = "***"
        return out


def core_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(ServerConfig) if not f.metadata.get("internal")]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def convert_value(f_type: Callable[[str], Any] | None, value: Any, where: str) -> Any:
    """Convert a YAML value with a field's converter; raise ``ValueError`` naming ``where``."""
    if f_type is None:  # a switch
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true/false, got {value!r}")
        return value
    if value is None:
        return None
    if f_type is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ValueError(f"{where}: expected a string, got {type(value).__name__}")
        return str(value)
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected a number, got {value!r}")
    if f_type is json.loads and not isinstance(value, str):
        return value
    try:
        return f_type(value if not isinstance(value, str) else value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
