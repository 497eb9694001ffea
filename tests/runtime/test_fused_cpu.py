"""The CPU fused kernels against float32/float64 torch references on random inputs: ragged
batches, GQA, pages scattered through the pool, rows above the threading threshold."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.runtime import fused_cpu

pytestmark = pytest.mark.skipif(not fused_cpu.available(), reason="needs a C compiler, AVX2/FMA")


def rope_caches(max_pos: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(max_pos).float(), inv)
    emb = torch.cat((freqs, freqs), -1)
    sin = emb.sin()
    sin[:, : d // 2].neg_()
    return emb.cos(), sin


@pytest.mark.parametrize("rows", [1, 3, 40])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm(rows, with_residual):
    n = 576
    x, res, w = torch.randn(rows, n), torch.randn(rows, n), torch.randn(n)
    total = x.double() + res.double() if with_residual else x.double()
    want = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    before = res.clone()
    got, new_res = fused_cpu.add_rms_norm(x, res if with_residual else None, w, 1e-5)
    assert torch.equal(res, before)  # inputs untouched
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-5)
    assert torch.allclose(new_res.double(), total, atol=1e-6, rtol=0)


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_qk_norm_rope_in_place(norm, rows):
    hq, hk, d = 9, 3, 64
    cos, sin = rope_caches(256, d)
    qkv = torch.randn(rows, (hq + 2 * hk) * d)
    pos = torch.randint(0, 256, (rows,))
    qw, kw = (torch.randn(d), torch.randn(d)) if norm else (None, None)
    ref = qkv.clone()
    q, k = fused_cpu.qk_norm_rope(qkv, hq, hk, d, pos, cos, sin, qw, kw, 1e-6)

    def rot(x, weight):
        if weight is not None:
            x = F.rms_norm(x, (d,), weight, 1e-6)
        c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
        swapped = x.reshape(*x.shape[:-1], 2, d // 2).flip(-2).reshape(x.shape)
        return x * c + swapped * s

    want_q = rot(ref[:, : hq * d].view(rows, hq, d), qw)
    want_k = rot(ref[:, hq * d:(hq + hk) * d].view(rows, hk, d), kw)
    assert torch.allclose(q, want_q, atol=1e-5, rtol=1e-5)
    assert torch.allclose(k, want_k, atol=1e-5, rtol=1e-5)
    assert q.data_ptr() == qkv.data_ptr()  # views of the projection, rotated in place
    assert torch.equal(qkv[:, (hq + hk) * d:], ref[:, (hq + hk) * d:])  # v untouched


@pytest.mark.parametrize("rows", [1, 20])
def test_silu_and_mul(rows):
    inter = 1540  # not a multiple of 8: the tail runs too
    x = torch.randn(rows, 2 * inter) * 8
    x[0, :4] = torch.tensor([-100.0, -30.0, 0.0, 90.0])
    gate, up = x.double().split(inter, -1)
    want = F.silu(gate) * up
    got = fused_cpu.silu_and_mul(x)
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16,
                                   torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("hq,hk,d", [(9, 3, 64), (4, 4, 20), (8, 1, 64), (6, 2, 128)])
def test_decode_attention_reads_scattered_pages(hq, hk, d, dtype):
    """Against a float64 reference over the values the pool holds (16-bit and fp8 pools are
    widened as they are read, fp8 times the layer's K and V scales: only float32 summation
    order differs); head sizes with and without a vector tail, one and two register chunks of
    the output. The fp8 pools hold every code of the format's range, subnormals included."""
    slots, page = 400, 4
    fp8 = dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    k_pool, v_pool = torch.randn(slots, hk, d).to(dtype), torch.randn(slots, hk, d).to(dtype)
    k_scale, v_scale = (0.37, 1.9) if fp8 else (1.0, 1.0)
    if fp8:  # finite codes only, from the smallest subnormal up (magnitudes kept near 1)
        codes = torch.randint(0, 256, (2, slots, hk, d), dtype=torch.uint8)
        codes = torch.where(codes.view(dtype).float().isfinite(), codes, 0)
        k_pool, v_pool = codes[0].view(dtype), codes[1].view(dtype)
        if dtype == torch.float8_e5m2:  # (e5m2 reaches 57344: keep the scores finite)
            k_pool = (k_pool.float().clamp(-64, 64)).to(dtype)
    lens = [1, 7, 33, 130]  # ragged, crossing page boundaries
    req_to_token = torch.zeros(6, 160, dtype=torch.int64)
    pages = torch.randperm(slots // page - 1) + 1  # page 0 holds the padding slot
    used = 0
    rows = torch.tensor([4, 0, 2, 5])
    for r, n in zip(rows.tolist(), lens):
        need = -(-n // page)
        slot_ids = (pages[used:used + need, None] * page + torch.arange(page)).reshape(-1)[:n]
        req_to_token[r, :n] = slot_ids
        used += need
    q = torch.randn(len(lens), hq, d)
    scale = d ** -0.5
    if fp8:
        q = q / 64  # (scores of moderate size over keys up to 448)
    got = fused_cpu.decode_attention(q, k_pool, v_pool, req_to_token, rows,
                                     torch.tensor(lens), max(lens), scale, k_scale, v_scale)
    for b, (r, n) in enumerate(zip(rows.tolist(), lens)):
        ids = req_to_token[r, :n]
        k = k_pool[ids].double().repeat_interleave(hq // hk, 1) * k_scale  # [n, hq, d]
        v = v_pool[ids].double().repeat_interleave(hq // hk, 1) * v_scale
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b].double(), k) * scale, -1)
        want = torch.einsum("hn,nhd->hd", p, v)
        tol = 1e-5 * (v.abs().max().item() if fp8 else 1.0)
        assert torch.allclose(got[b].double(), want, atol=tol, rtol=1e-5), b


@pytest.mark.parametrize("hq,hk", [(9, 3), (8, 1), (12, 2)])
def test_decode_attention_is_batch_invariant(hq, hk):
    """A few KV heads (one request's decode) are shared out by query head, a KV head's group
    possibly split between threads; many go whole, one (request, KV head) at a time. Either
    way each head's arithmetic is the same, so a request's output is bit-identical alone and
    in a batch of other lengths."""
    d, slots, batch = 64, 4096, 10
    gen = torch.Generator().manual_seed(3)
    k_pool = torch.randn(slots, hk, d, generator=gen).half()
    v_pool = torch.randn(slots, hk, d, generator=gen).half()
    req_to_token = torch.randperm(slots - 1, generator=gen)[:batch * 400].reshape(batch, 400) + 1
    q = torch.randn(batch, hq, d, generator=gen)
    lens = torch.randint(1, 401, (batch,), generator=gen)
    lens[0] = 400

    def run(idx):
        idx = torch.tensor(idx)
        return fused_cpu.decode_attention(q[idx], k_pool, v_pool, req_to_token, idx, lens[idx],
                                          int(lens[idx].max()), d ** -0.5)

    batched = run(list(range(batch)))
    for b in range(batch):
        assert torch.equal(run([b])[0], batched[b]), b
    assert torch.equal(run([3, 0])[1], batched[0])


@pytest.mark.parametrize("hq,hk,d", [(9, 3, 64), (8, 2, 128)])
def test_decode_attention_unpacks_fp4_rows_exactly(hq, hk, d):
    """fp4_mx_block16 pools against a float64 reference over their unpacked values
    (:func:`engine.runtime.kv_fp4.unpack`, exact), ragged lengths over scattered slots."""
    from engine.runtime import kv_fp4

    slots = 300
    gen = torch.Generator().manual_seed(d)
    k_vals = torch.randn(slots, hk, d, generator=gen) * torch.logspace(-3, 3, slots)[:, None, None]
    v_vals = torch.randn(slots, hk, d, generator=gen)
    k_pool, v_pool = kv_fp4.pack(k_vals), kv_fp4.pack(v_vals)
    lens = [1, 9, 40, 200]
    req_to_token = torch.zeros(4, 256, dtype=torch.int64)
    perm = torch.randperm(slots - 1, generator=gen) + 1
    used = 0
    for r, n in enumerate(lens):
        req_to_token[r, :n] = perm[used:used + n]
        used += n
    q = torch.randn(len(lens), hq, d, generator=gen) / 8
    rows = torch.arange(len(lens))
    got = fused_cpu.decode_attention_fp4(q, k_pool, v_pool, req_to_token, rows,
                                         torch.tensor(lens), max(lens), d ** -0.5, d)
    k_all = kv_fp4.unpack(k_pool, d, torch.float64)
    v_all = kv_fp4.unpack(v_pool, d, torch.float64)
    for b, n in enumerate(lens):
        ids = req_to_token[b, :n]
        k = k_all[ids].repeat_interleave(hq // hk, 1)
        v = v_all[ids].repeat_interleave(hq // hk, 1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b].double(), k) * d ** -0.5, -1)
        want = torch.einsum("hn,nhd->hd", p, v)
        assert torch.allclose(got[b].double(), want, atol=1e-5, rtol=1e-5), b


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("group,static", [(None, False), (64, False), (48, False), (None, True)])
def test_fp8_fake_quant_is_bit_identical_to_the_torch_ops(dtype, group, static):
    """Per token, per group of columns (a ragged last group) or one static scale; values from
    1e-6 to 1e3 (subnormal and saturating fp8 codes), zeros of both signs."""
    from engine.runtime import quant_formats as qf

    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 200, generator=g) * torch.logspace(-6, 3, 200)[torch.randperm(200,
                                                                               generator=g)]
    x[0, :4] = torch.tensor([0.0, -0.0, 1e-30, 1e4])
    scale = torch.tensor([[0.02]]) if static else None
    want = qf.fake_quant_fp8(x, dtype, scale=scale, group=group)
    got = fused_cpu.fake_quant_fp8(x, dtype, scale=scale, group=group)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("n,k", [(7, 33), (576, 576), (1536, 576), (301, 1000)])
@pytest.mark.parametrize("rows", [1, 2, 5, 12])
def test_gemv_streams_the_weights_and_each_row_is_alone(n, k, rows, monkeypatch):
    """The few-row dense product against float64, with a bias and a strided input (a view of
    a wider tensor); a row's result is bit-identical alone and in the batch (the four-rows-at-a-
    time path of several rows adds in the same order as one row's); beyond GEMV_ROWS rows, or
    for other dtypes, it does not apply."""
    monkeypatch.setattr(fused_cpu, "GEMV_MIN_FLOATS", 1)  # the tiny shape too
    w, b = torch.randn(n, k), torch.randn(n)
    wide = torch.randn(rows, k + 5)
    x = wide[:, 2:2 + k]  # row stride k + 5
    assert fused_cpu.gemv_applies(x, w)
    got = fused_cpu.gemv(x, w, b)
    want = x.double() @ w.double().T + b.double()
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert torch.allclose(got.double(), want, atol=1e-4, rtol=1e-5)
    for i in range(rows):
        assert torch.equal(fused_cpu.gemv(x[i:i + 1].clone(), w, b), got[i:i + 1])
    assert torch.equal(fused_cpu.gemv(x[None], w, None)[0], fused_cpu.gemv(x, w, None))
    assert not fused_cpu.gemv_applies(torch.randn(fused_cpu.GEMV_ROWS + 1, k), w)
    assert not fused_cpu.gemv_applies(x.double(), w.double())
    assert not fused_cpu.gemv_applies(x, w.T)  # not contiguous


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("group", [None, 64])
def test_fp8_linear_is_the_fake_quant_then_the_gemv(static, group):
    w, b = torch.randn(600, 256), torch.randn(600)
    x = torch.randn(3, 256) * 4
    scale = torch.tensor([[0.05]]) if static else None
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        got = fused_cpu.fp8_linear(x, w, b, dtype, scale, group)
        fq = fused_cpu.fake_quant_fp8(x, dtype, scale=scale, group=group)
        assert torch.equal(got, fused_cpu.gemv(fq, w, b))
    assert fused_cpu.fp8_linear(torch.randn(40, 256), w, b, torch.float8_e4m3fn) is None


@pytest.mark.parametrize("counts", [[2, 0, 3, 1, 0, 0, 5, 1], [0, 0, 0, 1, 0, 0, 0, 0],
                                    [1] * 8])
def test_moe_experts_in_one_call(counts):
    """Rows sorted by expert: each run goes through its expert's gate/up, SiLU-and-mul and down,
    against float64; experts without rows are never read (NaN weights there change nothing);
    a row's result does not depend on the other rows of its run."""
    e, h, inter = len(counts), 72, 40
    w13, w2 = torch.randn(e, 2 * inter, h) * 0.2, torch.randn(e, h, inter) * 0.2
    c = torch.tensor(counts)
    w13[c == 0] = float("nan")
    w2[c == 0] = float("nan")
    x = torch.randn(int(c.sum()), h)
    got = fused_cpu.moe_experts(x, c, w13, w2)
    want, start = [], 0
    for i, n in enumerate(counts):
        gu = x[start:start + n].double() @ w13[i].double().T
        want.append((torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]) @ w2[i].double().T)
        start += n
    assert torch.allclose(got.double(), torch.cat(want), atol=1e-4, rtol=1e-4)
    first = int(torch.nonzero(c)[0])
    alone = torch.zeros_like(c)
    alone[first] = 1
    assert torch.equal(fused_cpu.moe_experts(x[:1], alone, w13, w2), got[:1])
    assert fused_cpu.moe_experts(x.double(), c, w13.double(), w2.double()) is None


def test_moe_experts_round_the_down_inputs_between_two_calls():
    """An activation format's rounding of the down projection's inputs runs between the two
    halves: the result is the down projection of the rounded intermediate."""
    counts = torch.tensor([2, 0, 1, 3])
    e, h, inter = 4, 64, 32
    w13, w2 = torch.randn(e, 2 * inter, h) * 0.2, torch.randn(e, h, inter) * 0.2
    x = torch.randn(int(counts.sum()), h)
    seen = []

    def round_mid(mid):
        seen.append(mid.clone())
        return torch.round(mid * 4) / 4
    got = fused_cpu.moe_experts(x, counts, w13, w2, round_mid)
    want, start = [], 0
    for i, n in enumerate(counts.tolist()):
        gu = x[start:start + n].double() @ w13[i].double().T
        mid = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        assert torch.allclose(seen[0][start:start + n].double(), mid, atol=1e-4)
        want.append(torch.round(seen[0][start:start + n] * 4).double() / 4 @ w2[i].double().T)
        start += n
    assert torch.allclose(got.double(), torch.cat(want), atol=1e-4, rtol=1e-4)


def test_moe_routed_is_the_weighted_sum_of_the_chosen_experts():
    """From the router's choice: every (token, slot) pair through its expert, weighted, the
    slots added; an id outside the rank's experts (-1) adds nothing; a token's output does not
    depend on the other tokens."""
    e, h, inter, t, k = 16, 64, 40, 5, 4
    w13, w2 = torch.randn(e, 2 * inter, h) * 0.2, torch.randn(e, h, inter) * 0.2
    x = torch.randn(t, h)
    ids = torch.stack([torch.randperm(e)[:k] for _ in range(t)])
    ids[1, 2] = -1
    w = torch.rand(t, k)
    got = fused_cpu.moe_routed(x, ids, w, w13, w2)
    want = torch.zeros(t, h, dtype=torch.float64)
    for i in range(t):
        for j in range(k):
            if ids[i, j] < 0:
                continue
            gu = x[i].double() @ w13[ids[i, j]].double().T
            mid = torch.nn.functional.silu(gu[:inter]) * gu[inter:]
            want[i] += w[i, j].double() * (mid @ w2[ids[i, j]].double().T)
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-5)
    assert torch.equal(fused_cpu.moe_routed(x[3:4], ids[3:4], w[3:4], w13, w2), got[3:4])
