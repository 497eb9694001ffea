"""flashinfer plugin: its page table (checked on CPU: no flashinfer needed), its refusal of a CPU
pool, its availability line here, and the conformance kit on CUDA (page sizes 1 and 16; page 64 in benchmarks/attention_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from engine.config import ServerConfig
from engine.errors import PluginError
from engine.runtime.attention import KVPool
from engine.testing.batches import BatchBuilder


def test_page_table_from_req_to_token():
    from engine_attention_flashinfer.impl import page_table

    ps = 4
    builder = BatchBuilder(torch.zeros((4, 64), dtype=torch.int64), 40 * ps, ps, shuffle=True,
                           seed=3)
    rows = [builder.new_request() for _ in range(3)]
    batch = builder.extend([(r, [1] * n) for r, n in zip(rows, (1, 8, 10))])
    table = page_table(batch, ps)
    assert table.kv_indptr.tolist() == [0, 1, 3, 6]
    assert table.kv_last_page_len.tolist() == [1, 4, 2]
    assert table.qo_indptr.tolist() == [0, 1, 9, 19]
    ptr = table.kv_indptr.tolist()
    for i, (r, n) in enumerate(zip(rows, (1, 8, 10))):
        pages = table.kv_indices[ptr[i]:ptr[i + 1]].tolist()
        # token j of the request lives in row j % ps of its (j // ps)-th listed page
        assert [pages[j // ps] * ps + j % ps for j in range(n)] == \
            batch.req_to_token[r, :n].tolist()
    assert table.kv_indices.dtype == torch.int32
    dec = page_table(builder.decode([(r, 2) for r in rows]), ps)
    assert dec.qo_indptr is None and dec.kv_last_page_len.tolist() == [2, 1, 3]


def test_hook_refuses_a_cpu_pool():
    from engine_attention_flashinfer.impl import engine_create_attention_backend

    pool = KVPool(num_layers=1, num_kv_heads=1, head_dim=64, num_slots=16, page_size=1,
                  dtype=torch.float32, device=torch.device("cpu"))
    with pytest.raises(PluginError, match="needs a CUDA GPU"):
        engine_create_attention_backend(pool=pool, model_config=None, config=ServerConfig())


def test_listing_says_why_it_is_unavailable_here():
    from engine.plugins.registry import Registry

    rec = Registry().find("flashinfer", "attention")[0]
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert not rec.available and "CUDA GPU" in rec.reason


@pytest.mark.gpu
def test_kit_on_cuda():
    pytest.importorskip("flashinfer")
    from engine.testing import attention as kit
    from engine_attention_flashinfer.impl import engine_create_attention_backend

    failures = kit.check("flashinfer", engine_create_attention_backend, device="cuda")
    assert failures == [], "\n".join(failures[:20])


def test_tree_verify_custom_mask_layout():
    """Per request a row-major [new, prefix + new] block: the prefix seen by all, then the
    tree's ancestors-and-self (the mask FlashInfer's plan takes)."""
    import torch

    from engine.runtime.batch import Batch, ForwardMode
    from engine_attention_flashinfer.impl import tree_custom_mask

    tree = torch.zeros(2, 3, 3, dtype=torch.bool)
    tree[0] = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    tree[1, 0, 0] = True
    t = torch.zeros(4, dtype=torch.long)
    batch = Batch(mode=ForwardMode.VERIFY, input_ids=t, positions=t, out_cache_loc=t,
                  req_pool_indices=t[:2], seq_lens=torch.tensor([5, 3]),
                  prefix_lens=torch.tensor([2, 2]), extend_lens=torch.tensor([3, 1]),
                  req_to_token=torch.zeros(2, 8, dtype=torch.long), seq_lens_cpu=[5, 3],
                  prefix_lens_cpu=[2, 2], extend_lens_cpu=[3, 1], tree_mask=tree)
    mask = tree_custom_mask(batch).int().tolist()
    assert mask == [1, 1, 1, 0, 0,
                    1, 1, 1, 1, 0,
                    1, 1, 1, 0, 1,
                    1, 1, 1]
