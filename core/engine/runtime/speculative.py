"""Speculative decoding: the verify step of the scheduler, and the draft model the core serves.

:class:`SpecDecoder` replaces a decode forward when the proposer drafts anything:

1. the proposer (a plugin: :class:`engine.api.speculative.Proposer`) drafts a chain or a tree
   per running request; each draft is cut to what the request may still emit (its remaining
   tokens, the context) and to the verify width;
2. every request's last token and draft nodes become the extend tokens of one ``VERIFY``
   forward: KV slots are taken for all of them (a request for which no pages are left verifies
   its last token alone), positions are ``prefix + depth``, and a tree carries its
   ancestor mask (``Batch.tree_mask``); requests without drafts ride along as one-token rows;
3. each tree is walked from the root, one depth per round for the whole batch: the sampler
   draws the target's token at the current node (argmax for greedy rows, a draw from the
   target's distribution with the request's generator otherwise); the token is appended like
   any decoded token (stops, grammar, logprobs); when a child carries it the walk moves there.
   Greedy output is thus the target's own greedy sequence, and sampled output is drawn from the
   target's own distribution position by position: with a deterministic draft, the rejection
   rule min(1, p/q) accepts node x with probability p(x) and resamples from p without x, which
   is the same draw (chains and trees alike);
4. the KV of accepted nodes is moved to the slots of their positions (a tree's accepted path is
   not contiguous), rejected slots are freed at once, and ``kv_len`` grows by one plus the
   accepted count; the proposer is told how many nodes it got accepted.

When no request has a draft, the step is a plain decode (no cost for prompts with no match).

:class:`DraftRunner` is a second model runner with its own KV pool and rows, keyed by request:
the :class:`engine.api.speculative.DraftModel` given to draft-model proposers.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Hashable, Sequence

import numpy as np
import torch

from engine.api.speculative import Draft, DraftModel, Proposer, TargetModel
from engine.errors import ConfigError
from engine.runtime.allocator import OutOfMemory, PageAllocator, ReqToTokenRows
from engine.runtime.batch import Batch, ForwardMode
from engine.runtime.req_output import error_output, failure, next_output, sample_failure
from engine.runtime.request import ReqOutput, merge_outputs

log = logging.getLogger("engine.scheduler")

RATE_WINDOW_S = 10.0  #: accepted tokens per second are measured over this window


class SpecStats:
    """Counters of the verify steps (read by /metrics)."""

    def __init__(self) -> None:
        self.verify_forwards = 0  #: VERIFY forwards run
        self.verified_requests = 0  #: request rows verified (a forward verifies many)
        self.draft_tokens = 0  #: draft nodes verified
        self.accepted_tokens = 0  #: draft nodes accepted
        self.emitted_tokens = 0  #: tokens emitted by verify steps (accepted + one per row)
        self._recent: collections.deque[tuple[float, int]] = collections.deque()

    def record(self, rows: int, drafted: int, accepted: int, emitted: int) -> None:
        self.verify_forwards += 1
        self.verified_requests += rows
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.emitted_tokens += emitted
        now = time.monotonic()
        self._recent.append((now, accepted))
        while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
            self._recent.popleft()

    @property
    def accept_length(self) -> float:
        """Mean tokens emitted per verified request row (1 + accepted drafts)."""
        return self.emitted_tokens / self.verified_requests if self.verified_requests else 0.0

    @property
    def accepted_per_second(self) -> float:
        now = time.monotonic()
        return sum(n for t, n in self._recent if t >= now - RATE_WINDOW_S) / RATE_WINDOW_S


def ancestor_mask(draft: Draft, width: int) -> torch.Tensor:
    """[width, width] bool: row ``j`` (0 = the root, ``i + 1`` = node ``i``) sees its
    ancestors and itself; rows and columns past the draft are padding (the root and self)."""
    return ancestor_masks([draft], width)[0]


def ancestor_masks(drafts: Sequence[Draft], width: int) -> torch.Tensor:
    """:func:`ancestor_mask` of every draft, [len(drafts), width, width] bool, built in one
    array (a node's row is its parent's row plus itself)."""
    out = np.zeros((len(drafts), width, width), dtype=bool)
    diag = np.arange(width)
    out[:, diag, diag] = True
    out[:, :, 0] = True
    for rows, draft in zip(out, drafts):
        for i, p in enumerate(draft.parents):
            if p >= 0:
                rows[i + 1] |= rows[p + 1]
    return torch.from_numpy(out)


def blocks_batch(mode: ForwardMode, req_to_token: torch.Tensor,
                 blocks: Sequence[tuple[int, int, Sequence[int], Sequence[int]]], *,
                 every_row: bool, **extra: Any) -> Batch:
    """A batch of token blocks ``(row, start, tokens, slots)``: ``tokens`` at positions
    ``start ..`` of request row ``row``, their K/V into ``slots`` (entered in
    ``req_to_token``), each attending causally to its row before it; the logits of each
    block's last token, or of every token (``every_row``). ``extra``: more Batch fields."""
    input_ids: list[int] = []
    positions: list[int] = []
    locs: list[int] = []
    rows_idx: list[int] = []
    prefix = [start for _, start, _, _ in blocks]
    extend = [len(tokens) for _, _, tokens, _ in blocks]
    for (row, start, tokens, slots), n in zip(blocks, extend):
        input_ids.extend(tokens)
        positions.extend(range(start, start + n))
        locs.extend(slots[:n])
        rows_idx.extend([row] * n)
    rows = [row for row, _, _, _ in blocks]
    seq = [p + e for p, e in zip(prefix, extend)]
    n_tok, n_req = len(input_ids), len(rows)
    picked = list(range(n_tok)) if every_row else (np.cumsum(extend) - 1).tolist()
    flat = torch.tensor(input_ids + positions + locs + rows_idx + rows + seq + prefix + extend
                        + picked, dtype=torch.long, device=req_to_token.device)
    ids_t, pos_t, loc_t, rowi_t, rows_t, seq_t, pre_t, ext_t, pick_t = flat.split(
        [n_tok] * 4 + [n_req] * 4 + [len(picked)])
    req_to_token[rowi_t, pos_t] = loc_t
    return Batch(mode=mode, input_ids=ids_t, positions=pos_t, out_cache_loc=loc_t,
                 req_pool_indices=rows_t, seq_lens=seq_t, prefix_lens=pre_t, extend_lens=ext_t,
                 req_to_token=req_to_token, seq_lens_cpu=seq, prefix_lens_cpu=prefix,
                 extend_lens_cpu=extend, logits_indices=pick_t, **extra)


class SpecDecoder:
    """The verify step over a scheduler's running requests (see the module docstring)."""

    def __init__(self, proposer: Proposer, runner: Any, target: "TargetView | None" = None
                 ) -> None:
        self.proposer = proposer
        self.runner = runner
        #: the view the proposer was given (its ``run_block`` is served during drafting)
        self.target = target
        self.width = max(1, int(proposer.num_draft_tokens))
        self.stats = SpecStats()
        capture = getattr(runner, "capture_verify_graphs", None)
        if capture is not None:  # CUDA graphs for verify forwards of this width, if any
            capture(self.width)

    def describe(self) -> str:
        return self.proposer.describe()

    # ------------------------------------------------------------------ drafting

    def _drafts(self, sched: Any, decode: list[tuple[Any, int, list[int]]]) -> list[Draft]:
        reqs = [req for req, _, _ in decode]
        if self.target is not None:
            self.target.step = (self, sched, {id(req): slots for req, _, slots in decode})
        try:
            drafts = self.proposer.propose(reqs)
        finally:
            if self.target is not None:
                self.target.step = None
        if len(drafts) != len(reqs):
            raise RuntimeError(f"the proposer drafted {len(drafts)} drafts for {len(reqs)} "
                               "requests")
        out = []
        for req, draft in zip(reqs, drafts):
            room = min(req.max_new_tokens - len(req.output_ids),
                       sched.max_context_len - req.seq_len) - 1
            if not draft or room <= 0:
                out.append(Draft())
                continue
            out.append(draft.truncated(self.width - 1, room))
        return out

    def _take_draft_slots(self, sched: Any, req: Any, slots: list[int], n: int) -> bool:
        """Make ``slots`` (``req``'s slots from its last token on: that one, and any a block
        run this step took) hold ``1 + n`` when pages are free (evicting cache); False when
        they are not."""
        alloc = sched.allocator
        more = 1 + n - len(slots)
        if more <= 0:
            return True
        at = req.kv_len + len(slots)
        if not sched._make_room(alloc.pages_needed(at, more) * alloc.page_size):
            return False
        new, _ = alloc.slots_for(req.last_slot, at, more)
        slots.extend(new)
        req.last_slot = new[-1]
        return True

    @staticmethod
    def _keep_slots(sched: Any, req: Any, slots: list[int], keep: int) -> None:
        """Keep the first ``keep`` of ``slots`` (``req``'s slots from its last token on) and
        free the others, but for the rest of the last kept page; ``last_slot`` moves to the
        last kept one."""
        room = -(req.kv_len + keep) % sched.page_size  # the rest of the last kept page stays
        if len(slots) > keep + room:
            sched.allocator.free_slots(slots[keep + room:])
        req.last_slot = slots[keep - 1]

    def _give_back(self, sched: Any, decode: list[tuple[Any, int, list[int]]]) -> None:
        """Free the slots past each request's last token (taken by a block run) before the
        step falls back to a plain decode."""
        for req, _, slots in decode:
            if len(slots) > 1:
                self._keep_slots(sched, req, slots, 1)
                del slots[1:]

    def run_block(self, sched: Any, step_slots: dict[int, list[int]], requests: Sequence[Any],
                  blocks: Sequence[Sequence[int]], adapter: Any, plain_rows: int
                  ) -> list[torch.Tensor | None]:
        """:meth:`TargetModel.run_block` during drafting: one forward of the blocks (a causal
        chain after each request's KV), into the slots this step's verify takes; blocks of one
        length replay the runner's :meth:`block_graphs` where it has them."""
        out: list[torch.Tensor | None] = [None] * len(requests)
        items = []
        for k, (req, block) in enumerate(zip(requests, blocks)):
            slots = step_slots.get(id(req))
            n = len(block)
            if slots is None or n == 0 or req.kv_len + n > sched.max_context_len:
                continue
            if not self._take_draft_slots(sched, req, slots, n - 1):
                continue
            items.append((k, req, list(block), slots[:n]))
        if not items:
            return out
        reqs = [req for _, req, _, _ in items]
        extend = [len(block) for _, _, block, _ in items]
        width = extend[0] if len(set(extend)) == 1 else 0
        make = getattr(self.runner, "block_graphs", None)
        graphs = make(width, adapter, plain_rows) if make is not None and width else None
        tree_mask = None
        if graphs is not None:  # a captured verify shape: the causal chain as a tree mask
            tree_mask = torch.ones(width, width, dtype=torch.bool, device=sched.device).tril()
            tree_mask = tree_mask.expand(len(reqs), width, width).contiguous()
        batch = blocks_batch(
            ForwardMode.VERIFY, self.runner.req_to_token,
            [(req.row, req.kv_len, block, sl) for _, req, block, sl in items], every_row=True,
            sampling=[r.sampling_params for r in reqs], tree_mask=tree_mask)
        size = graphs.size_for(batch) if graphs is not None else 0
        if size:
            self.runner.pool.settle_loads()  # (a replay cannot wait layer by layer)
            logits = graphs.run(batch, size)
        elif adapter is not None:
            ends = np.cumsum(extend)  # the adapter's rows: all but each block's first ones
            adapted = [j for end, n in zip(ends, extend) for j in range(end - n + plain_rows, end)]
            with adapter.applied(torch.tensor(adapted, dtype=torch.long, device=sched.device)):
                logits = self.runner._forward(batch)
        else:
            logits = self.runner._forward(batch)
        for (k, _, _, _), part in zip(items, logits.split(extend)):
            out[k] = part
        return out

    # ------------------------------------------------------------------ the step

    def verify(self, sched: Any, decode: list[tuple[Any, int, list[int]]]) -> bool:
        """Run the verify step over ``decode`` (each request with the slot of its last token,
        already in the scheduler's plan); False when nobody drafted (the caller decodes)."""
        drafts = self._drafts(sched, decode)
        for k, (req, _, slots) in enumerate(decode):
            if drafts[k] and not self._take_draft_slots(sched, req, slots, len(drafts[k])):
                drafts[k] = Draft()
        if not any(drafts):
            self._give_back(sched, decode)
            return False
        sched.timer.mark("draft")
        batch = self._batch(sched, decode, drafts)
        sched.timer.mark("batch")
        logits = self.runner.forward(batch)
        sched.timer.mark("forward")
        self._finish_step(sched, decode, drafts, logits, batch)
        return True

    def _pad_width(self, sched: Any, decode: list[tuple[Any, int, list[int]]],
                   drafts: list[Draft]) -> int:
        """The width every request's row is padded to for a captured verify forward (the
        runner's ``verify_graph_width`` for this batch), or 0: no graph serves this batch,
        rows stay as long as their drafts. A padded row must fit the context."""
        width = getattr(self.runner, "verify_graph_width", None)
        pad = width(len(decode), 1 + max(map(len, drafts))) if width is not None else 0
        if pad and max(req.kv_len for req, _, _ in decode) + pad > sched.max_context_len:
            return 0
        return pad or 0

    def _batch(self, sched: Any, decode: list[tuple[Any, int, list[int]]],
               drafts: list[Draft]) -> Batch:
        """The VERIFY batch. Padded (:meth:`_pad_width`): every request's row is ``pad``
        tokens, its draft then padding nodes (the root's token at the root's position, K/V into
        the reserved slot 0, seen by no real node), and the tree mask is always given; only the
        real nodes' rows are in ``logits_indices``."""
        pad = self._pad_width(sched, decode, drafts)
        input_ids: list[int] = []
        positions: list[int] = []
        locs: list[int] = []
        rows_idx: list[int] = []
        key_pos: list[int] = []
        real: list[int] = []
        prefix, extend = [], []
        tree = pad > 0 or any(not d.is_chain for d in drafts)
        for (req, _, slots), draft in zip(decode, drafts):
            start = req.kv_len
            n = 1 + len(draft)
            root = req.output_ids[-1] if req.output_ids else req.origin_input_ids[-1]
            real.extend(range(len(input_ids), len(input_ids) + n))
            input_ids.append(root)
            input_ids.extend(draft.token_ids)
            positions.append(start)
            positions.extend(start + d for d in draft.depths())
            locs.extend(slots[:n])
            rows_idx.extend([req.row] * n)
            key_pos.extend(range(start, start + n))
            if pad > n:  # padding nodes
                input_ids.extend([root] * (pad - n))
                positions.extend([start] * (pad - n))
                locs.extend([0] * (pad - n))
            prefix.append(start)
            extend.append(max(n, pad))
        reqs = [req for req, _, _ in decode]
        seq = [p + e for p, e in zip(prefix, extend)]
        dev = sched.device
        n_tok, n_req, n_real = len(input_ids), len(reqs), len(real)
        flat = torch.tensor(input_ids + positions + locs + rows_idx + key_pos + real
                            + [r.row for r in reqs] + seq + prefix + extend,
                            dtype=torch.long, device=dev)
        ids_t, pos_t, loc_t, rowi_t, key_t, real_t, rows_t, seq_t, pre_t, ext_t = flat.split(
            [n_tok] * 3 + [n_real] * 3 + [n_req] * 4)
        # the real nodes' slots (a padding node sees the root and its own key, whatever slot
        # the table holds there; no real node sees it, so its entry stays as it is)
        self.runner.req_to_token[rowi_t, key_t] = loc_t[real_t] if pad else loc_t
        tree_mask = None
        if tree:
            width = max(extend)
            tree_mask = ancestor_masks(drafts, width).to(dev)
        return Batch(
            mode=ForwardMode.VERIFY, input_ids=ids_t, positions=pos_t, out_cache_loc=loc_t,
            req_pool_indices=rows_t, seq_lens=seq_t, prefix_lens=pre_t, extend_lens=ext_t,
            req_to_token=self.runner.req_to_token, seq_lens_cpu=seq, prefix_lens_cpu=prefix,
            extend_lens_cpu=extend, logits_indices=real_t,
            sampling=[r.sampling_params for r in reqs], tree_mask=tree_mask)

    def _walk(self, sched: Any, reqs: list[Any], drafts: list[Draft], offsets: list[int],
              logits: torch.Tensor) -> tuple[list[list[int]], list[ReqOutput | None]]:
        """Sample the trees; returns each request's accepted path (node numbers: ``i + 1`` for
        draft node ``i``) and its merged output delta.

        A request whose next token depends on its logits alone (greedy; no penalties,
        ``min_new_tokens``, logit processor or grammar) has every node's token drawn in one
        sampler call for the whole batch, then its tree is walked on the host. The others are
        walked depth by depth, one sampler call per depth for all of them, each draw made only
        at a node the walk reached (so a seeded request draws exactly as without
        speculation)."""
        children: list[dict[int, dict[int, int]]] = []
        for d in drafts:
            kids: dict[int, dict[int, int]] = {}
            for i, (tok, par) in enumerate(zip(d.token_ids, d.parents)):
                kids.setdefault(par + 1, {}).setdefault(tok, i + 1)
            children.append(kids)
        node = [0] * len(reqs)
        path: list[list[int]] = [[] for _ in reqs]
        deltas: list[ReqOutput | None] = [None] * len(reqs)
        now = time.monotonic()

        def take(i: int, out: Any, j: int) -> bool:
            """Row ``j`` of ``out`` is request ``i``'s next token: emit it; True when the
            walk goes on below the child that carries it."""
            req = reqs[i]
            if out.errors and j in out.errors:
                delta = error_output(req, sample_failure(out.errors[j]))
            else:
                try:
                    delta = next_output(req, out, j, now, sched.max_context_len)
                except Exception as exc:  # noqa: BLE001 - this request fails alone
                    delta = error_output(req, failure("while finishing its token", exc))
            deltas[i] = delta if deltas[i] is None else merge_outputs(deltas[i], delta)
            if req.finished:
                return False
            child = children[i].get(node[i], {}).get(out.token_ids[j])
            if child is None:
                return False
            node[i] = child
            path[i].append(child)
            return True

        free = [i for i, req in enumerate(reqs) if _context_free(req)]
        if free:
            rows = [offsets[i] + k for i in free for k in range(1 + len(drafts[i]))]
            out = sched.sampler(logits[rows] if len(rows) < logits.shape[0] else logits,
                                [reqs[i] for i in free for _ in range(1 + len(drafts[i]))])
            sched.timer.mark("sample")
            at = 0
            for i in free:
                while take(i, out, at + node[i]):
                    pass
                at += 1 + len(drafts[i])
        taken = set(free)
        active = [i for i in range(len(reqs)) if i not in taken]
        while active:
            rows = logits[[offsets[i] + node[i] for i in active]]
            out = sched.sampler(rows, [reqs[i] for i in active])
            sched.timer.mark("sample")
            active = [i for j, i in enumerate(active) if take(i, out, j)]
        return path, deltas

    def _commit(self, sched: Any, reqs: list[Any], slots: list[list[int]],
                paths: list[list[int]]) -> None:
        """Keep the KV of each request's last token and accepted nodes at the slots of their
        positions (one gather and one scatter per buffer for the whole batch), free the rest;
        ``kv_len`` moves past them."""
        src: list[int] = []
        dst: list[int] = []
        for sl, path in zip(slots, paths):
            for d, n in enumerate(path, 1):
                if n != d:
                    src.append(sl[n])
                    dst.append(sl[d])
        if src:
            pool = self.runner.pool
            moves = torch.tensor(src + dst, device=pool.device)
            src_t, dst_t = moves[:len(src)], moves[len(src):]
            sink = getattr(getattr(self.runner, "model", None), "feature_sink", None)
            buffers = [*pool.k, *pool.v] + ([sink.buf] if sink is not None else [])
            for buf in buffers:
                buf.index_copy_(0, dst_t, buf.index_select(0, src_t))
        for req, sl, path in zip(reqs, slots, paths):
            self._keep_slots(sched, req, sl, 1 + len(path))
            req.kv_len += 1 + len(path)

    def _finish_step(self, sched: Any, decode: list[tuple[Any, int, list[int]]],
                     drafts: list[Draft], logits: torch.Tensor, batch: Batch) -> None:
        reqs = [req for req, _, _ in decode]
        offsets, at = [], 0
        for d in drafts:
            offsets.append(at)
            at += 1 + len(d)
        path, deltas = self._walk(sched, reqs, drafts, offsets, logits)
        self._commit(sched, reqs, [slots for _, _, slots in decode], path)
        sched._counted = True
        accepted = sum(len(p) for p in path)
        emitted = 0
        for req, p, delta in zip(reqs, path, deltas):
            req.spec_verify_ct += 1
            req.spec_accepted_tokens += len(p)
            if delta is not None:
                emitted += len(delta.token_ids)
                delta.spec_verify_ct = req.spec_verify_ct
                delta.spec_accepted_tokens = req.spec_accepted_tokens
        self.stats.record(len(reqs), sum(map(len, drafts)), accepted, emitted)
        for req, p in zip(reqs, path):
            try:
                self.proposer.on_verified(req, len(p))
            except Exception:  # noqa: BLE001 - a proposer's bookkeeping never fails a request
                log.exception("the proposer failed on a verified request")
        sched.timer.mark("finish")
        items = [(req.sink, delta) for req, delta in zip(reqs, deltas) if delta is not None]
        senders = [req for req, delta in zip(reqs, deltas) if delta is not None]
        sched._deliver(senders, items, [req for req in senders if req.finished])
        if sched.after_forward is not None:
            sched.after_forward(batch, [r.output_ids[-1] if r.output_ids else 0 for r in reqs])

    def release(self, req: Any) -> None:
        try:
            self.proposer.release(req)
        except Exception:  # noqa: BLE001
            log.exception("the proposer failed to release a request")


def _context_free(req: Any) -> bool:
    """Whether the request's next token depends on its logits alone (greedy, nothing that
    looks at the tokens before it), so every node of its tree may be drawn at once."""
    sp = req.sampling_params
    return (sp.is_greedy and not sp.has_penalties and not sp.min_new_tokens
            and getattr(req, "grammar", None) is None
            and getattr(req, "logit_processor", None) is None)


# ---------------------------------------------------------------------- the draft model


class DraftRunner(DraftModel):
    """A draft model runner with its own KV pool (page size 1) and rows, keyed by request."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.vocab_size = runner.model_config.vocab_size
        self.device = runner.device
        self.allocator = PageAllocator(runner.pool.num_slots, 1)
        self.rows = ReqToTokenRows(runner.req_to_token.shape[0])
        self._seqs: dict[Hashable, tuple[int, list[int]]] = {}

    def length(self, key: Hashable) -> int:
        seq = self._seqs.get(key)
        return len(seq[1]) if seq is not None else 0

    def release(self, key: Hashable) -> None:
        seq = self._seqs.pop(key, None)
        if seq is not None:
            self.allocator.free_slots(seq[1])
            self.rows.free(seq[0])

    def _room(self, keep: set[int], need: int) -> None:
        """Free whole sequences (not in ``keep``) until ``need`` slots are free."""
        for key in list(self._seqs):
            if self.allocator.free_tokens >= need:
                return
            if id(key) not in keep:
                self.release(key)
        if self.allocator.free_tokens < need:
            raise OutOfMemory(f"the draft KV pool is full ({need} slots needed)")

    @torch.inference_mode()
    def extend(self, items: Sequence[tuple[Hashable, int, Sequence[int]]]) -> torch.Tensor:
        keep = {id(k) for k, _, _ in items}
        blocks = []
        for key, start, tokens in items:
            seq = self._seqs.get(key)
            if seq is None:
                if self.rows.num_free == 0:
                    self._evict_row(keep)
                seq = (self.rows.alloc(), [])
                self._seqs[key] = seq
            row, slots = seq
            if start > len(slots):
                raise ValueError(f"draft sequence has {len(slots)} tokens; cannot extend at "
                                 f"{start}")
            if len(slots) > start:
                self.allocator.free_slots(slots[start:])
                del slots[start:]
            if self.allocator.free_tokens < len(tokens):
                self._room(keep, len(tokens))
            new, _ = self.allocator.slots_for(None, 0, len(tokens))
            slots.extend(new)
            blocks.append((row, start, tokens, new))
        one_each = all(len(tokens) == 1 for _, _, tokens in items)
        mode = ForwardMode.DECODE if one_each else ForwardMode.EXTEND
        batch = blocks_batch(mode, self.runner.req_to_token, blocks, every_row=False)
        return self.runner.forward(batch)

    def _evict_row(self, keep: set[int]) -> None:
        for key in list(self._seqs):
            if id(key) not in keep:
                self.release(key)
                return
        raise OutOfMemory("no free draft row")


class FeatureSink:
    """Per-slot features of the target's tokens, written by every target forward (the
    model's ``feature_sink``): [num_slots, width], moved with the KV of accepted nodes."""

    def __init__(self, layers: list[int], width: int, num_slots: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.layers = layers
        self.buf = torch.zeros((num_slots, width), dtype=dtype, device=device)

    def write(self, batch: Batch, feats: torch.Tensor) -> None:
        self.buf.index_copy_(0, batch.out_cache_loc, feats.to(self.buf.dtype))


class TargetView(TargetModel):
    """The target's embedding, head and (once :meth:`capture` is called) per-token features."""

    def __init__(self, runner: Any) -> None:
        self._runner = runner
        self._model = runner.model
        mc = runner.model_config
        self.hidden_size, self.vocab_size = mc.hidden_size, mc.vocab_size
        self.num_layers = mc.num_hidden_layers
        self.dtype, self.device = runner.dtype, runner.device
        self.rms_norm_eps = mc.rms_norm_eps
        #: while a verify step drafts: (its SpecDecoder, the scheduler, request id -> slots)
        self.step: tuple[Any, Any, dict[int, list[int]]] | None = None

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._model.model.embed_tokens(token_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._model.compute_logits(hidden).float()

    def capture(self, layers: Sequence[int] = ()) -> int:
        """From now on every target forward keeps each token's features: the final normed
        hidden state (``layers`` empty), or the inputs of ``layers`` concatenated (index
        ``num_layers``: the final normed state, as transformers' last hidden state). Returns
        the feature width. Decode and verify CUDA graphs are re-captured when needed."""
        bad = [i for i in layers if not 0 <= i <= self.num_layers]
        if bad:
            raise ConfigError(f"target layers {bad} to capture: the target has "
                              f"{self.num_layers} layers")
        width = self.hidden_size * max(1, len(layers))
        self._model.feature_sink = FeatureSink(list(layers), width, self._runner.pool.num_slots,
                                               self.dtype, self.device)
        if getattr(self._runner, "decode_graphs", None) is not None:
            self._runner.decode_graphs = self._runner._make_decode_graphs()
        verify = getattr(self._runner, "verify_graphs", None)
        if verify:  # captured without the sink: capture again
            self._runner.verify_graphs = []
            self._runner.capture_verify_graphs(verify[-1].width)
        return width

    def adapter(self, path: str | None, *, rank: int = 8, seed: int = 0) -> Any:
        from engine.runtime.lora import LoraAdapter

        if path is None:
            return LoraAdapter.random(self._model, rank=rank, seed=seed, device=self.device,
                                      dtype=self.dtype)
        return LoraAdapter.load(path, self._model, device=self.device, dtype=self.dtype)

    def prepare_block(self, width: int, *, adapter: Any = None, plain_rows: int = 0) -> None:
        make = getattr(self._runner, "block_graphs", None)
        if make is not None and width > 0:
            make(width, adapter, plain_rows)

    @torch.inference_mode()
    def run_block(self, requests: Sequence[Any], blocks: Sequence[Sequence[int]], *,
                  adapter: Any = None, plain_rows: int = 0) -> list[Any]:
        if self.step is None:
            raise RuntimeError("run_block is served while a verify step drafts (in propose)")
        if len(blocks) != len(requests):
            raise ValueError(f"{len(blocks)} blocks for {len(requests)} requests")
        spec, sched, slots = self.step
        return spec.run_block(sched, slots, requests, blocks, adapter, plain_rows)

    def features(self, request: Any, start: int, end: int) -> torch.Tensor:
        """Features of the request's tokens ``start .. end - 1`` (all in the target's KV)."""
        sink = self._model.feature_sink
        if sink is None:
            raise RuntimeError("features were not captured (call capture() first)")
        if end > request.kv_len:
            raise ValueError(f"token {end - 1} is not in the target's KV yet")
        slots = self._runner.req_to_token[request.row, start:end]
        return sink.buf.index_select(0, slots)


def load_draft_runner(config: Any, target: Any, registry: Any) -> DraftRunner:
    """The ``--speculative-draft-model-path`` model as a :class:`DraftRunner` whose pool holds
    as many tokens as the target's plus the drafts; ConfigError when there is no path, the
    vocabularies differ or it fails to load."""
    from engine.assembly import Assembly
    from engine.runtime.model_runner import ModelRunner

    path = config.speculative_draft_model_path
    if not path:
        raise ConfigError(f"--speculative-algorithm {config.speculative_algorithm} needs a "
                          "draft model: set --speculative-draft-model-path")
    width = config.speculative_num_draft_tokens or 16
    draft_cfg = config.replace(
        model_path=path, tokenizer_path=None, speculative_algorithm=None,
        load_format=config.speculative_draft_load_format or config.load_format,
        quantization=config.speculative_draft_model_quantization,
        max_total_tokens=target.max_total_num_tokens + target.max_running_requests * width,
        page_size=1, context_length=target.max_context_len,
        max_running_requests=target.max_running_requests, json_model_override_args=None,
        skip_tokenizer_init=True)
    try:
        runner = ModelRunner(draft_cfg, Assembly(draft_cfg, registry))
    except ConfigError as exc:
        raise ConfigError(f"--speculative-draft-model-path {path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any load failure is a start-up error
        raise ConfigError(f"--speculative-draft-model-path {path}: the draft model failed to "
                          f"load: {type(exc).__name__}: {exc}") from None
    check_same_vocab(target, runner, path)
    log.info("draft model %s: %d layers, KV pool of %d tokens", path,
             runner.model_config.num_hidden_layers, runner.max_total_num_tokens)
    return DraftRunner(runner)


def check_same_vocab(target: Any, draft: Any, path: str) -> None:
    """The draft must speak the target's token ids: same vocabulary size and, where both have
    a tokenizer, the same token strings."""
    tv, dv = target.model_config.vocab_size, draft.model_config.vocab_size
    if tv != dv:
        raise ConfigError(f"--speculative-draft-model-path {path}: its vocabulary has {dv} "
                          f"tokens, the target's {tv}; a draft must share the target's tokenizer")
    from engine.models.tokenizer import Tokenizer

    tt = target.tokenizer
    try:
        dt = Tokenizer.load(draft.model_config)
    except ConfigError:
        log.info("the draft model %s has no tokenizer of its own: only its vocabulary size is "
                 "checked against the target's", path)
        return
    if tt is not None:
        a, b = tt.get_vocab(), dt.get_vocab()
        if a != b:
            diff = len(set(a.items()) ^ set(b.items()))
            raise ConfigError(f"--speculative-draft-model-path {path}: its tokenizer differs from "
                              f"the target's ({diff} token entries differ); a draft must share "
                              "the target's tokenizer")
