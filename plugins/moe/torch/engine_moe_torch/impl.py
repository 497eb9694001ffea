"""``--moe-runner-backend torch``: sort the (token, expert) pairs by expert, run the gate/up and
down projections as grouped GEMMs over the sorted rows, weight and scatter-add back. An
activation-quantized format's rounding (``experts.act_quant``) is applied to the rows before
each projection.

On the CPU in float32 the core's C kernels serve them. Without an activation format the whole
layer is one call from the router's choice (``cpu_routed_experts``: sort, gather, experts,
weighted sum); with one, the sorted rows go through ``cpu_expert_products`` around the
format's roundings. Both read only the experts that received rows, each weight row once for
all of its rows. Otherwise ``torch.nn.functional.grouped_mm`` serves the GEMMs where this
torch has it for the device and dtype (CPU float32/bfloat16; CUDA bfloat16 on SM90+ with
16-byte aligned widths), or one matmul per expert that received tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.api import hookimpl
from engine.api.moe import (ExpertWeights, MoERunner, cpu_expert_products, cpu_routed_experts,
                            dense_linear)

_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _grouped_ok(experts: ExpertWeights) -> bool:
    if _grouped_mm is None:
        return False
    w = experts.w13
    if w.device.type == "cpu":
        return w.dtype in (torch.float32, torch.bfloat16)
    if w.device.type != "cuda" or w.dtype != torch.bfloat16:
        return False
    major, _ = torch.cuda.get_device_capability(w.device)
    return major >= 9 and experts.hidden_size % 8 == 0 and experts.intermediate_size % 8 == 0


class TorchRunner(MoERunner):
    def process_weights_after_loading(self, experts: ExpertWeights) -> None:
        # a 16-bit checkpoint in float32 on the CPU: the C products read 16-bit experts
        experts.keep_16bit_on_cpu()
        experts.grouped = _grouped_ok(experts)

    def apply(self, experts: ExpertWeights, hidden: torch.Tensor, topk_ids: torch.Tensor,
              topk_weights: torch.Tensor) -> torch.Tensor:
        act = experts.act_quant  # an activation-quantized format's rounding of the rows
        if act is None and hidden.device.type == "cpu":  # float32: the whole layer in C
            out = cpu_routed_experts(hidden, topk_ids, topk_weights, experts.w13, experts.w2)
            if out is not None:
                return out.to(hidden.dtype)
        t, k = topk_ids.shape
        flat = topk_ids.reshape(-1).long()
        valid = flat >= 0
        order = torch.argsort(torch.where(valid, flat, experts.num_experts), stable=True)
        n_valid = int(valid.sum())
        order = order[:n_valid]
        token = order // k
        x = hidden.index_select(0, token)
        if act is not None:
            x = act[0](x)
        counts = torch.bincount(flat[order], minlength=experts.num_experts)
        inter = experts.intermediate_size
        if getattr(experts, "grouped", None) is None:
            experts.grouped = _grouped_ok(experts)
        # the CPU's grouped_mm visits every expert, empty or not: a loop over the experts that
        # received tokens is faster when fewer pairs than experts are routed
        grouped = experts.grouped and n_valid and (hidden.device.type != "cpu"
                                                   or n_valid >= experts.num_experts)
        # float32 on the CPU with an activation format (without one the whole layer went to
        # C above): every expert in two C calls around the format's rounding
        y = (cpu_expert_products(x, counts, experts.w13, experts.w2, act[1])
             if act is not None and n_valid and hidden.device.type == "cpu" else None)
        w13, w2 = experts.w13, experts.w2
        if y is None and w13.dtype != x.dtype:  # 16-bit experts (keep_16bit_on_cpu) the C
            w13, w2 = w13.to(x.dtype), w2.to(x.dtype)  # products did not take
        if y is None and grouped:
            offs = counts.cumsum(0).to(torch.int32)
            gu = _grouped_mm(x, w13.transpose(1, 2), offs=offs)
            mid = F.silu(gu[:, :inter]) * gu[:, inter:]
            y = _grouped_mm(mid if act is None else act[1](mid), w2.transpose(1, 2),
                            offs=offs)
        elif y is None:  # (a few rows on CPU: the weight-streaming product); every expert's
            # gate/up first, so a format's rounding of the down inputs is one call
            runs = [(e, n) for e, n in enumerate(counts.tolist()) if n]
            mid = torch.empty((x.shape[0], inter), dtype=x.dtype, device=x.device)
            start = 0
            for e, n in runs:
                gu = dense_linear(x[start:start + n], w13[e])
                mid[start:start + n] = F.silu(gu[:, :inter]) * gu[:, inter:]
                start += n
            mid, y, start = mid if act is None else act[1](mid), torch.empty_like(x), 0
            for e, n in runs:
                y[start:start + n] = dense_linear(mid[start:start + n], w2[e])
                start += n
        # back to (token, slot) order, then a weighted sum over the slots (a scatter-add with
        # repeated indices is serialised on the CPU: far slower than this)
        pairs = torch.zeros(t * k, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        pairs[order] = y.float()
        out = torch.bmm(topk_weights.float().view(t, 1, k), pairs.view(t, k, -1))
        return out.view(t, -1).to(hidden.dtype)


@hookimpl
def engine_create_moe_runner(model_config: Any, config: Any, device: Any,
                             options: Any) -> MoERunner:
    return TorchRunner()
