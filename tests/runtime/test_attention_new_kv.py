"""``AttentionBackend.forward`` hands an extend forward's new K/V to a backend that reads them
as rows (``reads_new_kv``), after writing them into the pool as always; decode forwards and
other backends get the pool alone."""

from __future__ import annotations

import torch

from engine.runtime.attention import AttentionBackend, AttentionLayerSpec, KVPool
from engine.testing.batches import BatchBuilder


class Recorder(AttentionBackend):
    def __init__(self, pool: KVPool, reads: bool) -> None:
        super().__init__(pool)
        self.reads = reads
        self.calls: list[tuple[str, object]] = []

    def reads_new_kv(self, batch):
        return self.reads

    def forward_extend(self, q, layer, batch, new_kv=None):
        self.calls.append(("extend", new_kv))
        return q

    def forward_decode(self, q, layer, batch):
        self.calls.append(("decode", None))
        return q


def _setup():
    pool = KVPool(num_layers=1, num_kv_heads=2, head_dim=8, num_slots=64, page_size=1,
                  dtype=torch.float32, device=torch.device("cpu"))
    builder = BatchBuilder(torch.zeros((2, 32), dtype=torch.int64), 64, 1)
    return pool, builder, AttentionLayerSpec(0, 4, 2, 8, 8 ** -0.5)


def test_an_extend_hands_its_new_kv_to_a_backend_that_reads_them():
    pool, builder, spec = _setup()
    backend = Recorder(pool, reads=True)
    row = builder.new_request()
    batch = builder.extend([(row, [1, 2, 3])])
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    backend.forward(q, k, v, spec, batch)
    (kind, new_kv), = backend.calls
    assert kind == "extend" and new_kv[0] is k and new_kv[1] is v
    assert torch.equal(pool.k[0][batch.out_cache_loc], k)  # written into the pool as always
    backend.forward(q[:1], k[:1], v[:1], spec, builder.decode([(row, 4)]))
    assert backend.calls[-1] == ("decode", None)


def test_other_backends_get_the_pool_alone():
    pool, builder, spec = _setup()
    backend = Recorder(pool, reads=False)
    batch = builder.extend([(builder.new_request(), [1, 2])])
    backend.forward(torch.randn(2, 4, 8), torch.randn(2, 2, 8), torch.randn(2, 2, 8), spec, batch)
    assert backend.calls == [("extend", None)]
