"""The host tier's copies on a CUDA device: pinned host pool, copy stream, both I/O backends and
every layout (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from engine.runtime.attention import KVPool
from engine.runtime.host_pool import HostKVPool, Transfer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

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
        loads = dev.take_loads()
        for layer in range(4):  # read on the compute stream once it waited for the layer's copy
            loads.wait(layer)
            assert torch.equal(dev.k[layer][dst], want_k[layer])
            assert torch.equal(dev.v[layer][dst], want_v[layer])
        payload = host.page_payload(int(slots[0]))
        ref = torch.stack([torch.stack([w[:PS] for w in want_k]),
                           torch.stack([w[:PS] for w in want_v])]).cpu()
        assert bytes(payload) == ref.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        host.free(slots)


@pytest.mark.parametrize("io", ["kernel", "direct"])
def test_a_loads_later_layer_groups_are_queued_as_the_forward_reaches_them(io) -> None:
    from engine.runtime.host_pool import DIRECT_LOAD_LAYERS, LOAD_GROUPS_AHEAD

    n = 12
    dev = KVPool(num_layers=n, num_kv_heads=2, head_dim=64, num_slots=64 * PS, page_size=PS,
                 dtype=torch.bfloat16, device=torch.device("cuda"))
    host = HostKVPool(dev, 32 * PS, pin=True)
    t = Transfer(dev, host, io)
    per = DIRECT_LOAD_LAYERS if io == "direct" else 1
    groups = -(-n // per)
    src = torch.arange(4 * PS, 10 * PS)
    for layer in range(n):
        dev.k[layer].normal_()
        dev.v[layer].normal_()
    want = [(dev.k[layer][src].clone(), dev.v[layer][src].clone()) for layer in range(n)]
    slots = host.alloc(len(src))
    t.to_host(src.cuda() if io == "kernel" else src, slots)
    dst = torch.arange(40 * PS, 46 * PS)
    t.to_device(slots, dst)
    assert len(t._deferred) == groups - LOAD_GROUPS_AHEAD, "the first groups are queued"
    loads = dev.take_loads()
    for layer in range(n):
        loads.wait(layer)
        queued = min(groups, layer // per + 1 + LOAD_GROUPS_AHEAD)
        assert len(t._deferred) == groups - queued, layer
        assert torch.equal(dev.k[layer][dst], want[layer][0]), layer
        assert torch.equal(dev.v[layer][dst], want[layer][1]), layer
    # a backup asked for after a load comes after all of the load's copies on the copy
    # stream: its pages are what the load wrote
    for layer in range(n):
        dev.k[layer][dst] = 0
        dev.v[layer][dst] = 0
    t.to_device(slots, dst)
    back = host.alloc(len(src))
    t.to_host(dst.cuda() if io == "kernel" else dst, back)
    assert not t._deferred
    dev.settle_loads()
    for layer in range(n):
        assert torch.equal(host.k[layer][back].to(want[layer][0].device), want[layer][0])


def tiny_llama() -> dict:
    """The overlap test's tiny Llama, with four layers (more layers to load one by one)."""
    from test_sched_overlap_cuda import CONFIG

    return {**CONFIG, "num_hidden_layers": 4}


def test_host_hits_loaded_layer_by_layer_give_the_computed_outputs(tmp_path) -> None:
    """A tiny Llama behind triton: prompts evicted from a device pool of two come back from the
    host tier, loaded layer by layer beside the forward that reads them, with the tokens and
    log-probabilities they had when computed."""
    import json

    from engine import Engine
    from engine.config import ServerConfig
    from engine.runtime.model_runner import ModelRunner

    (tmp_path / "config.json").write_text(json.dumps(tiny_llama()))
    torch.manual_seed(0)
    runner = ModelRunner(ServerConfig(model_path=str(tmp_path), load_format="dummy",
                                      device="cuda", dtype="float32", skip_tokenizer_init=True,
                                      attention_backend="triton", page_size=PS,
                                      context_length=512, max_total_tokens=400,
                                      max_running_requests=4))
    prompts = [[(11 * i + 5 * j) % 500 + 3 for j in range(150)] for i in range(4)]
    params = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True,
              "logprobs": True}
    engine = Engine(runner=runner, skip_tokenizer_init=True, enable_hierarchical_cache=True,
                    hicache_ratio=4.0, page_size=PS)
    first = [engine.generate([p], params)[0] for p in prompts]
    again = [engine.generate([p], params)[0] for p in prompts]  # each evicted meanwhile
    for a, b in zip(first, again):
        assert b["meta_info"]["cached_tokens"] >= 144
        assert a["output_ids"] == b["output_ids"]
        la = torch.tensor(a["meta_info"]["output_token_logprobs"])
        lb = torch.tensor(b["meta_info"]["output_token_logprobs"])
        assert torch.allclose(la, lb, atol=1e-4)
    tiers = engine.runtime.scheduler.cache
    assert tiers.transfer.dev.loads is None  # every load was waited for
