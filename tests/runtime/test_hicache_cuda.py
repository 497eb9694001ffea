"""The host tier's copies on a CUDA device: pinned host pool, copy stream, both I/O backends and
every layout (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from engine.runtime.attention import KVPool
from engine.runtime.host_pool import HostKVPool, Transfer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PS = 16


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
@pytest.mark.parametrize("io", ["kernel", "direct"])
def test_pages_round_trip_through_pinned_host_memory_on_the_copy_stream(layout, io) -> None:
    dev = KVPool(num_layers=4, num_kv_heads=8, head_dim=128, num_slots=64 * PS, page_size=PS,
                 dtype=torch.bfloat16, device=torch.device("cuda"))
    host = HostKVPool(dev, 32 * PS, layout=layout, pin=True)
    assert (host.data if host.page_first else host.k).is_pinned()
    t = Transfer(dev, host, io)
    src = torch.arange(4 * PS, 12 * PS)  # pages 4..11
    for _ in range(3):
        # the compute stream writes the K/V, then the copy stream backs it up and brings it back
        for layer in range(4):
            dev.k[layer].normal_()
            dev.v[layer].normal_()
        want_k = [dev.k[layer][src].clone() for layer in range(4)]
        want_v = [dev.v[layer][src].clone() for layer in range(4)]
        slots = host.alloc(len(src))
        t.to_host(src.cuda() if io == "kernel" else src, slots)
        for layer in range(4):  # the device pages are reused at once (as after an eviction)
            dev.k[layer][src] = 0
            dev.v[layer][src] = 0
        dst = torch.arange(40 * PS, 48 * PS)
        t.to_device(slots, dst)
        for layer in range(4):  # read on the compute stream, which waited for the copy
            assert torch.equal(dev.k[layer][dst], want_k[layer])
            assert torch.equal(dev.v[layer][dst], want_v[layer])
        payload = host.page_payload(int(slots[0]))
        ref = torch.stack([torch.stack([w[:PS] for w in want_k]),
                           torch.stack([w[:PS] for w in want_v])]).cpu()
        assert bytes(payload) == ref.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        host.free(slots)
