"""A tiny slot allocator and batch builder for tests, benchmarks and conformance kits.

It plays the scheduler's part in the smallest way: whole pages per request (page 0 reserved),
handed out in a shuffled order when ``shuffle`` is set so that a request's pages are not
contiguous, ``req_to_token`` rows written before each :class:`Batch` is built.
"""

from __future__ import annotations

import random

import torch

from engine.runtime.batch import Batch, ForwardMode


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
        self.req_to_token[row, :len(slots)] = torch.tensor(slots, dtype=torch.int64)
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
        rows, prefix, ext = [], [], []
        for row, tokens in items:
            start = self.lengths[row]
            locs += self._grow(row, len(tokens))
            ids += tokens
            pos += range(start, start + len(tokens))
            rows.append(row)
            prefix.append(start)
            ext.append(len(tokens))
            self.lengths[row] = start + len(tokens)
        seq = [p + e for p, e in zip(prefix, ext)]
        ends = torch.tensor(ext).cumsum(0) - 1
        logits = torch.arange(len(ids)) if all_logits else ends

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        return Batch(mode=mode, input_ids=t(ids), positions=t(pos), out_cache_loc=t(locs),
                     req_pool_indices=t(rows), seq_lens=t(seq), prefix_lens=t(prefix),
                     extend_lens=t(ext), req_to_token=self.req_to_token, seq_lens_cpu=seq,
                     prefix_lens_cpu=prefix, extend_lens_cpu=ext,
                     logits_indices=logits.to(self.device))
