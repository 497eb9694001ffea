"""One rank of the two-process expert-parallel check (run by test_moe_runners.py).

Both ranks build the same experts (seeded) and load only their half through
``ExpertWeights.load``; each routes its own tokens; the reference all-to-all moves pairs to the
owners, the torch runner computes there, and the combined output must equal the single-process
reference on all experts. Prints "ok <rank>" or raises.
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "moe", "torch"))

from engine.api.moe import ExpertWeights, route, torch_reference  # noqa: E402
from engine.testing.moe import TorchDistAllToAll  # noqa: E402
from engine_moe_torch.impl import TorchRunner  # noqa: E402


def main(rank: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    E, H, I, K = 8, 32, 16, 3
    g = torch.Generator().manual_seed(0)
    w13, w2 = torch.randn(E, 2 * I, H, generator=g), torch.randn(E, H, I, generator=g)
    router = torch.randn(E, H, generator=g)
    tokens = [torch.randn(5, H, generator=g), torch.randn(7, H, generator=g)]
    x = tokens[rank]
    weights, ids = route(x @ router.t(), K, True)
    a2a = TorchDistAllToAll(E)
    local = a2a.local_experts(E)
    experts = ExpertWeights(len(local), H, I, torch.float32, first_expert=local.start,
                            model_num_experts=E, name="ep")
    for e in range(E):  # per-expert checkpoint tensors: the other rank's are skipped
        experts.load("w13", w13[e, :I], e, 0)
        experts.load("w13", w13[e, I:], e, 1)
        experts.load("w2", w2[e], e, 0)
    runner = TorchRunner()
    h, lid, lw, handle = a2a.dispatch(x, ids, weights)
    out = a2a.combine(runner.apply(experts, h, lid, lw), handle)
    ref = torch_reference(w13, w2, x, ids, weights)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    dist.destroy_process_group()
    print("ok", rank, flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
