"""A tiny slot allocator and batch builder for tests, benchmarks and conformance kits.

It plays the scheduler's part in the smallest way: whole pages per request (page 0 reserved),
handed out in a shuffled order when ``shuffle`` is set so that a request's pages are not
contiguous, the new tokens' ``req_to_token`` entries written before each :class:`Batch` is built
(as the scheduler does: the batch's vectors in one host-to-device copy, one scatter into the
table; benchmarks that drive the model runner through it time what serving costs).
"""

from __future__ import annotations

import random

import torch

from engine.runtime.batch import Batch, ForwardMode, pack_to_device


class BatchBuilder:
    """Requests are rows of ``req_to_token``; ``extend``/``decode`` build the next batch."""

    def __init__(self, req_to_token: torch.Tensor, num_slots: int, page_size: int,
                 *, shuffle: bool = False, seed: int = 0) -> None:
        self.req_to_token, self.page_size = req_to_token, page_size
        self.device = req_to_token.device
        pages = list(range(1, num_slots // page_size))
        if shuffle:
            random.Random(seed).shuffle(pages)
        self.free_pages = pages
        self.lengths: dict[int, int] = {}
        self.slots: dict[int, list[int]] = {}

    def new_request(self) -> int:
        row = next(r for r in range(self.req_to_token.shape[0]) if r not in self.lengths)
        self.lengths[row], self.slots[row] = 0, []
        return row

    def free(self, row: int) -> None:
        slots = self.slots.pop(row)
        self.free_pages += sorted({s // self.page_size for s in slots})
        del self.lengths[row]

    def _grow(self, row: int, n: int) -> list[int]:
        slots = self.slots[row]
        new = []
        for _ in range(n):
            if len(slots) % self.page_size == 0:
                if not self.free_pages:
                    raise RuntimeError("out of KV pages")
                page = self.free_pages.pop(0)
                slots.append(page * self.page_size)
            else:
                slots.append(slots[-1] + 1)
            new.append(slots[-1])
        return new

    def extend(self, items: list[tuple[int, list[int]]], *, all_logits: bool = False) -> Batch:
        """New tokens for each ``(row, token_ids)``; logits of each request's last token (or of
        every token with ``all_logits``)."""
        return self._build(ForwardMode.EXTEND, items, all_logits)

    def decode(self, items: list[tuple[int, int]]) -> Batch:
        return self._build(ForwardMode.DECODE, [(r, [t]) for r, t in items], False)

    def _build(self, mode: ForwardMode, items: list[tuple[int, list[int]]],
               all_logits: bool) -> Batch:
        ids, pos, locs = [], [], []
        rows, prefix, ext, row_idx = [], [], [], []
        for row, tokens in items:
            start = self.lengths[row]
            locs += self._grow(row, len(tokens))
            row_idx += [row] * len(tokens)
            ids += tokens
            pos += range(start, start + len(tokens))
            rows.append(row)
            prefix.append(start)
            ext.append(len(tokens))
            self.lengths[row] = start + len(tokens)
        seq = [p + e for p, e in zip(prefix, ext)]
        logits = list(range(len(ids))) if all_logits else \
            (torch.tensor(ext).cumsum(0) - 1).tolist()
        (ids_t, pos_t, loc_t, row_idx_t, rows_t, seq_t, prefix_t, ext_t, logits_t), _ = \
            pack_to_device([ids, pos, locs, row_idx, rows, seq, prefix, ext, logits],
                           self.device)
        self.req_to_token[row_idx_t, pos_t] = loc_t
        return Batch(mode=mode, input_ids=ids_t, positions=pos_t, out_cache_loc=loc_t,
                     req_pool_indices=rows_t, seq_lens=seq_t, prefix_lens=prefix_t,
                     extend_lens=ext_t, req_to_token=self.req_to_token, seq_lens_cpu=seq,
                     prefix_lens_cpu=prefix, extend_lens_cpu=ext, logits_indices=logits_t)
