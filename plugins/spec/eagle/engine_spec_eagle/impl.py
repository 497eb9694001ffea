"""EAGLE / EAGLE3 / NEXTN proposers: a draft head on the target's features (see ``model``).

Per request the head keeps the K/V of the positions it has run with the target's true features
(``fed``); each step it first catches up over the positions the target verified since (pairs of
token ``t[k+1]`` and feature ``f[k]``), which also yields its first draft token, then runs
``num_steps - 1`` more steps on its own outputs. Its speculative positions are cut off at the
next step. With top-k > 1 every drafted position also offers its next ``topk - 1`` candidates
as sibling leaves.

Every request drafts at once: one forward catches all of them up (rows padded to the longest),
then each further step is one forward for all of them over a
:class:`~engine.api.speculative.RowCache`: one token per request for chains (with or without
sibling leaves), the K frontier nodes per request for EAGLE-2 trees (top-k > 1 and a verify
width beyond the chain). On CUDA those forwards replay graphs captured per (batch bucket,
shape, key span) on first use (:class:`~engine.api.speculative.BatchGraphs`). The per-request
path (:meth:`EagleProposer._propose`) is the reference the tests compare with.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from engine.api import ConfigError, hookimpl
from engine.api.speculative import BatchGraphs, Draft, HeadCache, Proposer, RowCache, SpecContext

from engine_spec_eagle.model import DraftHead, Rows, load_head

DEFAULTS = (3, 1, 4)  #: (steps, topk, width) when none is set
MIN_SPAN = 256  #: the smallest key span a step attends over (spans are powers of two)


class EagleProposer(Proposer):
    def __init__(self, head: DraftHead, context: SpecContext, steps: int, topk: int,
                 width: int, token_map: torch.Tensor | None = None,
                 graphs: bool = False) -> None:
        self.head = head
        self.target = context.target
        self.num_steps, self.topk = steps, topk
        self.num_draft_tokens = width
        self.drafts_trees = topk > 1 and width > steps + 1
        self.hot = token_map
        self.device, self.dtype = self.target.device, self.target.dtype
        self._seqs: dict[Any, HeadCache] = {}  #: the per-request reference path's caches
        #: every request's head K/V, and the graphs of the batched forwards (CUDA)
        c = head.cfg
        self.rows = RowCache(c.num_layers, c.num_kv_heads, c.head_dim, self.device, self.dtype)
        self.graphs = BatchGraphs(self._forward, self.rows) if graphs else None
        #: trees: the expansion of a frontier of top-k nodes per request, in graphs too
        self.tree_graphs = (BatchGraphs(self._expand, self.rows)
                            if graphs and self.drafts_trees else None)

    def describe(self) -> str:
        c = self.head.cfg
        extra = f", target layers {c.aux_layers}" if c.kind == "eagle3" else ""
        return (f"{c.kind} head ({c.num_layers} layer(s){extra}), {self.num_steps} steps, "
                f"top-{self.topk}, verify width {self.num_draft_tokens}")

    def release(self, request: Any) -> None:
        self._seqs.pop(request, None)
        self.rows.release(request)

    def _logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits over the head's vocabulary and the map to target ids (None: identity)."""
        x = self.head.head_input(hidden)
        if self.head.lm_head is not None:
            return self.head.lm_head(x).float(), self.head.d2t
        return self.target.logits(x.to(self.dtype)), None

    def _pick(self, hidden: torch.Tensor) -> list[int]:
        logits, d2t = self._logits(hidden[-1:])
        row = logits[0]
        if self.hot is not None:
            masked = torch.full_like(row, float("-inf"))
            masked[self.hot] = row[self.hot]
            row = masked
        ids = row.topk(min(self.topk, row.shape[0])).indices
        if d2t is not None and d2t.numel():
            ids = ids + d2t[ids]
        return ids.tolist()

    @torch.inference_mode()
    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        return self._propose_rows(requests)

    # ------------------------------------------------------------------ batched drafting

    def _rows_view(self, rows: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor | None,
                   span: int) -> Rows:
        """Token ``[b, j]`` at position ``pos[b, j]`` of row ``rows[b]`` (the scratch row when
        not ``valid``) sees that row's positions up to its own."""
        scratch = self.rows.scratch
        write = rows[:, None].expand_as(pos)
        if valid is not None:
            write = torch.where(valid, write, torch.full_like(write, scratch))
        mask = torch.arange(span, device=pos.device)[None, None, :] <= pos[:, :, None]
        return Rows(self.rows, rows, write.reshape(-1), pos.reshape(-1), mask, span)

    def _forward(self, ids: torch.Tensor, feats: torch.Tensor, pos: torch.Tensor,
                 valid: torch.Tensor | None, rows: torch.Tensor, last: torch.Tensor,
                 span: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every request's new tokens at once ([B, T] ids and positions, [B, T, F] features,
        ``valid`` [B, T] or None: all): the head's output at each request's token ``last[b]``
        [B, 1, H] and its top-k log-probabilities and ids [B, k]. Shapes are fixed by B, T, F
        and ``span``: what a graph captures."""
        hidden = self.head(self.target.embed(ids), feats, pos,
                           self._rows_view(rows, pos, valid, span))
        hidden = hidden[torch.arange(ids.shape[0], device=ids.device), last][:, None]
        logp, top = self._top(hidden[:, 0])
        return hidden, logp, top

    def _run(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_forward`, from a captured graph where there are graphs."""
        if self.graphs is None:
            return self._forward(*args)
        *tensors, span = args
        return self.graphs.run(tensors, (0, 0, 0, False, self.rows.scratch, 0), (span,))

    def _expand(self, tok: torch.Tensor, feat: torch.Tensor, pos: torch.Tensor,
                store: torch.Tensor, anc: torch.Tensor, rows: torch.Tensor,
                base: torch.Tensor, span: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One tree step for every request: its K frontier nodes ([B, K] tokens, [B, K, H]
        the head outputs that predicted them, [B, K] RoPE positions) are written at row
        positions ``store`` [B, K] and each sees the request's verified positions (below
        ``base`` [B]) and the positions ``anc`` [B, K, S] (its expanded ancestors and itself);
        returns their outputs [B, K, H] and top-k log-probabilities and ids [B, K, k]."""
        b, k = tok.shape
        mask = torch.arange(span, device=tok.device)[None, None, :] < base[:, None, None]
        mask = mask.expand(b, k, span).clone()
        mask.scatter_(2, anc, True)
        view = Rows(self.rows, rows, rows[:, None].expand(b, k).reshape(-1), store.reshape(-1),
                    mask, span)
        hidden = self.head(self.target.embed(tok), feat, pos, view)
        logp, ids = self._top(hidden.reshape(b * k, -1))
        return hidden, logp.view(b, k, -1), ids.view(b, k, -1)

    def _propose_rows(self, requests: Sequence[Any]) -> list[Draft]:
        out = [Draft() for _ in requests]
        live = [i for i, req in enumerate(requests) if req.kv_len >= 1]
        if not live:
            return out
        cache = self.rows
        reqs = [requests[i] for i in live]
        rows = [cache.row(req) for req in reqs]
        kvs = [req.kv_len for req in reqs]
        starts = [min(cache.fed[r], kv - 1) for r, kv in zip(rows, kvs)]
        counts = [kv - s for kv, s in zip(kvs, starts)]
        extra = self.num_steps * self.topk if self.drafts_trees else self.num_steps
        span = cache.span(max(kvs) + extra, MIN_SPAN)
        b = len(reqs)
        # the catch-up: as wide as a verify when no request has more (a graph's shape; the
        # first after a prefill has the whole prompt: eager)
        t = max(counts)
        if t <= self.num_draft_tokens:
            t = self.num_draft_tokens
        ids = torch.zeros(b, t, dtype=torch.long)
        pos = torch.zeros(b, t, dtype=torch.long)
        valid = torch.zeros(b, t, dtype=torch.bool)
        feats = []
        for k, (req, s, n) in enumerate(zip(reqs, starts, counts)):
            ids[k, :n] = torch.tensor(token_slice(req, s + 1, s + 1 + n))
            pos[k, :n] = torch.arange(s, s + n)
            valid[k, :n] = True
            f = self.target.features(req, s, s + n)
            feats.append(torch.nn.functional.pad(f, (0, 0, 0, t - n)))
        small = torch.tensor([rows, [c - 1 for c in counts], kvs, [0] * b, [1] * b])
        flat = torch.cat([ids.flatten(), pos.flatten(), valid.flatten().long(),
                          small.flatten()]).to(self.device)  # one copy to the device
        ids, pos, valid, small = flat.split([b * t] * 3 + [5 * b])
        ids, pos, valid = ids.view(b, t), pos.view(b, t), valid.view(b, t).bool()
        rows_t, last, step_pos, zero, ones = small.view(5, b)
        catch = (ids, torch.stack(feats), pos, valid, rows_t, last, span)
        hidden, logp, top = (self._run(*catch) if t == self.num_draft_tokens
                             else self._forward(*catch))
        for r, kv in zip(rows, kvs):
            cache.fed[r] = kv
        if self.drafts_trees:
            trees = self._trees(hidden.clone(), logp.clone(), top.clone(), rows_t, step_pos,
                                span)
            for i, tree in zip(live, trees):
                out[i] = tree
            return out
        picks = [top.clone()]  # (a graph's outputs are overwritten by its next replay)
        step_pos, ones = step_pos[:, None], ones[:, None].bool()
        for step in range(1, self.num_steps):
            hidden, _, top = self._run(top[:, :1], hidden, step_pos + (step - 1), ones,
                                       rows_t, zero, span)
            picks.append(top.clone())
        chosen = torch.stack(picks, 1).tolist()  # [B, steps, k]
        for i, per in zip(live, chosen):
            chain = [row[0] for row in per]
            sibs = [row[1:] for row in per]
            out[i] = Draft.chain_with_siblings(chain, sibs).truncated(
                self.num_draft_tokens - 1, len(chain))
        return out

    def _trees(self, hidden: torch.Tensor, logp: torch.Tensor, top: torch.Tensor,
               rows: torch.Tensor, kv: torch.Tensor, span: int) -> list[Draft]:
        """EAGLE-2 trees for every request at once, from the catch-up's output ``hidden``
        [B, 1, H] and its top-k at the root (``kv`` [B]: the verified lengths); the frontier
        (the K best nodes by cumulative log-probability) is expanded ``num_steps - 1`` times,
        its nodes stored at the row positions after the verified ones (step s at
        ``kv + (s - 1) K ..``), each seeing its stored ancestors. The candidates are numbered
        as :meth:`_tree` numbers them; scores are float64 sums, as there. One read-back at the
        end, then :func:`rerank` per request."""
        b, k = top.shape
        steps = self.num_steps
        dev = top.device
        tokens, parents = [top], [torch.full((b, k), -1, dtype=torch.long, device=dev)]
        score = logp.double()
        scores = [score]
        depths = [torch.ones(b, k, dtype=torch.long, device=dev)]
        frontier = torch.arange(k, device=dev).expand(b, k)  # node numbers
        feat = hidden.expand(b, k, hidden.shape[-1])
        anc = torch.empty(b, k, max(1, steps - 1), dtype=torch.long, device=dev)
        count = k
        for step in range(1, steps):
            store = kv[:, None] + (step - 1) * k + torch.arange(k, device=dev)[None, :]
            anc[:, :, step - 1:] = store[:, :, None]  # itself (and the unused tail)
            pos = (kv[:, None] + (step - 1)).expand(b, k)
            args = (tokens_at(tokens, frontier, k), feat, pos, store, anc, rows, kv)
            if self.tree_graphs is not None:
                out, lp, ids = self.tree_graphs.run(
                    args, (0, 0, 0, 0, 0, self.rows.scratch, 0), (span,))
            else:
                out, lp, ids = self._expand(*args, span)
            cand = (score[:, :, None] + lp.double()).reshape(b, k * k)
            tokens.append(ids.reshape(b, k * k).clone())  # (a graph's output: copy it)
            parents.append(frontier[:, :, None].expand(b, k, k).reshape(b, k * k))
            scores.append(cand)
            depths.append(torch.full((b, k * k), step + 1, dtype=torch.long, device=dev))
            best = cand.topk(k, dim=1).indices  # [B, K] into this step's K * K
            src = best // k
            frontier = count + best
            count += k * k
            score = cand.gather(1, best)
            feat = out.gather(1, src[:, :, None].expand(b, k, out.shape[-1])).clone()
            anc = anc.gather(1, src[:, :, None].expand_as(anc)).clone()
        flat = [torch.cat(x, 1) for x in (tokens, parents, depths)]
        toks, pars, deps = (x.tolist() for x in flat)
        scs = torch.cat(scores, 1).tolist()
        return [rerank(t, p, sc, d, self.num_draft_tokens - 1)
                for t, p, sc, d in zip(toks, pars, scs, deps)]

    def _propose(self, req: Any) -> Draft:
        seq = self._seqs.get(req)
        if seq is None:
            seq = self._seqs[req] = HeadCache(len(self.head.layers), self.device, self.dtype)
        kv = req.kv_len
        if kv < 1:
            return Draft()
        tokens = req.origin_input_ids + req.output_ids
        seq.cut(seq.fed)
        start = seq.fed
        if start >= kv:  # nothing newly verified (should not happen): redo the last one
            start = kv - 1
            seq.cut(start)
        feats = self.target.features(req, start, kv)
        ids = torch.tensor(tokens[start + 1:kv + 1], device=self.device)
        pos = torch.arange(start, kv, device=self.device)
        hidden = self.head(self.target.embed(ids), feats, pos, seq.caches)
        seq.fed = kv
        if self.drafts_trees:
            return self._tree(seq, hidden, kv)
        chain: list[int] = []
        sibs: list[list[int]] = []
        for step in range(self.num_steps):
            top = self._pick(hidden)
            chain.append(top[0])
            sibs.append(top[1:])
            if step + 1 < self.num_steps:
                tok = torch.tensor([top[0]], device=self.device)
                p = torch.tensor([kv + step], device=self.device)
                hidden = self.head(self.target.embed(tok), hidden[-1:], p, seq.caches)
        return Draft.chain_with_siblings(chain, sibs).truncated(self.num_draft_tokens - 1,
                                                                 len(chain))


    def _top(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row of ``hidden`` [F, H]: the ``topk`` best next tokens' log-probabilities and
        target ids ([F, k] each)."""
        logits, d2t = self._logits(hidden)
        if self.hot is not None:
            masked = torch.full_like(logits, float("-inf"))
            masked[:, self.hot] = logits[:, self.hot]
            logits = masked
        logp = torch.log_softmax(logits.float(), dim=-1)
        best = logp.topk(min(self.topk, logp.shape[-1]), dim=-1)
        ids = best.indices
        if d2t is not None and d2t.numel():
            ids = ids + d2t[ids]
        return best.values, ids

    def _tree(self, seq: HeadCache, hidden: torch.Tensor, kv: int) -> Draft:
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        depths: list[int] = []

        def add(tok: int, parent: int, score: float, depth: int) -> int:
            tokens.append(tok)
            parents.append(parent)
            scores.append(score)
            depths.append(depth)
            return len(tokens) - 1

        logp, ids = self._top(hidden[-1:])
        src = hidden[-1:]
        # (node, the head output that predicted it: the node's input feature when expanded)
        frontier = [(add(int(t), -1, float(v), 1), src[0])
                    for v, t in zip(logp[0].tolist(), ids[0].tolist())]
        base = seq.caches[0][0].shape[0]  # the verified prefix in the head's cache
        entry: dict[int, int] = {}  # expanded node -> its row in the head's cache
        for step in range(1, self.num_steps):
            nodes = [n for n, _ in frontier]
            f = len(nodes)
            before = seq.caches[0][0].shape[0]
            mask = torch.zeros(f, before + f, dtype=torch.bool, device=self.device)
            mask[:, :base] = True
            for i, n in enumerate(nodes):
                a = parents[n]
                while a >= 0:
                    mask[i, entry[a]] = True
                    a = parents[a]
                entry[n] = before + i
                mask[i, before + i] = True
            toks = torch.tensor([tokens[n] for n in nodes], device=self.device)
            feats = torch.stack([h for _, h in frontier])
            pos = torch.full((f,), kv + step - 1, device=self.device)
            out = self.head(self.target.embed(toks), feats, pos, seq.caches, mask)
            logp, ids = self._top(out)
            cands = []
            for i, n in enumerate(nodes):
                for v, t in zip(logp[i].tolist(), ids[i].tolist()):
                    cands.append((add(int(t), n, scores[n] + float(v), step + 1), out[i]))
            cands.sort(key=lambda c: (-scores[c[0]], c[0]))
            frontier = cands[:self.topk]
        return rerank(tokens, parents, scores, depths, self.num_draft_tokens - 1)


def token_slice(req: Any, start: int, end: int) -> list[int]:
    """Tokens ``start .. end - 1`` of the request's prompt and output, without joining the
    two lists (a long prompt would be copied every step)."""
    prompt, out = req.origin_input_ids, req.output_ids
    n = len(prompt)
    if end <= n:
        return prompt[start:end]
    if start >= n:
        return out[start - n:end - n]
    return prompt[start:] + out[:end - n]


def tokens_at(tokens: list[torch.Tensor], nodes: torch.Tensor, k: int) -> torch.Tensor:
    """The tokens [B, K] of node numbers ``nodes`` [B, K], from the per-step candidate
    tensors ``tokens`` (K nodes at depth 1, then K * K per step)."""
    return torch.cat(tokens, 1).gather(1, nodes)


def rerank(tokens: Sequence[int], parents: Sequence[int], scores: Sequence[float],
           depths: Sequence[int], n: int) -> Draft:
    """EAGLE-2's selection: the ``n`` candidates of highest cumulative log-probability (ties:
    the shallower, then the earlier), as a draft tree in depth order (parents first). A
    candidate whose parent was not selected is dropped (scores only fall along a path, so this
    happens only through rounding)."""
    best = sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i], i))[:max(0, n)]
    index: dict[int, int] = {}
    out_tokens: list[int] = []
    out_parents: list[int] = []
    for i in sorted(best, key=lambda i: (depths[i], i)):
        p = parents[i]
        if p >= 0 and p not in index:
            continue
        index[i] = len(out_tokens)
        out_tokens.append(tokens[i])
        out_parents.append(index[p] if p >= 0 else -1)
    return Draft(out_tokens, out_parents)


def build(config: Any, context: SpecContext, want: str) -> EagleProposer:
    """The proposer of ``want`` ("eagle", "eagle3" or "mtp") from the core's options."""
    steps = context.num_steps or DEFAULTS[0]
    topk = context.eagle_topk or DEFAULTS[1]
    width = context.num_draft_tokens or (steps + 1 if topk == 1 else steps * topk + 1)
    if topk == 1 and width > steps + 1:
        raise ConfigError(f"--speculative-num-draft-tokens {width}: a chain of "
                          f"--speculative-num-steps {steps} verifies at most {steps + 1}")
    target = context.target
    if target is None:
        raise ConfigError("this server cannot give a draft head the target's features")
    fmt = config.speculative_draft_load_format
    head = load_head(config.speculative_draft_model_path, target, dummy=fmt == "dummy",
                     want=want if want != "mtp" else None, seed=config.random_seed)
    head = head.to(device=target.device, dtype=target.dtype).eval()
    target.capture(head.cfg.aux_layers if head.cfg.kind == "eagle3" else ())
    token_map = None
    if config.speculative_token_map:
        if head.cfg.kind == "eagle3":
            raise ConfigError("--speculative-token-map: an EAGLE-3 head has its own draft "
                              "vocabulary (d2t); the map is for EAGLE heads")
        try:
            token_map = torch.as_tensor(torch.load(config.speculative_token_map,
                                                   weights_only=True)).long().to(target.device)
        except Exception as exc:  # noqa: BLE001 - a start-up error with the reason
            raise ConfigError(f"--speculative-token-map {config.speculative_token_map}: "
                              f"{type(exc).__name__}: {exc}") from None
    graphs = target.device.type == "cuda" and not config.disable_cuda_graph
    return EagleProposer(head, context, steps, topk, width, token_map, graphs=graphs)


@hookimpl
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: SpecContext) -> Proposer:
    return build(config, context, "eagle")
