"""DFLASH: a DFlash head (``model``) drafts a block per request per step, verified as a chain.

Per request the head keeps its context keys and values for the verified tokens it has read
(``fed``), a row of one :class:`~engine.api.speculative.RowCache`; each step one forward for
every request takes in the target's features of the tokens verified since (padded to the
block's width, so the shape is fixed) and runs the blocks of the last token and ``width - 1``
mask tokens; on CUDA it replays a graph (:class:`~engine.api.speculative.BatchGraphs`), the
first after a prefill (the whole prompt) runs eagerly. A request whose verified length went
back (a retraction) starts over.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from engine.api import ConfigError, hookimpl
from engine.api.speculative import BatchGraphs, Draft, Proposer, RowCache, SpecContext

from engine_spec_dflash.model import DFlashHead, load_head

log = logging.getLogger("engine.speculative")


class DFlashProposer(Proposer):
    drafts_trees = False

    def __init__(self, head: DFlashHead, context: SpecContext, width: int,
                 graphs: bool = False) -> None:
        self.head = head
        self.target = context.target
        self.num_draft_tokens = width
        self.device, self.dtype = self.target.device, self.target.dtype
        ids = head.cfg.target_layer_ids
        # the core keeps layer inputs, in layer order: layer L's output is layer L + 1's input
        # (past the last layer, the final normed state)
        self.target.capture(sorted(i + 1 for i in ids))
        order = sorted(range(len(ids)), key=lambda k: ids[k])
        h = head.cfg.hidden_size
        perm = [order.index(k) for k in range(len(ids))]  # checkpoint order from layer order
        self._perm = None if perm == list(range(len(ids))) else torch.cat(
            [torch.arange(p * h, (p + 1) * h) for p in perm]).to(self.device)
        c = head.cfg
        self.rows = RowCache(c.num_layers, c.num_kv_heads, c.head_dim, self.device, self.dtype)
        self.graphs = BatchGraphs(self._forward, self.rows) if graphs else None
        self._mask_id = c.mask_token_id

    def describe(self) -> str:
        c = self.head.cfg
        return (f"DFlash head ({c.num_layers} layers over target layers {c.target_layer_ids}), "
                f"blocks of {self.num_draft_tokens}")

    def release(self, request: Any) -> None:
        self.rows.release(request)

    def _forward(self, ids: torch.Tensor, feats: torch.Tensor, ctx_pos: torch.Tensor,
                 ctx_rows: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor,
                 span: int) -> tuple[torch.Tensor]:
        """Every request's drafts [B, W - 1] from its block ``ids`` [B, W] (the last token,
        then masks) at ``pos``, after its new context features ``feats`` [B, C, F] at
        ``ctx_pos`` (written to ``ctx_rows``); shapes fixed by B, W, C, F and ``span``."""
        if self._perm is not None:
            feats = feats.index_select(2, self._perm)
        emb = self.target.embed(ids)
        scale = self.head.cfg.input_embedding_scale
        if scale != 1.0:
            emb = emb * scale
        hidden = self.head.forward_rows(emb, feats, ctx_pos, ctx_rows, pos, rows, self.rows,
                                        span)
        return (self.draft_tokens(hidden[:, 1:], ids[:, 0]),)

    def draft_tokens(self, hidden: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The drafts [B, W - 1] from the blocks' rows after the last token [B, W - 1, H]: the
        target's head, greedy (a variant may correct each row's logits by the tokens drafted
        before it; ``last`` [B] is the token before the first row)."""
        return self.target.logits(hidden.reshape(-1, hidden.shape[-1])).argmax(-1).view(
            hidden.shape[0], -1)

    @torch.inference_mode()
    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        out = [Draft() for _ in requests]
        live = [i for i, req in enumerate(requests) if req.kv_len >= 1]
        if not live:
            return out
        cache, width = self.rows, self.num_draft_tokens
        reqs = [requests[i] for i in live]
        rows = [cache.row(req) for req in reqs]
        kvs = [req.kv_len for req in reqs]
        for r, kv in zip(rows, kvs):
            if cache.fed[r] > kv:  # retracted: start over
                cache.fed[r] = 0
        starts = [cache.fed[r] for r in rows]
        counts = [kv - s for kv, s in zip(kvs, starts)]
        span = cache.span(max(kvs) + width)
        b, c = len(reqs), max(max(counts), width)  # the new context, at least a block wide
        feats, ctx_pos, ctx_rows = [], torch.zeros(b, c, dtype=torch.long), []
        ids = torch.full((b, width), self._mask_id, dtype=torch.long)
        for k, (req, s0, n, r) in enumerate(zip(reqs, starts, counts, rows)):
            f = self.target.features(req, s0, s0 + n)
            feats.append(torch.nn.functional.pad(f, (0, 0, 0, c - n)))
            ctx_pos[k, :n] = torch.arange(s0, s0 + n)
            ctx_rows.append([r] * n + [cache.scratch] * (c - n))
            ids[k, 0] = req.output_ids[-1] if req.output_ids else req.origin_input_ids[-1]
        pos = torch.tensor(kvs)[:, None] + torch.arange(width)[None, :]
        flat = torch.cat([ids.flatten(), ctx_pos.flatten(), torch.tensor(ctx_rows).flatten(),
                          pos.flatten(), torch.tensor(rows)]).to(self.device)
        ids, ctx_pos, ctx_rows, pos, rows_t = flat.split([b * width, b * c, b * c, b * width, b])
        args = (ids.view(b, width), torch.stack(feats), ctx_pos.view(b, c), ctx_rows.view(b, c),
                pos.view(b, width), rows_t)
        if self.graphs is not None and c == width:
            (tokens,) = self.graphs.run(args, (0, 0, 0, cache.scratch, 0, cache.scratch),
                                        (span,))
        else:
            (tokens,) = self._forward(*args, span)
        for r, kv in zip(rows, kvs):
            cache.fed[r] = kv
        for i, drafts in zip(live, tokens.tolist()):
            out[i] = Draft.chain(drafts)
        return out


def build(config: Any, context: SpecContext, options: Any) -> DFlashProposer:
    target = context.target
    if target is None:
        raise ConfigError("this server cannot give a DFlash head the target's features")
    if context.eagle_topk not in (None, 1) or context.num_steps not in (None, 1):
        log.info("DFLASH drafts one block per step, verified as a chain: "
                 "--speculative-num-steps and --speculative-eagle-topk are taken as 1")
    fmt = config.speculative_draft_load_format
    head = load_head(config.speculative_draft_model_path, target, dummy=fmt == "dummy",
                     seed=config.random_seed)
    head = head.to(device=target.device, dtype=target.dtype).eval()
    block = options["speculative_dflash_block_size"]
    width = int(block or context.num_draft_tokens or head.cfg.block_size)
    if block and context.num_draft_tokens and int(block) != context.num_draft_tokens:
        raise ConfigError(f"--speculative-dflash-block-size {block} and "
                          f"--speculative-num-draft-tokens {context.num_draft_tokens} differ "
                          "(the block size is the verify width)")
    if width < 2:
        raise ConfigError(f"DFLASH block size {width}: at least 2 (one draft token)")
    graphs = target.device.type == "cuda" and not config.disable_cuda_graph
    return DFlashProposer(head, context, width, graphs=graphs)


@hookimpl
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: SpecContext) -> Proposer:
    return build(config, context, options)
