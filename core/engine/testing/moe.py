"""Conformance kits of the MoE families (``engine plugins check``).

A runner must compute :func:`engine.api.moe.torch_reference` on random weights and random
routing: top-k 1, 2 and 8; renormalised weights or not; an extra always-chosen expert (a shared
expert fused as expert E, weight 1); experts that receive no token; one token; thousands of
tokens; -1 ids (experts of another rank); an activation-quantized format's rounding of the
rows (``ExpertWeights.act_quant``: fp8 per token, before both projections); float32 and
bfloat16 where the runner serves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch


@dataclass(frozen=True)
class Case:
    name: str
    tokens: int
    experts: int
    top_k: int
    hidden: int = 64
    inter: int = 32
    renormalize: bool = True
    fused_shared: bool = False  #: expert E-1 chosen by every token with weight 1
    foreign: bool = False  #: some ids are -1 (experts another rank serves)
    concentrated: bool = False  #: every token routed among 2 experts (the rest get none)
    act_quant: bool = False  #: the rows each expert multiplies rounded to fp8 per token


def _fp8_rows(x: torch.Tensor) -> torch.Tensor:
    from engine.runtime.quant_methods import fake_quant_fp8_rows

    return fake_quant_fp8_rows(x, torch.float8_e4m3fn)


def cases(small: bool = False) -> list[Case]:
    """The kit's cases; ``small`` keeps shapes an interpreter can run (Triton on a CPU)."""
    base = [
        Case("one token, top-1", 1, 4, 1),
        Case("top-2, renormalised", 7, 8, 2),
        Case("top-2, not renormalised", 5, 8, 2, renormalize=False),
        Case("top-8 of 16", 6, 16, 8, renormalize=False),
        Case("most experts get no token", 9, 16, 2, concentrated=True),
        Case("a shared expert fused as an extra expert", 5, 9, 3, fused_shared=True),
        Case("ids of another rank's experts (-1)", 6, 8, 2, foreign=True),
        Case("widths off the block grid", 5, 6, 2, hidden=40, inter=24),
        Case("activations rounded to fp8 per token", 6, 8, 2, act_quant=True),
    ]
    if not small:
        base.append(Case("thousands of tokens", 2048, 16, 4, hidden=64, inter=64))
    return base


def make(case: Case, dtype: torch.dtype, device: torch.device,
         seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(w13, w2, hidden, topk_ids int32, topk_weights float32) for ``case``."""
    g = torch.Generator().manual_seed(seed)
    e, h, i, t, k = case.experts, case.hidden, case.inter, case.tokens, case.top_k
    w13 = torch.randn(e, 2 * i, h, generator=g) / h ** 0.5
    w2 = torch.randn(e, h, i, generator=g) / i ** 0.5
    x = torch.randn(t, h, generator=g)
    routed = e - 1 if case.fused_shared else e
    pool = 2 if case.concentrated else routed
    kk = k - 1 if case.fused_shared else k
    scores = torch.rand(t, pool, generator=g)
    ids = scores.topk(kk, dim=-1).indices
    weights = torch.softmax(torch.randn(t, kk, generator=g), dim=-1)
    if not case.renormalize:
        weights = weights * 0.7
    if case.fused_shared:
        ids = torch.cat([ids, torch.full((t, 1), e - 1)], dim=1)
        weights = torch.cat([weights, torch.ones(t, 1)], dim=1)
    if case.foreign:
        ids[::2, 0] = -1
    return (w13.to(device, dtype), w2.to(device, dtype), x.to(device, dtype),
            ids.to(device, torch.int32), weights.to(device, torch.float32))


def tolerance(dtype: torch.dtype) -> float:
    return 2e-4 if dtype == torch.float32 else 3e-2


def run_case(runner: Any, case: Case, dtype: torch.dtype, device: torch.device) -> str | None:
    """``None`` when ``runner`` matches the reference on ``case``, else what went wrong."""
    from engine.api.moe import ExpertWeights, torch_reference

    w13, w2, x, ids, weights = make(case, dtype, device)
    experts = ExpertWeights(case.experts, case.hidden, case.inter, dtype).to(device)
    experts.w13.data.copy_(w13)
    experts.w2.data.copy_(w2)
    act = (_fp8_rows, _fp8_rows) if case.act_quant else None
    experts.act_quant = act
    if runner.supports(experts) is not None:
        return None  # the runner declines this dtype/device: start-up would refuse it
    runner.process_weights_after_loading(experts)
    out = runner.apply(experts, x, ids, weights)
    if out.shape != x.shape or out.dtype != x.dtype:
        return f"{case.name} ({dtype}): output {tuple(out.shape)} {out.dtype}, " \
               f"expected {tuple(x.shape)} {x.dtype}"
    ref = torch_reference(w13, w2, x, ids, weights, act=act)
    err = ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    if not err <= tolerance(dtype):
        return f"{case.name} ({dtype}): max error {err:.2e} relative to the largest output"
    # where the runner adds a residual in its own last kernel: the same output plus the
    # residual, rounded as a separate add rounds, and the sums of squares of each row
    residual = torch.randn(x.shape, generator=torch.Generator().manual_seed(7)).to(device, dtype)
    added = runner.apply_residual(experts, x, ids, weights, residual)
    if added is not None:
        total, ss = added
        want = (out.float() + residual.float()).to(dtype)
        if not torch.equal(total, want):
            return f"{case.name} ({dtype}): apply_residual differs from apply + residual by " \
                   f"{(total.float() - want.float()).abs().max().item():.2e}"
        sums = (want.float() ** 2).sum(dim=1)
        if ss.dim() != 2 or ss.shape[0] != x.shape[0] \
                or not torch.allclose(ss.sum(dim=1), sums, rtol=1e-4, atol=1e-6):
            return f"{case.name} ({dtype}): apply_residual's sums of squares are wrong"
    return None


def _tiny_model_config() -> Any:
    from engine.api.models import ModelConfig

    return ModelConfig(architecture="Qwen3MoeForCausalLM", hidden_size=64,
                       intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=128, num_experts=16,
                       num_experts_per_tok=4, moe_intermediate_size=32, norm_topk_prob=True)


def runner_failures(runner: Any, device: torch.device, *, small: bool = False,
                    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
                    ) -> Iterator[str]:
    for dtype in dtypes:
        for case in cases(small):
            problem = run_case(runner, case, dtype, device)
            if problem:
                yield problem


def check_runner(name: str, build: Callable[..., Any]) -> list[str]:
    """The runner kit, on CUDA when present, else the CPU."""
    from engine.api.moe import MoERunner
    from engine.config import ServerConfig

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runner = build(model_config=_tiny_model_config(), config=ServerConfig(), device=device)
    if not isinstance(runner, MoERunner):
        return [f"the hook returned {type(runner).__name__}, not a MoERunner"]
    return list(runner_failures(runner, device))


def check_a2a(name: str, build: Callable[..., Any]) -> list[str]:
    """Single-process kit: dispatch then combine around the reference equals the reference."""
    from engine.api.moe import MoEAllToAll, torch_reference
    from engine.config import ServerConfig

    a2a = build(model_config=_tiny_model_config(), config=ServerConfig())
    if not isinstance(a2a, MoEAllToAll):
        return [f"the hook returned {type(a2a).__name__}, not a MoEAllToAll"]
    failures = []
    for case in cases(small=True):
        w13, w2, x, ids, weights = make(case, torch.float32, torch.device("cpu"))
        local = a2a.local_experts(case.experts)
        h, lid, lw, handle = a2a.dispatch(x, ids, weights)
        part = torch_reference(w13[local.start:local.stop], w2[local.start:local.stop], h,
                               lid, lw)
        out = a2a.combine(part, handle)
        ref = torch_reference(w13, w2, x, ids, weights)
        if not torch.allclose(out, ref, atol=1e-5, rtol=1e-5):
            failures.append(f"{case.name}: dispatch/combine changed the result")
    return failures


class TorchDistAllToAll:
    """A reference expert-parallel all-to-all over ``torch.distributed`` (any backend with
    ``all_to_all_single``, gloo included): rank r owns experts ``[r*E/n, (r+1)*E/n)``; each
    (token, slot) pair travels to its expert's owner with its row and router weight, the runner
    computes ``w * expert(x)`` there, and the results travel back to be summed per token."""

    def __init__(self, num_experts: int, group: Any = None) -> None:
        import torch.distributed as dist

        self.dist, self.group = dist, group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        if num_experts % self.world:
            raise ValueError(f"{num_experts} experts do not split over {self.world} ranks")
        self.per_rank = num_experts // self.world
        self.first_expert = self.rank * self.per_rank

    def local_experts(self, num_experts: int) -> range:
        return range(self.first_expert, self.first_expert + self.per_rank)

    def _exchange(self, send: torch.Tensor, send_counts: list[int],
                  recv_counts: list[int]) -> torch.Tensor:
        recv = send.new_empty((sum(recv_counts), *send.shape[1:]))
        self.dist.all_to_all_single(recv, send.contiguous(), recv_counts, send_counts,
                                    group=self.group)
        return recv

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        k = topk_ids.shape[1]
        flat = topk_ids.reshape(-1).long()
        keep = (flat >= 0).nonzero().squeeze(1)
        owner = flat[keep] // self.per_rank
        order = keep[torch.argsort(owner, stable=True)]
        send_counts = torch.bincount(flat[order] // self.per_rank,
                                     minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        self.dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        sc, rc = send_counts.tolist(), recv_counts.tolist()
        rows = self._exchange(hidden.index_select(0, order // k), sc, rc)
        local = self._exchange((flat[order] % self.per_rank).to(torch.int32), sc, rc)
        weights = self._exchange(topk_weights.reshape(-1)[order].float(), sc, rc)
        handle = (order // k, sc, rc, hidden.shape[0])
        return rows, local.unsqueeze(1), weights.unsqueeze(1), handle

    def combine(self, expert_output: torch.Tensor, handle: Any) -> torch.Tensor:
        token, sc, rc, tokens = handle
        back = self._exchange(expert_output, rc, sc)
        out = torch.zeros(tokens, expert_output.shape[1], dtype=torch.float32,
                          device=expert_output.device)
        out.index_add_(0, token, back.float())
        return out.to(expert_output.dtype)
