"""The host tier of the hierarchical KV cache: a second KV pool in host memory, and the copies
between it and the device pool.

The host pool holds whole pages, like the device pool, in one of two layouts
(``--hicache-mem-layout``):

* ``layer_first``: ``k``/``v`` are ``[layers, slots, heads, head_dim]``, the device pool's layout
  per layer (a page's bytes are spread over the layers);
* ``page_first`` / ``page_first_direct``: one ``[pages, 2, layers, page_size, heads, head_dim]``
  tensor, so a page is one contiguous run that a store reads and writes in place.

A page's *payload* (what the storage tier keeps) is the same in both layouts: K then V, each
``[layers, page_size, heads, head_dim]`` in the model dtype, so pages written under one layout
are read under the other.

On CUDA the pool is pinned and copies run on a dedicated copy stream. A load from host waits
for the work already queued on the compute stream (the pages it fills must be free), then copies
layer by layer, an event behind each layer's copy; the next forward waits for layer ``i``'s
event just before it runs layer ``i`` (:class:`LayerLoads`, kept on the device pool), so the
copy of the later layers overlaps the compute of the earlier ones; the copies of the later
layers are themselves queued from those waits, a few layers ahead (:data:`LOAD_GROUPS_AHEAD`),
so that the host calls queueing them overlap the forward too. A backup to host first waits
for the compute stream (the K/V it copies must be written) and the compute stream waits for it
before its next kernel (which may reuse the pages); the host side waits for the copy before the
CPU reads the pages (a backup no CPU reads is not waited for).
``--hicache-io-backend kernel`` moves the rows of every layer's K and V in one Triton kernel
that reads or writes the pinned host pool in place (the GPU addresses pinned memory directly;
no copy on the host, but the kernel takes the multiprocessors the forward needs); ``direct``
(the default on a GPU), and ``kernel`` where the kernel cannot serve (a page-first layout,
host memory not pinned), copy runs of pages that follow each other on both sides. With a
layer-first host pool each run is one 2-D copy per side that covers a group of layers
(``cudaMemcpy2DAsync`` between pinned memory and the device: the copy engines, no kernel
beside the forward, a few calls per load; both pools keep each side's layers in one
allocation); else one copy per run, layer and side. On CPU the layer-first ``kernel`` path is
one index copy per layer and side (the default there: faster than runs of few pages).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import torch

PAGE_FIRST_LAYOUTS = ("page_first", "page_first_direct")


class HostKVPool:
    """Pages of K/V in host memory with their own free list (no reserved page)."""

    def __init__(self, device_pool: Any, num_tokens: int, *, layout: str = "layer_first",
                 pin: bool = False) -> None:
        ps = device_pool.page_size
        self.page_size, self.layout = ps, layout
        self.num_layers = device_pool.num_layers
        self.dtype = device_pool.dtype
        self.num_pages = max(0, num_tokens // ps)
        if self.num_pages < 1:
            raise ValueError(f"a host pool of {num_tokens} tokens holds no page of {ps}")
        width = device_pool.row_width  # a head's row as the device pool stores it
        self.page_shape = (2, device_pool.num_layers, ps, device_pool.num_kv_heads, width)
        self.page_first = layout in PAGE_FIRST_LAYOUTS
        L, H, D = device_pool.num_layers, device_pool.num_kv_heads, width
        if self.page_first:
            self.data = torch.zeros((self.num_pages, *self.page_shape), dtype=self.dtype,
                                    pin_memory=pin)
        else:
            slots = self.num_pages * ps
            self.k = torch.zeros((L, slots, H, D), dtype=self.dtype, pin_memory=pin)
            self.v = torch.zeros((L, slots, H, D), dtype=self.dtype, pin_memory=pin)
        elem = torch.empty((), dtype=self.dtype).element_size()
        self.payload_bytes = elem * 2 * L * ps * H * D
        self._free: list[int] = []
        self.reset()

    # ------------------------------------------------------------------ pages

    def reset(self) -> None:
        self._free = list(range(self.num_pages - 1, -1, -1))

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def free_tokens(self) -> int:
        return len(self._free) * self.page_size

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Host slots for ``num_tokens`` (a multiple of the page size), or None if short."""
        n = num_tokens // self.page_size
        if n > len(self._free):
            return None
        pages = self._free[len(self._free) - n:]
        del self._free[len(self._free) - n:]
        pages.reverse()
        return _slots(pages, self.page_size)

    def free(self, slots: torch.Tensor) -> None:
        """Give the pages of ``slots`` back, highest first (as
        :meth:`engine.runtime.allocator.PageAllocator.free_pages`: handed out again in
        ascending runs)."""
        self._free.extend(sorted(_pages(slots, self.page_size), reverse=True))

    # ------------------------------------------------------------------ page payloads

    def page_payload(self, page_slot: int) -> Any:
        """The payload of the page starting at host slot ``page_slot``, as a uint8 array: a
        view into the pool (page-first layouts) or a contiguous copy (layer_first)."""
        ps = self.page_size
        if self.page_first:
            return self.data[page_slot // ps].view(-1).view(torch.uint8).numpy()
        kv = torch.stack((self.k[:, page_slot:page_slot + ps], self.v[:, page_slot:page_slot + ps]))
        return kv.contiguous().view(-1).view(torch.uint8).numpy()

    def write_payload(self, page_slot: int, payload: Any) -> None:
        """Fill the page at ``page_slot`` from ``payload`` bytes (a payload's layout)."""
        if isinstance(payload, bytes) or getattr(payload, "readonly", False):
            payload = bytearray(payload)  # torch wants a writable buffer
        src = torch.frombuffer(payload, dtype=torch.uint8).view(self.dtype).view(self.page_shape)
        ps = self.page_size
        if self.page_first:
            self.data[page_slot // ps].copy_(src)
        else:
            self.k[:, page_slot:page_slot + ps].copy_(src[0])
            self.v[:, page_slot:page_slot + ps].copy_(src[1])


def _pages(slots: torch.Tensor, page_size: int) -> list[int]:
    return (slots[::page_size] // page_size).tolist()


def _slots(pages: list[int], page_size: int) -> torch.Tensor:
    p = torch.tensor(pages, dtype=torch.long)
    return (p[:, None] * page_size + torch.arange(page_size)).reshape(-1)


#: layers one ``direct`` load copies together where runs are copied in 2-D (one copy per run
#: and side covers the group; an event behind each group): the forward waits for the first
#: group before its first layer, and every group adds a copy per run and side
DIRECT_LOAD_LAYERS = 4
#: a CUDA load's layer groups queued on the copy stream when the load is queued; each later
#: group is queued by the forward itself, this many groups ahead of the layer it waits for
#: (:meth:`Transfer.to_device`): the host calls that queue copies (one per run of pages, group
#: and side: a few hundred for a scattered ~2k-token prefix) then run beside the forward's
#: device time instead of before its first launch
LOAD_GROUPS_AHEAD = 2


def _layer_pitch(tensors: list[torch.Tensor]) -> int | None:
    """Bytes from each of ``tensors`` to the next where that distance is the same for all
    (and covers a tensor: no overlap), else None."""
    ptrs = [t.data_ptr() for t in tensors]
    size = tensors[0].numel() * tensors[0].element_size()
    if len(ptrs) == 1:
        return size
    pitch = ptrs[1] - ptrs[0]
    if pitch < size or any(b - a != pitch for a, b in zip(ptrs, ptrs[1:])):
        return None
    return pitch


def memcpy_2d(device: torch.device) -> Callable[..., None] | None:
    """``copy(dst, dpitch, src, spitch, width, height, to_host=)``: ``height`` rows of
    ``width`` bytes from address ``src`` to ``dst``, rows ``spitch`` / ``dpitch`` bytes apart;
    on CUDA ``cudaMemcpy2DAsync`` on the current stream (between pinned host memory and the
    device: the copy engines), None where the CUDA runtime cannot be reached; on a CPU, row
    by row."""
    if torch.device(device).type == "cpu":
        return _memcpy_2d_cpu
    fn = _cudart_memcpy_2d()
    if fn is None:
        return None

    def copy(dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, *,
             to_host: bool) -> None:
        kind = 2 if to_host else 1  # cudaMemcpyDeviceToHost / cudaMemcpyHostToDevice
        err = fn(dst, dpitch, src, spitch, width, height, kind,
                 torch.cuda.current_stream(device).cuda_stream)
        if err:
            raise RuntimeError(f"cudaMemcpy2DAsync failed with CUDA error {err}")
    return copy


def _memcpy_2d_cpu(dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, *,
                   to_host: bool) -> None:
    import ctypes

    for i in range(height):
        ctypes.memmove(dst + i * dpitch, src + i * spitch, width)


@functools.lru_cache(maxsize=1)
def _cudart_memcpy_2d() -> Any:
    """``cudaMemcpy2DAsync`` of the CUDA runtime this process loaded with torch (ctypes), or
    None."""
    import ctypes

    path = None
    try:
        with open("/proc/self/maps") as fh:
            path = next((line.split()[-1] for line in fh if "libcudart.so" in line), None)
    except OSError:
        pass
    try:
        fn = ctypes.CDLL(path or "libcudart.so").cudaMemcpy2DAsync
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                   ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


class LayerLoads:
    """Copies into a device pool that the compute stream has not been ordered after yet, per
    layer (the pool's :attr:`engine.runtime.attention.KVPool.loads`). Each entry orders what
    the compute stream runs next after one queued copy of that layer: on CUDA a wait for the
    event recorded behind it on the copy stream; on a CPU the copy itself, deferred until the
    layer is waited for, so a reader that does not wait sees the old pages there as it could
    on a GPU (the tests rely on it)."""

    def __init__(self, num_layers: int) -> None:
        self.pending: list[list[Callable[[], None]]] = [[] for _ in range(num_layers)]

    def add(self, layer: int, order: Callable[[], None]) -> None:
        self.pending[layer].append(order)

    def wait(self, layer: int) -> None:
        """Order the compute stream's next work after ``layer``'s copies."""
        orders, self.pending[layer] = self.pending[layer], []
        for order in orders:
            order()

    def wait_all(self) -> None:
        for layer in range(len(self.pending)):
            self.wait(layer)


class Transfer:
    """Copies whole pages between the device pool and the host pool (see the module docstring
    for the streams). Loads to the device go layer by layer: each layer's copy is queued
    behind the previous one and recorded in the device pool's :class:`LayerLoads`, which the
    next forward waits for layer by layer, so a load overlaps the layers that run before."""

    #: programs per K or V tensor of a layer's load (None: one per few rows). Reading pinned
    #: host memory in place is latency-bound: on an H200 (8B model, ~2k-token hits) capping the
    #: programs to leave the forward more multiprocessors made hits slower (TTFT p50 36 ms at
    #: 64, 39 at 16, 29 uncapped), so the copy takes the whole grid.
    LOAD_PROGRAMS: int | None = None

    def __init__(self, device_pool: Any, host: HostKVPool, io_backend: str | None = None
                 ) -> None:
        """``io_backend`` None: the faster copies measured on the device (docs/benchmarks/
        hicache.md): ``direct`` on a GPU (the copy engines), ``kernel`` on CPU (index
        copies)."""
        self.cuda = device_pool.device.type == "cuda"
        self.dev, self.host = device_pool, host
        self.io = io_backend or ("direct" if self.cuda else "kernel")
        self.stream = torch.cuda.Stream(device_pool.device) if self.cuda else None
        self._addr: Any = None  #: see _tables
        self._pitch: Any = None  #: see _pitches
        #: CUDA: layer groups of loads not yet queued on the copy stream, in the order their
        #: loads were asked for (see :meth:`to_device`)
        self._deferred: collections.deque[Callable[[], None]] = collections.deque()

    def to_host(self, dev_slots: torch.Tensor, host_slots: torch.Tensor, *,
                wait: bool = True) -> None:
        """Copy the pages at device ``dev_slots`` into host ``host_slots`` (equal lengths);
        ``wait``: return once the pages are in host memory (the CPU reads them next), else
        they are once :meth:`settle` returns (device work queued later, loads from the host
        included, comes after the copy anyway). Queued behind every load (one copy stream), so
        the compute stream, which waits for the copy before it reuses the pages, waits for
        those loads too."""
        if self.stream is None:
            self.dev.settle_loads()  # the loads queued earlier come first, as on one stream
            self._copy(dev_slots, host_slots, to_host=True)
            return
        self._queue_deferred()  # the loads asked for earlier come first on the copy stream
        compute = torch.cuda.current_stream(self.dev.device)
        self.stream.wait_stream(compute)  # the K/V to copy are written
        with torch.cuda.stream(self.stream):
            self._copy(dev_slots, host_slots, to_host=True)
        compute.wait_stream(self.stream)  # later kernels do not overwrite the pages first
        if wait:
            self.stream.synchronize()

    def to_device(self, host_slots: torch.Tensor, dev_slots: torch.Tensor) -> None:
        """Queue the copy of the pages at host ``host_slots`` into device ``dev_slots``, one
        layer after the other, each recorded in the device pool's pending loads."""
        loads = self.dev.loads
        if loads is None:
            loads = self.dev.loads = LayerLoads(self.host.num_layers)
        if self.stream is None:
            prepared = self._prepare(dev_slots, host_slots)
            for layer in range(self.host.num_layers):
                loads.add(layer, functools.partial(self._copy, dev_slots, host_slots,
                                                   to_host=False, layers=range(layer, layer + 1),
                                                   prepared=prepared))
            return
        dev = self.dev.device
        self.stream.wait_stream(torch.cuda.current_stream(dev))  # the slots are free to fill
        with torch.cuda.stream(self.stream):
            prepared = self._prepare(dev_slots, host_slots)
        # runs copied in 2-D (one copy covers a group of layers): an event per group. The
        # first LOAD_GROUPS_AHEAD groups are queued now; each later one when the forward waits
        # for a layer that many groups before it (every group asked for earlier first: the
        # copy stream keeps the order the copies were asked in)
        group = DIRECT_LOAD_LAYERS if isinstance(prepared, list) and self._pitches() else 1
        n = self.host.num_layers
        groups = [range(first, min(n, first + group)) for first in range(0, n, group)]
        events: list[torch.cuda.Event | None] = [None] * len(groups)

        def queue(k: int) -> None:
            with torch.cuda.stream(self.stream):
                self._copy(dev_slots, host_slots, to_host=False, layers=groups[k],
                           prepared=prepared)
                done = events[k] = torch.cuda.Event()
                done.record(self.stream)

        def queue_through(k: int) -> None:  # (the groups asked for before it first)
            while events[min(k, len(groups) - 1)] is None:
                self._deferred.popleft()()

        def order(k: int) -> None:
            queue_through(k + LOAD_GROUPS_AHEAD)
            torch.cuda.current_stream(dev).wait_event(events[k])

        for k, layers in enumerate(groups):
            self._deferred.append(functools.partial(queue, k))
            for layer in layers:
                loads.add(layer, functools.partial(order, k))
        queue_through(LOAD_GROUPS_AHEAD - 1)

    def _queue_deferred(self) -> None:
        """Queue every layer group of a load not yet on the copy stream (before a copy that
        must come after them, or a wait for all of them)."""
        while self._deferred:
            self._deferred.popleft()()

    def settle(self) -> None:
        """Wait for the copies queued so far (before the CPU reads or writes host pages)."""
        if self.stream is not None:
            self._queue_deferred()
            self.stream.synchronize()
        else:  # CPU: the deferred loads run now
            self.dev.settle_loads()

    def _prepare(self, dev_slots: torch.Tensor, host_slots: torch.Tensor) -> Any:
        """What every layer's copy of these slots shares: the copy kernel's index vectors on
        the device, or the runs of pages for run copies (None: CPU index copies)."""
        if not self.cuda and not self.host.page_first and self.io != "direct":
            return None
        if self.io == "kernel" and self._tables() is not None:
            from engine.runtime.batch import to_device

            dev = self.dev.device
            return (to_device(dev_slots, dev) if dev_slots.device.type == "cpu" else dev_slots,
                    to_device(host_slots, dev))
        h, ps = self.host, self.host.page_size
        runs: list[list[int]] = []  # [device start, host start, pages]
        for d0, h0 in zip(dev_slots[::ps].tolist(), host_slots[::ps].tolist()):
            if runs and not h.page_first and runs[-1][0] + runs[-1][2] * ps == d0 \
                    and runs[-1][1] + runs[-1][2] * ps == h0:
                runs[-1][2] += 1
            else:
                runs.append([d0, h0, 1])
        return runs

    def _copy(self, dev_slots: torch.Tensor, host_slots: torch.Tensor, *, to_host: bool,
              layers: range | None = None, prepared: Any = None) -> None:
        h = self.host
        layers = layers if layers is not None else range(h.num_layers)
        if prepared is None:
            prepared = self._prepare(dev_slots, host_slots)
        if prepared is None:  # CPU, layer-first: index copies
            for layer in layers:
                for dev, hk in ((self.dev.k[layer], h.k[layer]), (self.dev.v[layer], h.v[layer])):
                    if to_host:
                        hk.index_copy_(0, host_slots, dev.index_select(0, dev_slots))
                    else:
                        dev.index_copy_(0, dev_slots, hk.index_select(0, host_slots))
        elif isinstance(prepared, tuple):
            self._copy_in_place(prepared, layers, to_host=to_host)
        else:
            self._copy_runs(prepared, layers, to_host=to_host)

    def _tables(self) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """The device's and the pinned host pool's K and V base addresses (device tensors
        ``[layers, 2]``: a layer's K and V) and the bytes of a row, for the copy kernel; None
        where it cannot serve (a page-first layout, host memory not pinned, rows not whole
        32-bit words: those copy runs of pages)."""
        if self._addr is None:
            h, d = self.host, self.dev
            row_bytes = 0 if h.page_first else h.k[0, 0].numel() * h.k.element_size()
            if h.page_first or not h.k.is_pinned() or row_bytes % 4:
                self._addr = False
            else:
                self._addr = (*(torch.tensor([[k.data_ptr(), v.data_ptr()] for k, v in zip(ks, vs)],
                                             dtype=torch.long, device=d.device)
                                for ks, vs in ((d.k, d.v), (list(h.k), list(h.v)))), row_bytes)
        return self._addr or None

    def _copy_runs_2d(self, runs: list[list[int]], layers: range,
                      pitches: tuple[int, int, int, int], *, to_host: bool) -> None:
        h, d = self.host, self.dev
        row = d.k[0][0].numel() * d.k[0].element_size()  # bytes of a slot's K (or V)
        copy = memcpy_2d(d.device)
        first, height = layers.start, len(layers)
        for dev_t, host_t, dpitch, hpitch in ((d.k, h.k, pitches[0], pitches[2]),
                                              (d.v, h.v, pitches[1], pitches[3])):
            dev_base, host_base = dev_t[first].data_ptr(), host_t[first].data_ptr()
            for d0, h0, n in runs:
                width = n * h.page_size * row
                dptr, hptr = dev_base + d0 * row, host_base + h0 * row
                if to_host:
                    copy(hptr, hpitch, dptr, dpitch, width, height, to_host=True)
                else:
                    copy(dptr, dpitch, hptr, hpitch, width, height, to_host=False)

    def _copy_in_place(self, idx: tuple[torch.Tensor, torch.Tensor], layers: range, *,
                       to_host: bool) -> None:
        """CUDA, layer-first pinned pool: one kernel moves the K and V rows of ``layers``,
        reading or writing the pinned host pool in place (no host-side copy at all); a single
        layer (a load beside a forward) with at most :attr:`LOAD_PROGRAMS` programs."""
        from engine.runtime.fused_triton import copy_rows

        dev_addr, host_addr, row_bytes = self._tables()
        dev_addr = dev_addr[layers.start:layers.stop].reshape(-1)
        host_addr = host_addr[layers.start:layers.stop].reshape(-1)
        d_idx, h_idx = idx
        programs = self.LOAD_PROGRAMS if len(layers) == 1 else None
        if to_host:
            copy_rows(dev_addr, host_addr, d_idx, h_idx, row_bytes, programs)
        else:
            copy_rows(host_addr, dev_addr, h_idx, d_idx, row_bytes, programs)

    def _pitches(self) -> tuple[int, int, int, int] | None:
        """Bytes from one layer's K (V) to the next's in the device pool and in the host pool
        (device K, device V, host K, host V), where each side's layers lie at a constant
        distance (one allocation, layer-first) and copies of runs across layers can be 2-D
        (:func:`memcpy_2d`); None otherwise (a page-first host pool, per-layer device
        tensors, or no 2-D copy on this device)."""
        if self._pitch is None:
            h, d = self.host, self.dev
            pitches = None
            if not h.page_first and memcpy_2d(d.device) is not None:
                pitches = (_layer_pitch(d.k), _layer_pitch(d.v), _layer_pitch(list(h.k)),
                           _layer_pitch(list(h.v)))
                if None in pitches:
                    pitches = None
            self._pitch = pitches or False
        return self._pitch or None

    def _copy_runs(self, runs: list[list[int]], layers: range, *, to_host: bool) -> None:
        """Each run of pages that follow each other on both sides (``[device start, host
        start, pages]``): where both pools keep their layers at constant distances, one 2-D
        copy per run and side covers ``layers`` (``cudaMemcpy2DAsync`` between pinned host
        memory and the device on CUDA: the copy engines, no kernel, a handful of calls per
        load); else one copy per run, layer and side."""
        pitches = self._pitches()
        if pitches is not None:
            self._copy_runs_2d(runs, layers, pitches, to_host=to_host)
            return
        h, ps = self.host, self.host.page_size
        for layer in layers:
            for d0, h0, n in runs:
                for kind, dev in ((0, self.dev.k[layer]), (1, self.dev.v[layer])):
                    dslice = dev[d0:d0 + n * ps]
                    hslice = (h.data[h0 // ps, kind, layer] if h.page_first
                              else (h.k if kind == 0 else h.v)[layer, h0:h0 + n * ps])
                    if to_host:
                        hslice.copy_(dslice, non_blocking=self.cuda)
                    else:
                        dslice.copy_(hslice, non_blocking=self.cuda)
