"""Breakable prefill graphs on a GPU (skipped without CUDA): a small Llama with dummy weights
behind the triton backend gives the same logits from the captured graphs as from the eager
forward, for ragged batches with cached prefixes, sizes on and between buckets, in float32
at page 16 (tight) and bfloat16 at page 64 (the fused norm/RoPE kernel storing K/V inside the
graph; the extend kernel reading the pool through tensor descriptors); a forward past
the largest bucket runs eagerly; padding writes only the reserved slot 0."""

from __future__ import annotations

import json

import pytest
import torch

from engine.config import ServerConfig
from engine.runtime.model_runner import ModelRunner
from engine.testing.batches import BatchBuilder
from test_sched_overlap_cuda import CONFIG as TINY_LLAMA

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# the overlap test's tiny Llama, one layer deeper and with longer positions
CONFIG = {**TINY_LLAMA, "num_hidden_layers": 3, "max_position_embeddings": 2048}


@pytest.fixture(scope="module", params=[("float32", 16), ("bfloat16", 64)],
                ids=["float32-page16", "bfloat16-page64"])
def runner(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> ModelRunner:
    path = tmp_path_factory.mktemp("tiny-llama")
    (path / "config.json").write_text(json.dumps(CONFIG))
    torch.manual_seed(0)
    return ModelRunner(ServerConfig(model_path=str(path), load_format="dummy", device="cuda",
                                    dtype=request.param[0], skip_tokenizer_init=True,
                                    attention_backend="triton", page_size=request.param[1],
                                    context_length=1024, max_running_requests=8,
                                    max_total_tokens=20000, cuda_graph_max_bs_prefill=200))


def test_replayed_prefill_gives_the_eager_logits(runner: ModelRunner) -> None:
    graphs = runner.prefill_graphs
    assert graphs is not None and graphs.captured and graphs.buckets[-1] == 208
    tol = 1e-4 if runner.dtype == torch.float32 else 3e-2
    builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    rows = [builder.new_request() for _ in range(4)]
    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 500, (n,), generator=gen).tolist()

    replays = []
    run = graphs.run
    graphs.run = lambda b, s: replays.append(s) or run(b, s)
    try:
        runner.forward(builder.extend([(rows[0], ids(70)), (rows[1], ids(33))]))
        cases = [[(rows[0], ids(17)), (rows[1], ids(1)), (rows[2], ids(45))],  # 63 -> 64
                 [(rows[3], ids(64))], [(rows[0], ids(3))],                      # 64, 3 -> 16
                 [(rows[1], ids(150)), (rows[3], ids(50))],                      # 200 -> 208
                 [(rows[2], ids(230))]]                                         # eager
        for items in cases:
            batch = builder.extend(items)
            k0 = runner.pool.k[1].clone()
            eager = runner._forward(batch)
            written = set(batch.out_cache_loc.tolist())
            got = runner.forward(batch)
            torch.testing.assert_close(got, eager, atol=tol, rtol=tol)
            changed = (runner.pool.k[1] != k0).flatten(1).any(1).nonzero().flatten().tolist()
            assert set(changed) <= written | {0}
        assert replays == [112, 64, 64, 16, 208]  # (the prefixes' 103 tokens first)
    finally:
        graphs.run = run
        for row in rows:
            builder.free(row)
        runner.req_to_token.zero_()
