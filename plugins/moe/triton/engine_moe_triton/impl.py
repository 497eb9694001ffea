"""``--moe-runner-backend triton``: the fused-MoE kernels of :mod:`.kernels` with launch
parameters from a tuning table.

Tables are JSON files named ``E{E}_N{N}_{device}[_float32].json`` (N: the expert width, device
as ``torch.cuda.get_device_name`` with ``_`` for spaces) mapping a token count to ``BLOCK_SIZE_M/N/K``, ``GROUP_SIZE_M``, ``num_warps`` and
``num_stages``; the nearest token count is used. They are searched in
``--triton-moe-config-dir``, then in this package's ``configs/``; without a table the defaults
below apply (``benchmarks/tune_moe_triton.py`` writes tables).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any

import torch

from engine.api import PluginError, hookimpl
from engine.api.moe import ExpertWeights, MoERunner

log = logging.getLogger("engine.moe.triton")

_HERE = os.path.dirname(os.path.abspath(__file__))


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def default_config(tokens: int, num_experts: int, dtype: torch.dtype) -> dict[str, int]:
    """Launch parameters without a tuned table (small batches: thin M blocks, since each
    expert sees few rows)."""
    if interpreting():
        return dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=1)
    if tokens <= num_experts:
        return dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                    num_warps=4, num_stages=4)
    return dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=8,
                num_warps=4, num_stages=3)


#: matrix-vector launch parameters (gate/up and down projections)
#: (acc2d, summing each output once after its K loop, is in the sweep but not yet measured on
#: an H200)
GEMV_DEFAULT = dict(block_n=16, block_k=256, warps=8, acc2d=False)  # best of the H200 sweep
#: one token (batch-1 decode): two outputs a program over whole 4 KB rows of ``w13`` (every load
#: of a program asked for at once), the down projection eight outputs a program over whole
#: rows; the weights read with L2 evict_first. The fastest of two H200 sweeps in a chain of 8
#: layers (24.0-24.2 us a layer, 73 % of 4.3 TB/s, against 26.6 for the launch before: 16
#: outputs, 256-column tiles, the next tile loaded first; docs/benchmarks/moe.md)
#: Where the intermediate width is whole tiles of 128 (at most ``EVEN_DOWN_TILES``), the down
#: projection takes 16 outputs a program over unrolled [16, 128] tiles with no masks
#: (``even_down``; ``ENGINE_MOE_EVEN_DOWN=0`` off, or "BLOCK_N,BLOCK_K,warps"): a third of
#: the instructions a weight; on an H100 the one-token kernel alone 9.9 us against 11.1-11.4
#: for the whole-row tile, after the up projection 27.5 against 28.2-29.0.
#: ``token_down`` (BLOCK_N, BLOCK_K, warps): the up projection stores each pair's activation
#: and one down launch takes all the token's pairs with their combine and the residual
#: (``kernels.token_moe``: no combine kernel); None: the pair launches above and the combine.
#: Off until timed on a GPU: ``ENGINE_MOE_TOKEN_DOWN=4,256,4`` (or ``...,p``: its rows asked
#: into L2 before its wait) turns it on.
#: ``down_mma`` (MR, warps[, prefetch]): the up projection stores each pair's activation and
#: the down projection runs on the matrix unit (:func:`.token_mma.down_mma`, a Gluon kernel:
#: CUDA only; 16-bit weights whose widths it fits), then the combine; with it, ``up_mma``
#: (MR, warps[, prefetch]): the up projection on the matrix unit too
#: (:func:`.token_mma.up_mma`). Off until timed on a GPU: ``ENGINE_MOE_DOWN_MMA=1,4`` (and
#: ``ENGINE_MOE_UP_MMA=2,8``) turn them on.
GEMV_ONE_TOKEN = dict(block_n=2, block_k=2048, warps=4, down_block_n=8, down_block_k=1024,
                      down_warps=4, acc2d=False, next_tile=False, l2_hints=1,
                      even_down=(16, 128, 4), token_down=None, down_mma=None, up_mma=None)


#: the keys of a one-token launch that :func:`.kernels.pair_moe` does not take
TOKEN_KEYS = ("token_down", "prefetch", "down_mma", "up_mma")


def pair_launch(launch: dict[str, Any]) -> dict[str, Any]:
    """``launch`` without :data:`TOKEN_KEYS`: the options :func:`.kernels.pair_moe` takes."""
    return {key: value for key, value in launch.items() if key not in TOKEN_KEYS}


def _one_token_launch() -> dict[str, Any]:
    """:data:`GEMV_ONE_TOKEN` as ``ENGINE_MOE_EVEN_DOWN``, ``ENGINE_MOE_TOKEN_DOWN``,
    ``ENGINE_MOE_DOWN_MMA`` and ``ENGINE_MOE_UP_MMA`` say (unset: as it is; "0": None; else
    the launch's comma-separated integers, and for the token launch a last ``p``:
    ``prefetch``)."""
    launch = dict(GEMV_ONE_TOKEN)
    for name, key in (("ENGINE_MOE_EVEN_DOWN", "even_down"),
                      ("ENGINE_MOE_TOKEN_DOWN", "token_down"),
                      ("ENGINE_MOE_DOWN_MMA", "down_mma"),
                      ("ENGINE_MOE_UP_MMA", "up_mma")):
        env = os.environ.get(name)
        if env is None:
            continue
        values = env.split(",")
        launch[key] = None if env == "0" else tuple(int(v) for v in values if v != "p")
        if key == "token_down" and "p" in values:
            launch["prefetch"] = True
    return launch


def table_name(num_experts: int, width: int, device: str, dtype: torch.dtype) -> str:
    name = f"E{num_experts}_N{width}_{device.replace(' ', '_')}"
    if dtype == torch.float32:
        name += "_float32"
    return name + ".json"


@functools.lru_cache(maxsize=None)
def load_table(dirs: tuple[str, ...], name: str) -> dict[int, dict[str, int]] | None:
    for d in dirs:
        path = os.path.join(d, name)
        if os.path.isfile(path):
            with open(path) as fh:
                table = {int(k): v for k, v in json.load(fh).items()}
            log.info("fused MoE launch table %s", path)
            return table
    return None


class TritonRunner(MoERunner):
    supports_cuda_graph = True  # routing tables built by device ops, grids from shapes only

    def __init__(self, config_dir: str | None) -> None:
        dirs = [config_dir] if config_dir else []
        self.dirs = tuple(dirs + [os.path.join(_HERE, "configs")])
        self.override: dict[str, int] | None = None  # benchmarks/tuning set this
        #: at most this many (token, expert) pairs take the matrix-vector path
        self.gemv_max_pairs = 64
        #: its launch parameters (benchmarks/moe_gpu.py --sweep-gemv measures them)
        self.gemv: dict[str, int] = dict(GEMV_DEFAULT)
        #: the launch for a single token, or None (``gemv`` serves it too)
        self.gemv_one: dict[str, Any] | None = _one_token_launch()
        #: cache hints of the matrix-vector path (``pair_moe``'s ``l2_hints``): 1, weights read
        #: with the L2 policy "evict_first", so the up projection's stream leaves the down
        #: projection's prefetched rows in L2; 2, those rows also asked for "evict_last". The
        #: launch's own (``GEMV_ONE_TOKEN``: 1) unless ``ENGINE_MOE_L2_HINTS=0|1|2`` says
        hints = os.environ.get("ENGINE_MOE_L2_HINTS")
        self.l2_hints: int | None = int(hints) if hints else None

    def supports(self, experts: ExpertWeights) -> str | None:
        if experts.w13.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return f"expert weights in {experts.w13.dtype} (serves float32, bfloat16, float16)"
        if experts.w13.device.type == "cpu" and not interpreting():
            return "a CPU device needs TRITON_INTERPRET=1"
        return None

    def config_for(self, experts: ExpertWeights, tokens: int) -> dict[str, int]:
        if self.override is not None:
            return self.override
        device = ("cpu" if experts.w13.device.type == "cpu"
                  else torch.cuda.get_device_name(experts.w13.device))
        table = None if interpreting() else load_table(
            self.dirs, table_name(experts.num_experts, experts.intermediate_size, device,
                                  experts.w13.dtype))
        if not table:
            return default_config(tokens, experts.num_experts, experts.w13.dtype)
        return table[min(table, key=lambda m: abs(m - tokens))]

    def apply(self, experts: ExpertWeights, hidden: torch.Tensor, topk_ids: torch.Tensor,
              topk_weights: torch.Tensor) -> torch.Tensor:
        return self._apply(experts, hidden, topk_ids, topk_weights)

    def apply_residual(self, experts: ExpertWeights, hidden: torch.Tensor,
                       topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                       residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The residual added in the combine kernel."""
        return self._apply(experts, hidden, topk_ids, topk_weights, residual)

    def _apply(self, experts: ExpertWeights, hidden: torch.Tensor, topk_ids: torch.Tensor,
               topk_weights: torch.Tensor, residual: torch.Tensor | None = None):
        from .kernels import (align_by_expert, combine_pairs, grouped_gemm, pair_moe,
                              silu_and_mul, token_down_fits)

        t, k = topk_ids.shape
        inter, h = experts.intermediate_size, experts.hidden_size
        act_quant = experts.act_quant  # a format's rounding of the rows (torch ops between GEMMs)
        if t * k <= self.gemv_max_pairs and act_quant is None:
            launch = self.gemv_one if t == 1 and self.gemv_one is not None else self.gemv
            x = hidden.to(experts.w13.dtype)
            hints = self.l2_hints if self.l2_hints is not None else launch.get("l2_hints", 0)
            down_launch = launch.get("token_down") if t == 1 else None
            if (down_launch and hidden.dtype == x.dtype
                    and token_down_fits(k, h, inter, *down_launch[:2])):
                return self._one_token(experts, x, topk_ids, topk_weights, residual, launch,
                                       hints)
            mma = launch.get("down_mma") if t == 1 else None
            if mma and _mma_fits(x, h, inter, mma):
                from .token_mma import moe_mma

                up = launch.get("up_mma")
                act = torch.empty(k, inter, dtype=x.dtype, device=x.device)
                down = torch.empty(k, h, dtype=x.dtype, device=x.device)
                moe_mma(x, experts.w13, experts.w2, topk_ids.contiguous(),
                        topk_weights.float().contiguous(), act, down, l2_hints=hints,
                        down_launch=mma,
                        up_launch=(up if up and up[0] % 2 == 0
                                   and _mma_fits(x, 2 * inter, h, up) else None),
                        **{key: launch[key] for key in ("block_n", "block_k", "warps")
                           if key in launch})
                return combine_pairs(down, k, hidden.dtype, residual)
            gate_up = torch.empty(t * k, 2 * inter, dtype=x.dtype, device=x.device)
            down = torch.empty(t * k, h, dtype=x.dtype, device=x.device)
            if interpreting():
                launch = {"acc2d": launch.get("acc2d", False), "block_n": 16, "block_k": 16,
                          "next_tile": launch.get("next_tile", False)}
            options = dict(pair_launch(launch), l2_hints=hints)
            pair_moe(x, experts.w13, experts.w2, topk_ids.contiguous(),
                     topk_weights.float().contiguous(), gate_up, down, **options)
            return combine_pairs(down, k, hidden.dtype, residual)
        block = self.config_for(experts, t)
        sorted_ids, block_expert, num_padded = align_by_expert(
            topk_ids, block["BLOCK_SIZE_M"], experts.num_experts)
        pairs = t * k
        x = hidden.to(experts.w13.dtype)
        if act_quant is not None:
            x = act_quant[0](x)
        gate_up = torch.empty(pairs, 2 * inter, dtype=x.dtype, device=x.device)
        weights = topk_weights.reshape(-1).float().contiguous()
        grouped_gemm(x, experts.w13, gate_up, weights, sorted_ids, block_expert, num_padded,
                     top_k=k, mul_weight=False, block=block)
        act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
        silu_and_mul(gate_up, act)
        if act_quant is not None:
            act = act_quant[1](act)
        down = torch.zeros(pairs, h, dtype=x.dtype, device=x.device)  # -1 ids stay zero
        grouped_gemm(act, experts.w2, down, weights, sorted_ids, block_expert, num_padded,
                     top_k=1, mul_weight=True, block=block)
        return combine_pairs(down, k, hidden.dtype, residual)

    def _one_token(self, experts: ExpertWeights, x: torch.Tensor, topk_ids: torch.Tensor,
                   topk_weights: torch.Tensor, residual: torch.Tensor | None,
                   launch: dict[str, Any], hints: int):
        """One token through ``kernels.token_moe`` (the launch's ``token_down``, L2 ``hints``):
        the output in ``x``'s dtype, or with ``residual`` (that plus it, the sums of squares
        of its pieces [1, pieces])."""
        from .kernels import token_moe

        k = topk_ids.shape[1]
        inter, h = experts.intermediate_size, experts.hidden_size
        act = torch.empty(k, inter, dtype=x.dtype, device=x.device)
        out = torch.empty(1, h, dtype=x.dtype, device=x.device)
        options = {key: launch[key] for key in ("block_n", "block_k", "warps", "token_down",
                                                "prefetch") if key in launch}
        if interpreting():  # (small tiles: each program costs the interpreter time)
            options.update(block_n=4, block_k=16)
        ss = (torch.empty(h // launch["token_down"][0], dtype=torch.float32, device=x.device)
              if residual is not None else None)
        token_moe(x, experts.w13, experts.w2, topk_ids.contiguous(),
                  topk_weights.float().contiguous(), act, out, residual, ss, l2_hints=hints,
                  **options)
        return out if residual is None else (out, ss.view(1, -1))


def _mma_fits(x: torch.Tensor, rows: int, k: int, launch: tuple[int, ...]) -> bool:
    """Whether a projection on the matrix unit serves ``x`` (a CUDA tensor of 16-bit floats,
    the weights' dtype) at this launch: ``rows`` outputs over ``k`` inputs (the up
    projection's rows are its 2 I gate and up rows)."""
    from . import token_mma

    return (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and token_mma.available()
            and token_mma.fits(rows, k, *launch))


@hookimpl
def engine_create_moe_runner(model_config: Any, config: Any, device: Any,
                             options: Any) -> MoERunner:
    if torch.device(device).type != "cuda" and not interpreting():
        raise PluginError("moe runner triton needs a CUDA GPU (or TRITON_INTERPRET=1 on CPU)")
    return TritonRunner(options.get("triton_moe_config_dir"))
