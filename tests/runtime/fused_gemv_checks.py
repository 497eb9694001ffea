"""The matrix-vector kernels that make their input in their own loads (residual add + RMSNorm,
SiLU-and-mul: engine.runtime.gemv_triton.gemv_norm / gemv_silu) against the separate kernels,
the chained one-row products (gemv_chain, the normed row it writes for a sparse layer's
experts), and a tiny Llama and a tiny dense-then-sparse Qwen2-MoE decoding with them
(ENGINE_FUSED_GEMV=1; ENGINE_GEMV_CHAIN 1, the default, against 0) against the same model
without: run
under TRITON_INTERPRET=1 on a CPU, or on a GPU. Prints one JSON list of failures."""

import contextlib
import json
import os
import sys
import tempfile

import torch

from engine.runtime import fused_triton, gemv_triton

device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
failures: list[str] = []
g = torch.Generator().manual_seed(0)


def kernels(dtype: torch.dtype) -> None:
    for m, k, n in ((1, 96, 80), (3, 200, 64), (4, 2048, 48)):
        w = (torch.randn(n, k, generator=g) / 8).to(device, dtype)
        gu = torch.randn(m, 2 * k, generator=g).to(device, dtype)
        want = gemv_triton.gemv(fused_triton.silu_and_mul(gu), w)
        if not torch.equal(gemv_triton.gemv_silu(gu, w), want):
            failures.append(f"gemv_silu {dtype} {m}x{k}")
        x = torch.randn(m, k, generator=g).to(device, dtype)
        r = torch.randn(m, k, generator=g).to(device, dtype)
        nw = (torch.rand(k, generator=g) + 0.5).to(device, dtype)
        for res in (r, None):
            h, res_out = fused_triton.add_rms_norm(x, res, nw, 1e-6)
            got, got_res = gemv_triton.gemv_norm(x, res, nw, 1e-6, w)
            want = gemv_triton.gemv(h, w)
            # the norm's sum of squares may be added in another order: one unit of the
            # normalised input at most, which the product averages out
            err = (got.float() - want.float()).abs().max().item()
            if not torch.equal(got_res, res_out) or err > 2e-2 * want.float().abs().max():
                failures.append(f"gemv_norm {dtype} {m}x{k} residual={res is not None}: "
                                f"{err:.3g}")


def chained(dtype: torch.dtype) -> None:
    """gemv_chain's three forms against the separate kernels: the residual add with its sums
    of squares, the norm made from them, SiLU-and-mul of the gate/up halves."""
    for k, n in ((96, 80), (2048, 48), (200, 4096)):
        w = (torch.randn(n, k, generator=g) / 8).to(device, dtype)
        x = torch.randn(1, k, generator=g).to(device, dtype)
        r = torch.randn(1, n, generator=g).to(device, dtype)
        bias = torch.randn(n, generator=g).to(device, dtype)
        for b in (None, bias):
            y = gemv_triton.gemv_early(x, w, b)[0]  # (the same sums: one slice of K)
            h, ss = gemv_triton.gemv_chain(x, w, b, residual=r)
            want = (y.float() + r.float()).to(dtype)
            if not torch.equal(h, want):
                failures.append(f"gemv_chain residual {dtype} {k}x{n} bias={b is not None}")
            total = (want.float() ** 2).sum()
            if abs(ss.sum().item() - total.item()) > 1e-4 * total.item():
                failures.append(f"gemv_chain sums of squares {dtype} {k}x{n}")
            if n % 2 == 0:
                act = gemv_triton.gemv_chain(x, w, b, glu=True)[0]
                if not torch.equal(act, fused_triton.silu_and_mul(y)):
                    failures.append(f"gemv_chain silu {dtype} {k}x{n} bias={b is not None}")
        # the norm of a row from the sums of squares its writer left
        nw = (torch.rand(n, generator=g) + 0.5).to(device, dtype)
        w2 = (torch.randn(64, n, generator=g) / 8).to(device, dtype)
        h, ss = gemv_triton.gemv_chain(x, w, residual=r)
        got = gemv_triton.gemv_chain(h, w2, sumsq=ss, norm_w=nw, eps=1e-6)[0]
        want = gemv_triton.gemv(fused_triton.add_rms_norm(h, None, nw, 1e-6)[0], w2)
        err = (got.float() - want.float()).abs().max().item()
        if err > 2e-2 * want.float().abs().max():  # (the sum in another order)
            failures.append(f"gemv_chain norm {dtype} {k}x{n}: {err:.3g}")


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
         "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}
#: a dense first layer, then two sparse ones with a shared expert (its sigmoid gate) and q/k/v
#: biases: the chained sparse layer after a chained dense one and after a sparse one
QWEN2_MOE = {**LLAMA, "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
             "num_hidden_layers": 3, "moe_intermediate_size": 32, "num_experts": 4,
             "num_experts_per_tok": 2, "norm_topk_prob": False,
             "shared_expert_intermediate_size": 48, "mlp_only_layers": [0],
             "decoder_sparse_step": 1}

#: two sparse layers, no shared expert (q/k norms, renormalised top-2): the runner adds the
#: residual in its combine, and the second layer's q/k/v projection norms from its sums
QWEN3_MOE = {**LLAMA, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
             "head_dim": 16, "moe_intermediate_size": 32, "num_experts": 4,
             "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1}


def model(dtype: torch.dtype, flag_name: str, config: dict = LLAMA,
          chained_calls: int = 2 * 7, moe_runner: str = "auto") -> None:
    """Greedy decode steps of a tiny dummy model (``config``): logits with the fused kernels
    (``flag_name`` set to 1) close to those without; with the chained layers, ``gemv_chain``
    called ``chained_calls`` times over the two decode steps."""
    from engine.config import ServerConfig
    from engine.runtime.model_runner import ModelRunner
    from engine.testing.batches import BatchBuilder

    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, "config.json"), "w") as fh:
        json.dump(config, fh)
    logits = {}
    calls = []
    chain = gemv_triton.gemv_chain
    gemv_triton.gemv_chain = lambda *a, **kw: calls.append(1) or chain(*a, **kw)
    for flag in ("0", "1"):
        os.environ[flag_name] = flag
        if flag_name != "ENGINE_GEMV_CHAIN":  # (the chained layer, the default, off)
            os.environ["ENGINE_GEMV_CHAIN"] = "0"
        cfg = ServerConfig(model_path=tmp, load_format="dummy", dtype=str(dtype).split(".")[1],
                           skip_tokenizer_init=True, attention_backend="torch_native",
                           max_total_tokens=512, max_running_requests=2, context_length=128,
                           random_seed=0, disable_cuda_graph=True,
                           moe_runner_backend=moe_runner)
        runner = ModelRunner(cfg)
        bb = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
        row = bb.new_request()
        out = runner.forward(bb.extend([(row, [5, 9, 17, 3])]))
        steps = [out]
        for _ in range(2):
            out = runner.forward(bb.decode([(row, int(out[-1].argmax()))]))
            steps.append(out)
        logits[flag] = torch.cat(steps).float()
    os.environ.pop(flag_name)
    os.environ.pop("ENGINE_GEMV_CHAIN", None)
    gemv_triton.gemv_chain = chain
    name = config["architectures"][0]
    if (len(calls) != chained_calls) if flag_name == "ENGINE_GEMV_CHAIN" else calls:
        failures.append(f"tiny {name} {dtype} {flag_name}: {len(calls)} chained products")
    err = (logits["1"] - logits["0"]).abs().max().item()
    if err > 2e-2 * logits["0"].abs().max().item():
        failures.append(f"tiny {name} {dtype} {flag_name}: logits differ by {err:.3g}")


def normed_row(dtype: torch.dtype) -> None:
    """gemv_chain's normed input row (a sparse layer's router): the row add_rms_norm writes,
    and the product of it."""
    for k, n in ((64, 4), (2048, 128)):
        w = (torch.randn(n, k, generator=g) / 8).to(device, dtype)
        x = torch.randn(1, k, generator=g).to(device, dtype)
        nw = (torch.rand(k, generator=g) + 0.5).to(device, dtype)
        ss = (x.float() ** 2).sum().reshape(1)
        out = torch.empty_like(x)
        y = gemv_triton.gemv_chain(x, w, sumsq=ss, norm_w=nw, eps=1e-6, normed_out=out)[0]
        want = fused_triton.add_rms_norm(x, None, nw, 1e-6)[0]
        err = (out.float() - want.float()).abs().max().item()
        # (the sum of squares in another order: one unit of the normed row at most)
        if err > 1e-2 * want.float().abs().max().item():
            failures.append(f"gemv_chain normed row {dtype} {k}x{n}: {err:.3g}")
        if not torch.equal(y, gemv_triton.gemv_early(out, w)[0]):
            failures.append(f"gemv_chain normed row's product {dtype} {k}x{n}")


RESIDUAL_RUNNER = "triton" if device == "cuda" else "torch"


@contextlib.contextmanager
def residual_runner():
    """On a CPU, the torch runner's ``apply_residual`` as ``MoERunner``'s contract states it
    (the triton runner's own is checked by the runner kit); on a GPU, nothing changes."""
    if device == "cuda":
        yield
        return
    from engine_moe_torch.impl import TorchRunner

    def apply_residual(self, experts, hidden, ids, weights, residual):
        total = (self.apply(experts, hidden, ids, weights).float() + residual.float())
        total = total.to(hidden.dtype)
        return total, (total.float() ** 2).sum(dim=1, keepdim=True)

    TorchRunner.apply_residual = apply_residual
    try:
        yield
    finally:
        del TorchRunner.apply_residual


def token_down(dtype: torch.dtype) -> None:
    """The tiny Qwen3-MoE chained and not, its one-token experts through ``token_moe``."""
    from engine_moe_triton import kernels as moe_kernels

    token_moe, calls = moe_kernels.token_moe, []
    moe_kernels.token_moe = lambda *a, **kw: calls.append(1) or token_moe(*a, **kw)
    os.environ["ENGINE_MOE_TOKEN_DOWN"] = "4,16,4"
    try:
        model(dtype, "ENGINE_GEMV_CHAIN", QWEN3_MOE, 2 * 5, moe_runner="triton")
    finally:
        os.environ.pop("ENGINE_MOE_TOKEN_DOWN")
        moe_kernels.token_moe = token_moe
    if len(calls) != 2 * 2 * 2:  # (two decode steps of two sparse layers, chained or not)
        failures.append(f"token_down {dtype}: {len(calls)} one-token launches")


os.environ.setdefault("ENGINE_GEMV_DENSE_ROWS", "4")  # (on a CPU the interpreter serves them)
# the interpreter truncates float32 -> bfloat16 where a GPU rounds: float16 on a CPU
for dt in ((torch.bfloat16, torch.float16) if device == "cuda" else (torch.float16,)):
    kernels(dt)
    chained(dt)
    normed_row(dt)
    for flag_name in ("ENGINE_FUSED_GEMV", "ENGINE_GEMV_CHAIN"):
        model(dt, flag_name)
    # per decode step: the dense first layer 3 (o, gate/up, down), each sparse layer its o and
    # router, the second also its q/k/v (from the dense layer's sums of squares)
    model(dt, "ENGINE_GEMV_CHAIN", QWEN2_MOE, 2 * 8)
    # no shared expert, a runner that adds the residual itself (the triton runner's combine;
    # on a CPU, where that runner is not offered, the torch runner given the same capability
    # by torch ops): the second layer's q/k/v chains too (2 + 3 products a step); without
    # that, 2 + 2
    with residual_runner():
        model(dt, "ENGINE_GEMV_CHAIN", QWEN3_MOE, 2 * 5, moe_runner=RESIDUAL_RUNNER)
        os.environ["ENGINE_SPARSE_RESIDUAL"] = "0"
        model(dt, "ENGINE_GEMV_CHAIN", QWEN3_MOE, 2 * 4, moe_runner=RESIDUAL_RUNNER)
        os.environ.pop("ENGINE_SPARSE_RESIDUAL")
    # the triton runner's one-token launch through all pairs with their combine (token_down):
    # its output and the sums of squares of its pieces, which the next q/k/v norms from,
    # against the same runner's output added and normed by the separate kernels (a GPU: the
    # runner is not offered on a CPU)
    if device == "cuda":
        token_down(dt)
    # with ENGINE_SPARSE_CHAIN=0 only the dense layer chains: its 3 products a step
    os.environ["ENGINE_SPARSE_CHAIN"] = "0"
    model(dt, "ENGINE_GEMV_CHAIN", QWEN2_MOE, 2 * 3)
    os.environ.pop("ENGINE_SPARSE_CHAIN")
print(json.dumps(failures))
