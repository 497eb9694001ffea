"""KV memory bookkeeping: pages of the pool's token slots, and rows of ``req_to_token``.

Page ``p`` covers slots ``[p * page_size, (p + 1) * page_size)``. Page 0 holds the reserved
padding slot 0 and is never handed out. A request's token ``i`` lives at
``page_of_block(i // page_size) * page_size + i % page_size``: whole pages per request, so a
page-aligned prefix can be shared through the radix cache by copying slot indices.
"""

from __future__ import annotations

import torch


class OutOfMemory(RuntimeError):
    """Not enough free pages (the scheduler evicts, retracts or waits; it never lets this out)."""


class PageAllocator:
    """Free list of pages over ``num_slots`` token slots (slot 0 reserved)."""

    def __init__(self, num_slots: int, page_size: int) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        if self.num_pages < 2:
            raise ValueError(f"a pool of {num_slots} slots holds no usable page of {page_size}")
        self._free: list[int] = []
        self.reset()

    def reset(self) -> None:
        """Every page but page 0 becomes free (lowest pages are handed out first)."""
        self._free = list(range(self.num_pages - 1, 0, -1))

    @property
    def capacity_tokens(self) -> int:
        """Tokens that fit when every usable page is in use."""
        return (self.num_pages - 1) * self.page_size

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    @property
    def free_tokens(self) -> int:
        return len(self._free) * self.page_size

    def alloc_pages(self, n: int) -> list[int]:
        """Take ``n`` pages; raise :class:`OutOfMemory` (taking none) when fewer are free."""
        if n > len(self._free):
            raise OutOfMemory(f"need {n} KV pages, {len(self._free)} free")
        if n == 0:
            return []
        taken = self._free[-n:]
        del self._free[-n:]
        taken.reverse()
        return taken

    def free_pages(self, pages: list[int]) -> None:
        """Give pages back (each must have been handed out and not freed since). They go on
        the free list highest first, so that taking them again hands them out in ascending
        runs: the copies of a hierarchical cache move a run of consecutive pages in one
        transfer."""
        self._free.extend(sorted(pages, reverse=True))

    def free_slots(self, slots: torch.Tensor | list[int]) -> None:
        """Free the pages holding ``slots`` (page-aligned runs of a request's slots)."""
        p = self.page_size
        if isinstance(slots, torch.Tensor):  # (a radix node's slots: hundreds at a time)
            if not slots.numel():
                return
            pages = torch.unique(torch.div(slots, p, rounding_mode="floor")).tolist()
        elif not slots:
            return
        else:
            pages = sorted({s // p for s in slots})
        self.free_pages(pages)

    def slots_for(self, last_slot: int | None, start: int, n: int) -> tuple[list[int], list[int]]:
        """Slots for a request's tokens ``start .. start + n - 1``, allocating whole pages.

        ``last_slot`` is the slot of token ``start - 1`` (None when ``start == 0``); a partly
        filled page continues there. Returns ``(slots, new_pages)``; raises :class:`OutOfMemory`
        when the pages do not fit (taking none).
        """
        p = self.page_size
        if n <= 0:
            return [], []
        used_in_last = start % p
        room = p - used_in_last if used_in_last else 0
        need_pages = -(-(n - room) // p) if n > room else 0
        pages = self.alloc_pages(need_pages)
        slots: list[int] = []
        if room:
            assert last_slot is not None, "a partly filled page needs the previous slot"
            slots.extend(range(last_slot + 1, last_slot + 1 + min(room, n)))
        for page in pages:
            base = page * p
            slots.extend(range(base, base + min(p, n - len(slots))))
        return slots, pages

    def pages_needed(self, start: int, n: int) -> int:
        """Pages that :meth:`slots_for` would take for ``n`` tokens after ``start``."""
        p = self.page_size
        room = (p - start % p) % p
        return -(-(n - room) // p) if n > room else 0


class ReqToTokenRows:
    """Free list over the rows of the model runner's ``req_to_token`` table."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self._free = list(range(num_rows - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise OutOfMemory("no free request row")
        return self._free.pop()

    def free(self, row: int) -> None:
        self._free.append(row)
