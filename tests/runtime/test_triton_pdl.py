"""Programmatic dependent launch: off on CPUs, under the interpreter and with ENGINE_PDL=0 (the
kernels then compile without the grid-dependency instructions); on a Hopper GPU a chain of the
decode step's kernels captured in a CUDA graph gives bit-identical results with and without
it, replay after replay (a kernel reading before its predecessor finished would not)."""

import functools

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.runtime import triton_pdl  # noqa: E402


def test_off_on_a_cpu_and_under_the_interpreter(monkeypatch):
    assert triton_pdl.launch_options(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not triton_pdl.pdl_enabled(torch.device("cuda", 0))


def test_engine_pdl_0_turns_it_off(monkeypatch):
    monkeypatch.setenv("ENGINE_PDL", "0")
    assert not triton_pdl.pdl_enabled(torch.device("cuda", 0))
    assert triton_pdl.launch_options(torch.device("cuda", 0)) == {"PDL": False}


def test_dense_rows_follow_the_launch_mode(monkeypatch):
    from engine.runtime import gemv_triton

    monkeypatch.setenv("ENGINE_PDL", "0")
    monkeypatch.delenv("ENGINE_GEMV_DENSE_ROWS", raising=False)
    assert gemv_triton.dense_rows(torch.device("cuda", 0)) == 0
    monkeypatch.setenv("ENGINE_GEMV_DENSE_ROWS", "3")
    assert gemv_triton.dense_rows(torch.device("cuda", 0)) == 3


def test_l2_prefetch_is_opt_in_and_needs_pdl(monkeypatch):
    monkeypatch.delenv("ENGINE_L2_PREFETCH", raising=False)
    assert not triton_pdl.l2_prefetch_enabled(torch.device("cuda", 0))
    monkeypatch.setenv("ENGINE_L2_PREFETCH", "1")
    assert not triton_pdl.l2_prefetch_enabled(torch.device("cpu"))
    monkeypatch.setenv("ENGINE_PDL", "0")
    assert not triton_pdl.l2_prefetch_enabled(torch.device("cuda", 0))
    triton_pdl.l2_prefetch([torch.zeros(1 << 20)])  # nothing launched on a CPU tensor


def _chain(x, res, norm_w, w_qkv, w_down):
    """add + RMSNorm -> matrix-vector product -> SiLU-and-mul -> product, as a layer runs them."""
    from engine.runtime import fused_triton, gemv_triton

    h, r = fused_triton.add_rms_norm(x, res, norm_w, 1e-6)
    triton_pdl.l2_prefetch([w_down])  # (with ENGINE_L2_PREFETCH=1 and PDL: a kernel here)
    y = gemv_triton.gemv(h, w_qkv)
    a = fused_triton.silu_and_mul(y)
    return gemv_triton.gemv(a, w_down), r


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="needs a CUDA device of compute capability 9 or more")
def test_graph_replays_equal_with_and_without_pdl(monkeypatch):
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(1, 4096, device=dev, generator=gen, dtype=torch.bfloat16)
    res = torch.randn(1, 4096, device=dev, generator=gen, dtype=torch.bfloat16)
    norm_w = torch.rand(4096, device=dev, generator=gen, dtype=torch.bfloat16)
    w_qkv = torch.randn(2 * 2816, 4096, device=dev, generator=gen, dtype=torch.bfloat16) / 64
    w_down = torch.randn(4096, 2816, device=dev, generator=gen, dtype=torch.bfloat16) / 64
    monkeypatch.setenv("ENGINE_L2_PREFETCH", "1")  # the prefetch kernel inside the chain
    outs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("ENGINE_PDL", flag)
        assert triton_pdl.pdl_enabled(dev) == (flag == "1")
        assert triton_pdl.l2_prefetch_enabled(dev) == (flag == "1")
        _chain(x, res, norm_w, w_qkv, w_down)  # build the kernels outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, r = x, res
            for _ in range(8):  # each layer reads the one before
                y, r = _chain(y, r, norm_w, w_qkv, w_down)
        replays = []
        for _ in range(5):
            graph.replay()
            replays.append((y.clone(), r.clone()))
        torch.cuda.synchronize()
        for y_i, r_i in replays[1:]:
            assert torch.equal(y_i, replays[0][0]) and torch.equal(r_i, replays[0][1])
        outs[flag] = replays[0]
    assert torch.equal(outs["1"][0], outs["0"][0]) and torch.equal(outs["1"][1], outs["0"][1])


def _rig(dev, seed: int, layers: int):
    """What both attention chains share: a bf16 pool of ``layers`` layers of random K/V (8
    query / 2 KV heads of 128, hidden 1024), three requests holding 40, 17 and 100 cached
    tokens, the qkv and o weights and a RoPE table."""
    import types

    from engine.runtime.attention import KVPool
    from engine.testing.batches import BatchBuilder

    gen = torch.Generator(device=dev).manual_seed(seed)
    hq, hkv, d, hidden = 8, 2, 128, 1024
    pool = KVPool(num_layers=layers, num_kv_heads=hkv, head_dim=d, num_slots=4096,
                  page_size=16, dtype=torch.bfloat16, device=dev)
    for buf in pool.k + pool.v:
        buf.copy_(torch.randn(buf.shape, device=dev, generator=gen, dtype=torch.bfloat16))
    builder = BatchBuilder(torch.zeros((4, 256), dtype=torch.int64, device=dev), 4096, 16,
                           shuffle=True)
    rows = [builder.new_request() for _ in range(3)]
    builder.extend([(r, [1] * n) for r, n in zip(rows, (40, 17, 100))])  # slots only
    w_qkv = torch.randn((hq + 2 * hkv) * d, hidden, device=dev, generator=gen,
                        dtype=torch.bfloat16) / 32
    w_o = torch.randn(hidden, hq * d, device=dev, generator=gen, dtype=torch.bfloat16) / 32
    pos = torch.arange(256, device=dev, dtype=torch.float32)[:, None]
    ang = pos * torch.arange(d, device=dev, dtype=torch.float32)[None, :] / d
    return types.SimpleNamespace(gen=gen, hq=hq, hkv=hkv, d=d, hidden=hidden, pool=pool,
                                 builder=builder, rows=rows, w_qkv=w_qkv, w_o=w_o,
                                 cos=ang.cos().contiguous(), sin=(-ang.sin()).contiguous())


def _attention_half(dev, layers: int = 4, fused_merge: bool = False):
    """The attention half of a decode step, ``layers`` times over one pool: the qkv product,
    q/k norm + RoPE storing K/V, the triton plugin's split decode and merge, the o product
    (the kernels that read the batch's inputs and the first key tile before their wait).
    Returns ``run``, which launches the chain on a decode batch of three requests of 40, 17
    and 100 cached tokens. ``fused_merge``: the decode merge inside the split
    kernel."""
    from engine_attention_triton.impl import KernelConfig, TritonBackend

    from engine.runtime import fused_triton, gemv_triton
    from engine.runtime.attention import AttentionLayerSpec

    rig = _rig(dev, 1, layers)
    hq, hkv, d, pool, gen = rig.hq, rig.hkv, rig.d, rig.pool, rig.gen
    batch = rig.builder.decode([(r, 2) for r in rig.rows])
    backend = TritonBackend(pool, hq // hkv, num_kv_splits=4,
                            kernel_config=KernelConfig(decode_fused_merge=fused_merge))
    backend.prepare(batch)
    qw = torch.rand(d, device=dev, generator=gen, dtype=torch.bfloat16)
    kw = torch.rand(d, device=dev, generator=gen, dtype=torch.bfloat16)
    x = torch.randn(3, rig.hidden, device=dev, generator=gen, dtype=torch.bfloat16)

    def run():
        h = x
        for i in range(layers):
            spec = AttentionLayerSpec(i, hq, hkv, d, d ** -0.5)
            qkv = gemv_triton.gemv(h, rig.w_qkv)
            q = fused_triton.qk_norm_rope_store(qkv, hq, hkv, d, batch.positions, rig.cos,
                                                rig.sin, qw, kw, 1e-6, pool.k[i], pool.v[i],
                                                batch.out_cache_loc)
            out = backend.forward_decode(q, spec, batch)
            h = gemv_triton.gemv(out.reshape(3, hq * d), rig.w_o)
        return h

    return run


def _attention_extend(dev, layers: int = 4):
    """The attention half of a prefill over cached prefixes, ``layers`` times over one pool:
    the qkv product (torch), q/k norm + RoPE storing the new K/V, the triton plugin's extend
    kernel (its tile table and the batch's lengths, rows and offsets read before its wait),
    the o product (torch). Three requests of 40, 17 and 100 cached tokens extend by 30, 70
    and 5."""
    from engine_attention_triton.impl import TritonBackend

    from engine.runtime import fused_triton
    from engine.runtime.attention import AttentionLayerSpec

    rig = _rig(dev, 3, layers)
    hq, hkv, d, pool = rig.hq, rig.hkv, rig.d, rig.pool
    batch = rig.builder.extend([(r, [1] * n) for r, n in zip(rig.rows, (30, 70, 5))])
    backend = TritonBackend(pool, hq // hkv)
    backend.prepare(batch)
    t = batch.num_tokens
    x = torch.randn(t, rig.hidden, device=dev, generator=rig.gen, dtype=torch.bfloat16)

    def run():
        h = x
        for i in range(layers):
            spec = AttentionLayerSpec(i, hq, hkv, d, d ** -0.5)
            qkv = torch.nn.functional.linear(h, rig.w_qkv)
            q = fused_triton.qk_norm_rope_store(qkv, hq, hkv, d, batch.positions, rig.cos,
                                                rig.sin, None, None, 1e-6, pool.k[i],
                                                pool.v[i], batch.out_cache_loc)
            out = backend.forward_extend(q, spec, batch)
            h = torch.nn.functional.linear(out.reshape(t, hq * d), rig.w_o)
        return h

    return run


def _moe_one_token(dev, layers: int = 4):
    """A Qwen3-MoE-shaped expert layer for one token, ``layers`` times: the router product,
    the fused softmax/top-k, the triton runner's pair products and combine (the down
    projection reads its experts before its wait)."""
    from engine_moe_triton.impl import TritonRunner

    from engine.models.moe import ExpertWeights, route
    from engine.runtime.linear import dense_linear

    gen = torch.Generator(device=dev).manual_seed(2)
    e, hidden, inter = 32, 1024, 256
    experts = ExpertWeights(e, hidden, inter, torch.bfloat16).to(dev)
    experts.w13.data.copy_(torch.randn(experts.w13.shape, device=dev, generator=gen,
                                       dtype=torch.bfloat16) / 32)
    experts.w2.data.copy_(torch.randn(experts.w2.shape, device=dev, generator=gen,
                                      dtype=torch.bfloat16) / 16)
    router = torch.randn(e, hidden, device=dev, generator=gen, dtype=torch.bfloat16) / 32
    runner = TritonRunner(None)
    x = torch.randn(1, hidden, device=dev, generator=gen, dtype=torch.bfloat16)

    def run():
        h = x
        for _ in range(layers):
            weights, ids = route(dense_linear(h, router), 8, True)
            h = h + runner.apply(experts, h, ids, weights)
        return h

    return run


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="needs a CUDA device of compute capability 9 or more")
@pytest.mark.parametrize("chain", [_attention_half, _moe_one_token,
                                   functools.partial(_attention_half, fused_merge=True),
                                   _attention_extend])
def test_early_reads_give_the_same_replays_with_and_without_pdl(monkeypatch, chain):
    """The kernels that read the batch's inputs (lengths, rows, positions, cache rows) or an
    earlier kernel's expert ids before their wait, and ask weights or key tiles into L2:
    captured in one graph, bit-identical with and without PDL, replay after replay."""
    pytest.importorskip("engine_attention_triton")
    pytest.importorskip("engine_moe_triton")
    dev = torch.device("cuda")
    monkeypatch.setenv("ENGINE_GEMV_DENSE_ROWS", "4")  # the Triton products in both modes
    outs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("ENGINE_PDL", flag)
        run = chain(dev)
        run()  # build the kernels outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = run()
        replays = []
        for _ in range(5):
            graph.replay()
            replays.append(y.clone())
        torch.cuda.synchronize()
        assert all(torch.equal(r, replays[0]) for r in replays[1:])
        assert torch.isfinite(replays[0]).all()
        outs[flag] = replays[0]
    assert torch.equal(outs["1"], outs["0"])
