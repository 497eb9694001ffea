"""Fused Triton kernels for the decoder's small per-layer operations on a GPU.

A decode step is bound by reading weights; what it adds on top is launches. Written as torch ops,
one layer's RMSNorms, per-head q/k norms and rotary embedding are ~45 small kernels; here they
are three: ``add_rms_norm`` (residual add + RMSNorm, one row per program), ``qk_norm_rope``
(per-head norm + rotate-half RoPE of q and k, reading the cos/sin caches by position) and
``silu_and_mul``.

The arithmetic reproduces the torch ops it replaces in half precision (bfloat16/float16),
rounding where they round: the residual sum is rounded to the model dtype, the normalised row is
rounded before the weight multiplies it, cos/sin are rounded to the dtype and each product and
the sum of RoPE are rounded (as transformers computes them). Float32 models keep the torch ops
(one fused ``F.rms_norm`` there already).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

#: whether Triton is installed (found without importing it: a CPU server never loads it)
HAS_TRITON = importlib.util.find_spec("triton") is not None


def for_tensor(x: torch.Tensor):
    """The module whose fused kernels serve ``x``: :mod:`engine.runtime.fused_triton` (Triton,
    half precision on a GPU), :mod:`engine.runtime.fused_cpu` (C, float32 on the CPU), or
    ``None`` (torch ops)."""
    if x.dtype is torch.float32 and x.device.type == "cpu":
        if os.environ.get("ENGINE_DISABLE_FUSED") == "1":
            return None
        return _cpu_ops()
    return _gpu_ops() if enabled(x) else None


@functools.lru_cache(maxsize=1)
def _gpu_ops():
    from engine.runtime import fused_triton

    return fused_triton


@functools.lru_cache(maxsize=1)
def _cpu_ops():
    from engine.runtime import fused_cpu

    return fused_cpu if fused_cpu.available() else None


def triton_serves(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether Triton kernels run for ``dtype`` tensors on ``device``: half precision on a CUDA
    device, or any device under the Triton interpreter (tests)."""
    return HAS_TRITON and dtype in (torch.bfloat16, torch.float16) and \
        (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def enabled(x: torch.Tensor) -> bool:
    """Whether the fused kernels serve ``x`` (:func:`triton_serves`), unless
    ``ENGINE_DISABLE_FUSED=1``."""
    return os.environ.get("ENGINE_DISABLE_FUSED") != "1" and triton_serves(x.device, x.dtype)



# the kernels' entry points, for callers that already know ``enabled(x)`` holds
def route_topk(logits: torch.Tensor, top_k: int,
               renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """See :func:`engine.runtime.fused_triton.route_topk`."""
    return _gpu_ops().route_topk(logits, top_k, renormalize)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """See :func:`engine.runtime.fused_triton.add_rms_norm`."""
    return _gpu_ops().add_rms_norm(x, residual, weight, eps)


def qk_norm_rope(qk: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                 q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """See :func:`engine.runtime.fused_triton.qk_norm_rope`."""
    return _gpu_ops().qk_norm_rope(qk, num_q_heads, num_kv_heads, head_dim, positions,
                                   cos_cache, sin_cache, q_weight, k_weight, eps)


def qk_norm_rope_store(qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int,
                       positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                       q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                       k_pool: torch.Tensor, v_pool: torch.Tensor, out_loc: torch.Tensor,
                       k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """See :func:`engine.runtime.fused_triton.qk_norm_rope_store`."""
    return _gpu_ops().qk_norm_rope_store(qkv, num_q_heads, num_kv_heads, head_dim, positions,
                                         cos_cache, sin_cache, q_weight, k_weight, eps, k_pool,
                                         v_pool, out_loc, k_scale, v_scale)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """See :func:`engine.runtime.fused_triton.silu_and_mul`."""
    return _gpu_ops().silu_and_mul(x)
