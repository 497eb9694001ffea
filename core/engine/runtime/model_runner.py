"""The model runner: from one :class:`Batch` to float32 logits.

Built once per server from the start-up :class:`~engine.assembly.Assembly`'s products: the model
config, the architecture table and quantization method (model + weights), the tokenizer, the
paged KV pool and request-to-token table it sizes itself, and the attention backends (one for
extend batches, one for decode batches; the same object when both resolve to one plugin).

The scheduler owns slot allocation: it writes rows of :attr:`ModelRunner.req_to_token` and builds
each :class:`Batch`; :meth:`ModelRunner.forward` owns everything from the batch to the logits.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Iterator

import torch

from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.models.config import ModelConfig
from engine.models.tokenizer import Tokenizer
from engine.runtime import kv_fp4, kv_scales
from engine.runtime.attention import KVPool
from engine.runtime.batch import Batch, ForwardMode

log = logging.getLogger("engine.runtime")

_DTYPES = {"half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float": torch.float32, "float32": torch.float32}
CPU_KV_BUDGET_BYTES = 2 * 2**30  #: the CPU budget --mem-fraction-static is a fraction of
CPU_KV_MAX_TOKENS = 64 * 2**10  #: ... of at most this many tokens
#: default KV capacity on CPU: the context asked for (--context-length), else the model's
#: context up to this many tokens
CPU_DEFAULT_CONTEXT = 8192
GPU_MEM_FRACTION = 0.85  #: default --mem-fraction-static on GPU (weights + KV of total memory)
DEFAULT_MAX_RUNNING = {"cpu": 64, "cuda": 256}


def pick_device(name: str, base_gpu_id: int = 0) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` (and ``auto`` on a GPU machine)
    means GPU ``base_gpu_id``; ``cuda[:N]`` must exist."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{base_gpu_id}"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device {name}: not a device (auto, cpu, cuda, cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available here")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name}: only cpu and cuda are supported")
    if device.type == "cuda" and not 0 <= (device.index or 0) < torch.cuda.device_count():
        raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} "
                          "GPUs (see --base-gpu-id)")
    return device


def pick_dtype(name: str, device: torch.device, model_config: ModelConfig) -> torch.dtype:
    """``auto``: float32 on CPU; on GPU the checkpoint's 16-bit type (bfloat16 when unstated)."""
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    if model_config.torch_dtype in ("float16", "bfloat16"):
        return _DTYPES[model_config.torch_dtype]
    return torch.bfloat16


class ModelRunner:
    """Owns the model, its weights, the tokenizer, the KV pool and the attention backends.

    Attributes read by the scheduler: ``model_config``, ``tokenizer``, ``pool`` (usable slots:
    ``1 .. pool.num_slots - 1``; the first page is reserved for padding), ``max_total_num_tokens``,
    ``req_to_token`` ([max_running_requests, max_context_len] int64 on ``device``),
    ``max_running_requests``, ``max_context_len``, ``device``, ``dtype``, ``page_size``.
    """

    def __init__(self, config: ServerConfig, assembly: Any = None) -> None:
        """``assembly``: the :class:`~engine.assembly.Assembly` of ``config`` (built here when
        not given)."""
        from engine.assembly import Assembly
        from engine.models.loader import load_model

        self.config = config
        #: seconds of each start-up phase, in order (logged by the server when ready)
        self.startup_seconds: dict[str, float] = {}
        assembly = assembly if assembly is not None else Assembly(config)
        self.device = pick_device(config.device, config.base_gpu_id)
        with self.phase("model config"):
            self.model_config = assembly.model_config()
        self.dtype = pick_dtype(config.dtype, self.device, self.model_config)
        with self.phase("tokenizer"):
            self.tokenizer: Tokenizer | None = (
                None if config.skip_tokenizer_init
                else Tokenizer.load(self.model_config, config.tokenizer_path,
                                    mode=config.tokenizer_mode,
                                    chat_template=config.chat_template))
        self.max_context_len = config.context_length or self.model_config.context_len
        if config.page_size < 1:
            raise ConfigError(f"--page-size {config.page_size}: must be at least 1")
        self.page_size = config.page_size
        self._experts = assembly.experts(self.model_config, self.device)
        with self.phase("quantization method"):
            quant_method = assembly.quant_method(self.model_config, self.device)
        #: what ``--kv-cache-dtype auto`` stores: the quantization method's choice, else the
        #: model's dtype
        self.auto_kv_dtype = getattr(quant_method, "kv_cache_dtype", None) or self.dtype
        with self.phase("weights"):
            self.model = load_model(self.model_config, config, self.device, self.dtype,
                                    architectures=assembly.architectures(),
                                    quant_method=quant_method, experts=self._experts)
        with self.phase("kv pool"):
            self.pool = self._make_pool()
        self._kv_scales(self.pool)
        self.max_total_num_tokens = self.pool.num_slots - self.page_size
        self.max_running_requests = (config.max_running_requests
                                     or DEFAULT_MAX_RUNNING.get(self.device.type, 64))
        self.req_to_token = torch.zeros((self.max_running_requests, self.max_context_len),
                                        dtype=torch.int64, device=self.device)
        self.prefill_backend, self.decode_backend = assembly.attention_backends(
            self.pool, self.model_config)
        for kind, backend in (("prefill", self.prefill_backend),
                              ("decode", self.decode_backend)):
            if self.pool.is_fp8 and not backend.supports_fp8_kv_cache:
                raise ConfigError(f"--kv-cache-dtype {config.kv_cache_dtype}: the {kind} "
                                  f"attention backend ({type(backend).__name__}) does not read "
                                  "an fp8 KV cache here; torch_native, flex_attention, "
                                  "flashinfer and triton (SM89+) do")
            if self.pool.is_fp4 and not backend.supports_fp4_kv_cache:
                raise ConfigError(f"--kv-cache-dtype fp4_mx_block16: the {kind} attention "
                                  f"backend ({type(backend).__name__}) does not read it; "
                                  "torch_native, flex_attention and triton (head dimensions "
                                  "that are powers of two) do")
        #: the backend of speculative verify forwards (--speculative-attention-mode)
        self.verify_backend = (self.decode_backend if config.speculative_attention_mode == "decode"
                               else self.prefill_backend)
        self.attention_backend_names = tuple(
            assembly.chosen[f"--{kind}-attention-backend"].name for kind in ("prefill", "decode"))
        if config.enable_deterministic_inference:
            self._make_batch_invariant()
        self.decode_graphs = self._make_decode_graphs()
        #: prefill forwards replayed from graphs broken at attention, or None (eager)
        self.prefill_graphs = self._make_prefill_graphs()
        #: captured speculative verify forwards, one per width, narrowest first
        #: (:meth:`capture_verify_graphs`)
        self.verify_graphs: list[Any] = []
        #: graphs of speculative draft blocks (:meth:`block_graphs`): key -> (graphs, adapter)
        self._block_graphs: dict[tuple[int, int, int], tuple[Any, Any]] = {}

    # ------------------------------------------------------------------ set-up

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the seconds the block takes to :attr:`startup_seconds` under ``name``."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.startup_seconds[name] = (self.startup_seconds.get(name, 0.0)
                                          + time.monotonic() - t0)

    def _kv_dtype(self) -> torch.dtype:
        """``--kv-cache-dtype`` on this device (a format this build cannot store: ConfigError)."""
        name = self.config.kv_cache_dtype
        if name in ("mxfp8", "nvfp4"):
            raise ConfigError(f"--kv-cache-dtype {name}: needs an SM100 (Blackwell) GPU and its "
                              f"attention kernels (this model is on {self.device.type})")
        if name == "fp4_mx_block16":
            if self.model_config.head_dim % kv_fp4.BLOCK:
                raise ConfigError(f"--kv-cache-dtype fp4_mx_block16: needs a head dimension "
                                  f"that is a multiple of {kv_fp4.BLOCK}; this model's is "
                                  f"{self.model_config.head_dim}")
            return torch.uint8  # (packed codes and scales)
        auto = getattr(self, "auto_kv_dtype", self.dtype)  # (a runner made without __init__)
        return {"auto": auto, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
                "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[name]

    def _kv_scales(self, pool: KVPool) -> None:
        """Per-layer k/v scales of an fp8 KV cache: ``--quantization-param-path``'s, else the
        checkpoint's (:mod:`engine.runtime.kv_scales`), else 1.0."""
        path = self.config.quantization_param_path
        if not pool.is_fp8:
            if path:
                log.warning("--quantization-param-path %s: unused, the KV cache is not fp8 "
                            "(--kv-cache-dtype %s)", path, self.config.kv_cache_dtype)
            return
        if path:
            scales = kv_scales.scale_file(path, pool.num_layers, self.config.kv_cache_dtype,
                                          kv_scales.model_type(self.model_config.model_path))
            pool.k_scale[:] = scales
            pool.v_scale[:] = scales
            log.info("fp8 KV cache: per-layer scales from %s", path)
            return
        k, v = kv_scales.checkpoint_scales(getattr(self.model, "kv_scales", {}),
                                           pool.num_layers)
        for layer in k:
            pool.k_scale[layer], pool.v_scale[layer] = k[layer], v[layer]
        log.info("fp8 KV cache: %s", f"scales of {len(k)} layers from the checkpoint" if k else
                 "no scales in the checkpoint, 1.0 for every layer")

    def _kv_bytes_per_token(self) -> int:
        mc = self.model_config
        elem = torch.empty((), dtype=self._kv_dtype()).element_size()
        width = KVPool.row_width_of(mc.head_dim, self.config.kv_cache_dtype == "fp4_mx_block16")
        return 2 * mc.num_hidden_layers * mc.num_key_value_heads * width * elem

    def _kv_tokens(self) -> int:
        """KV pool capacity in tokens: ``--max-total-tokens``; else on a GPU the free memory
        ``--mem-fraction-static`` leaves; on CPU with ``--mem-fraction-static``, that fraction of
        a 2 GiB budget (at most 64Ki tokens); on CPU by default, room for one request of the
        full context: ``--context-length`` when given, else the model's context capped at
        :data:`CPU_DEFAULT_CONTEXT` (requests share it, like llama.cpp's ``n_ctx``). The CPU
        sizes depend on the flags and the model only, never on the machine's RAM."""
        cfg, per_token = self.config, self._kv_bytes_per_token()
        if cfg.max_total_tokens is not None:
            if cfg.max_total_tokens < 1:
                raise ConfigError("--max-total-tokens must be positive")
            return cfg.max_total_tokens
        if self.device.type == "cpu" and cfg.mem_fraction_static is None:
            if cfg.context_length is not None:
                return max(self.max_context_len, self.page_size * 2)
            return max(min(self.max_context_len, CPU_DEFAULT_CONTEXT), self.page_size * 2)
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            frac = cfg.mem_fraction_static or GPU_MEM_FRACTION
            budget = free - total * (1.0 - frac)
        else:
            budget = cfg.mem_fraction_static * CPU_KV_BUDGET_BYTES
        tokens = int(budget // per_token)
        if self.device.type == "cpu":
            tokens = min(tokens, CPU_KV_MAX_TOKENS)
        if tokens < self.page_size * 2:
            raise ConfigError(f"not enough memory for the KV cache ({budget / 2**20:.0f} MiB "
                              f"budget, {per_token} bytes per token); lower the context or raise "
                              "--mem-fraction-static / set --max-total-tokens")
        return tokens

    def _make_pool(self) -> KVPool:
        ps = self.page_size
        pages = -(-self._kv_tokens() // ps)
        mc = self.model_config
        return KVPool(num_layers=mc.num_hidden_layers, num_kv_heads=mc.num_key_value_heads,
                      head_dim=mc.head_dim, num_slots=(pages + 1) * ps, page_size=ps,
                      dtype=self._kv_dtype(), device=self.device,
                      fp4=self.config.kv_cache_dtype == "fp4_mx_block16",
                      compute_dtype=self.dtype)

    def _make_batch_invariant(self) -> None:
        """``--enable-deterministic-inference``: every linear layer (and a tied output head)
        multiplies row by row unless its method is batch-invariant; both attention backends
        must have a batch-invariant path (else :class:`ConfigError`)."""
        from engine.runtime.linear import Linear

        for kind, backend, name in (("prefill", self.prefill_backend,
                                     self.attention_backend_names[0]),
                                    ("decode", self.decode_backend,
                                     self.attention_backend_names[1])):
            if not backend.batch_invariant:
                raise ConfigError(f"--enable-deterministic-inference: the {kind} attention "
                                  f"backend {name} has no batch-invariant path; use "
                                  "--attention-backend torch_native")
        experts = getattr(self, "_experts", None)
        if experts is not None and not experts[0].batch_invariant:
            raise ConfigError("--enable-deterministic-inference: the MoE runner groups tokens "
                              "by expert, so a token's result depends on the batch; no "
                              "batch-invariant MoE runner is installed")
        for module in self.model.modules():
            if isinstance(module, Linear):
                module.row_by_row = True
        self.model.row_by_row = True
        log.info("deterministic inference: batch-invariant attention, matmuls and sampling")

    def _graphs_allowed(self, kind: str) -> bool:
        """CUDA graphs may be captured: on CUDA, not disabled, and an MoE runner (if any) that
        can be captured."""
        if (self.device.type != "cuda" or self.config.disable_cuda_graph
                or self.config.is_embedding or self.config.enable_deterministic_inference):
            return False
        if self._experts is not None and not self._experts[0].supports_cuda_graph:
            log.info("%s runs without CUDA graphs: the MoE runner cannot be captured", kind)
            return False
        return True

    def _make_decode_graphs(self) -> Any:
        """CUDA graphs for decode steps, when allowed and the decode backend supports them (it
        says so itself); otherwise decode runs eagerly."""
        if self.config.disable_decode_cuda_graph or not (
                self.decode_backend.supports_cuda_graph and self._graphs_allowed("decode")):
            return None
        from engine.runtime.cuda_graph import DecodeGraphs

        with torch.inference_mode():
            max_batch = min(self.config.cuda_graph_max_bs_decode or self.max_running_requests,
                            self.max_running_requests)
            return DecodeGraphs(lambda b: self._forward(b, prepare=False), self.decode_backend,
                                self.req_to_token, max_batch, self.config.cuda_graph_bs_decode,
                                padding=not self.config.disable_cuda_graph_padding)

    def _make_prefill_graphs(self) -> Any:
        """Breakable CUDA graphs for prefill forwards of up to ``--cuda-graph-max-bs-prefill``
        tokens (:class:`~engine.runtime.cuda_graph.PrefillGraphs`; any attention backend: it
        runs between the replays), when allowed and the model has no routed experts (their
        runners group tokens by expert on the host at prefill sizes); sharing the decode
        graphs' memory pool. ``--debug-cuda-graph``: the same breaks and buffers, uncaptured
        (also on CPU). A capture that fails leaves prefill eager, with the reason logged."""
        cfg = self.config
        backend = cfg.cuda_graph_backend_prefill
        if backend == "full":
            raise ConfigError("--cuda-graph-backend-prefill full (attention inside the graph) "
                              "is not built: 'breakable' replays everything but attention, "
                              "'disabled' runs prefill eagerly")
        if backend == "disabled" or cfg.disable_prefill_cuda_graph:
            return None
        debug = cfg.debug_cuda_graph
        if cfg.is_embedding or cfg.enable_deterministic_inference or (
                not debug and not self._graphs_allowed("prefill")):
            return None
        if self._experts is not None:
            log.info("prefill runs without CUDA graphs: the model has routed experts")
            return None
        from engine.runtime.cuda_graph import PrefillGraphs

        max_tokens = cfg.cuda_graph_max_bs_prefill or 1024
        if max_tokens < 1:
            raise ConfigError(f"--cuda-graph-max-bs-prefill {max_tokens}: must be positive")
        pool = self.decode_graphs.pool if self.decode_graphs is not None else None

        def forward(batch: Batch, attn: Any) -> torch.Tensor:
            return self.model(batch.input_ids, batch.positions, batch, attn,
                              batch.logits_indices)

        try:
            with torch.inference_mode(), self.phase("prefill graphs"):
                return PrefillGraphs(forward, self.prefill_backend, self.req_to_token,
                                     max_tokens, cfg.cuda_graph_bs_prefill, pool=pool,
                                     capture=not debug,
                                     padding=not cfg.disable_cuda_graph_padding)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - serve eagerly, say why
            log.warning("prefill runs without CUDA graphs: capturing them failed (%s: %s)",
                        type(exc).__name__, exc)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            return None

    def capture_verify_graphs(self, width: int) -> None:
        """CUDA graphs for speculative verify forwards of up to ``width`` tokens per request
        (called by the verify step once the proposer's width is known; again when the model's
        outputs change, e.g. a feature sink), when allowed and the verify backend supports
        them; otherwise verify runs eagerly. One set per width: ``width`` and the
        :data:`~engine.runtime.cuda_graph.VERIFY_WIDTHS` below it. The graphs end at the final
        hidden states; the head runs on the real rows after a replay. They share the decode
        graphs' memory pool. Graphs already captured for this width are kept."""
        if self.verify_graphs and self.verify_graphs[-1].width == width:
            return
        self.verify_graphs = []
        backend = self.verify_backend
        if not self._verify_graphs_allowed(width, "verify"):
            if self.device.type == "cuda" and not backend.supports_verify_graph:
                log.warning("speculative verify runs eagerly: the %s attention backend "
                            "(%s) does not capture verify forwards in CUDA graphs, and an "
                            "eager forward's kernel launches can cost several decode steps; "
                            "--attention-backend triton captures them",
                            self.config.speculative_attention_mode, type(backend).__name__)
            else:
                log.info("speculative verify runs eagerly (no CUDA graphs)")
            return
        from engine.runtime.cuda_graph import VERIFY_WIDTHS

        pool = None
        for w in sorted({w for w in VERIFY_WIDTHS if w < width} | {width}):
            graphs = self._verify_shaped_graphs(lambda b: self._hidden(b, prepare=False), w,
                                                pool)
            pool = graphs.pool
            self.verify_graphs.append(graphs)

    def _verify_graphs_allowed(self, width: int, kind: str) -> bool:
        backend = self.verify_backend
        return (backend.supports_verify_graph and backend.supports_tree_verify and width > 1
                and self._graphs_allowed(kind))

    def _verify_shaped_graphs(self, forward: Any, width: int, pool: Any = None) -> Any:
        """:class:`~engine.runtime.cuda_graph.VerifyGraphs` of ``forward`` (up to the final
        hidden states; the head runs after a replay) for ``width`` tokens per request, in
        ``pool`` (default: the decode graphs')."""
        from engine.runtime.cuda_graph import VerifyGraphs

        if pool is None and self.decode_graphs is not None:
            pool = self.decode_graphs.pool
        with torch.inference_mode():
            max_batch = min(self.config.cuda_graph_max_bs_decode or self.max_running_requests,
                            self.max_running_requests)
            return VerifyGraphs(forward, self.verify_backend, self.req_to_token, max_batch,
                                width, self.config.cuda_graph_bs_decode, pool=pool,
                                head=self._logits,
                                padding=not self.config.disable_cuda_graph_padding)

    def block_graphs(self, width: int, adapter: Any = None, plain_rows: int = 0) -> Any:
        """Verify-shaped CUDA graphs for blocks of ``width`` tokens per request run by the
        speculative ``TargetModel.run_block`` (a causal chain after each request's KV), with
        ``adapter``'s deltas on every row of a block but the first ``plain_rows``; captured on
        the first call (``TargetModel.prepare_block`` makes that start-up; sharing the decode
        graphs' pool), ``None`` where graphs are not allowed or the verify backend cannot
        capture them."""
        key = (width, id(adapter), plain_rows)
        if key in self._block_graphs:
            return self._block_graphs[key][0]
        graphs = None
        if self._verify_graphs_allowed(width, "speculative draft block"):
            def forward(batch: Batch) -> torch.Tensor:
                if adapter is None:
                    return self._hidden(batch, prepare=False)
                n = batch.input_ids.shape[0]
                idx = torch.arange(n, device=self.device).view(-1, width)[:, plain_rows:]
                with adapter.applied(idx.reshape(-1)):
                    return self._hidden(batch, prepare=False)

            graphs = self._verify_shaped_graphs(forward, width)
        self._block_graphs[key] = (graphs, adapter)  # (the graphs read the adapter's weights)
        return graphs

    def verify_graph_width(self, batch_size: int, longest: int) -> int:
        """The width a verify batch of ``batch_size`` requests whose longest row has
        ``longest`` tokens is padded to for a captured graph to replay it (the narrowest that
        holds it); 0 when none would (it then runs eagerly, unpadded)."""
        for graphs in self.verify_graphs:
            if graphs.width >= longest and batch_size <= graphs.max_batch:
                return graphs.width
        return 0

    # ------------------------------------------------------------------ hot path

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Run the model over ``batch``; float32 logits ``[len(batch.logits_indices), vocab]``
        (with ``--is-embedding``: the selected tokens' final hidden states, L2-normalized,
        float32 ``[len(batch.logits_indices), hidden_size]``).

        Writes the new tokens' K/V into the pool at ``batch.out_cache_loc``. When
        ``batch.logits_indices`` is None, the last token of every request is used. Decode
        batches, and verify batches padded to the verify graphs' width, replay a captured CUDA
        graph when one fits; extend batches of up to ``--cuda-graph-max-bs-prefill`` tokens
        replay the breakable prefill graphs (attention eager between them).
        """
        graphs = self.decode_graphs
        if graphs is not None and batch.is_decode and (size := graphs.size_for(batch)):
            self.pool.settle_loads()  # (a replay cannot wait layer by layer)
            return graphs.run(batch, size)
        prefill = self.prefill_graphs
        if prefill is not None and getattr(self.model, "feature_sink", None) is None:
            size = prefill.size_for(batch)
            if size:
                self.prefill_backend.prepare(batch)
                return self._logits(prefill.run(batch, size))
        if batch.mode is ForwardMode.VERIFY:
            for verify in self.verify_graphs:
                size = verify.size_for(batch)
                if size:
                    self.pool.settle_loads()
                    return verify.run(batch, size)
        return self._forward(batch)

    def synchronize(self, event: Any) -> None:
        """Wait for a CUDA ``event`` recorded behind a forward's work (the overlap scheduler
        reads its tokens back this way; the watchdog times it like a forward)."""
        event.synchronize()

    def _forward(self, batch: Batch, prepare: bool = True) -> torch.Tensor:
        if self.config.is_embedding:
            return self._logits(self._hidden(batch, prepare))
        return self._hidden(batch, prepare, logits=True)

    def _hidden(self, batch: Batch, prepare: bool = True, logits: bool = False) -> torch.Tensor:
        """The final hidden states of the rows of ``batch.logits_indices`` (``logits``: their
        float32 logits, which a model may compute in the same call)."""
        backend = (self.decode_backend if batch.is_decode else self.verify_backend
                   if batch.mode is ForwardMode.VERIFY else self.prefill_backend)
        if prepare:
            backend.prepare(batch)
        return self.model(batch.input_ids, batch.positions, batch, backend, batch.logits_rows(),
                          logits=logits)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.config.is_embedding:  # last-token pooling of the final norm's output
            return torch.nn.functional.normalize(hidden.float(), p=2.0, dim=-1)
        return self.model.compute_logits(hidden).float()
