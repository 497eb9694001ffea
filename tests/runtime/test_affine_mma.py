"""The one-row 4-bit product on the matrix unit from registers
(:mod:`engine.runtime.affine_mma`, a Gluon kernel: it does not run under the Triton interpreter).

Here on the CPU: the kernel's tensor program replayed in PyTorch with the same shapes, joins,
reshapes and permutes (the packed words of a tile -> the weight operand [BN, 256]; x's tile ->
the activation operand [256, 8] with the chunk's groups in its columns; the groups' fold), which
must equal the float64 product of the dequantized weight for any groups, ragged N and chunk
sizes; and :func:`logical_columns` is the permutation both operands follow. Built for sm_90 (the
compiler proves the operands' layout changes free, or the build fails): in
``tests/runtime/test_sm90_compile.py``. On a GPU: the kernel itself against the float32 product
(bfloat16 and float16, a bias, every split and depth, the words through 2-8 stages of
shared memory), and its routing in ``affine_mm``.
"""

from __future__ import annotations

import pytest
import torch

from engine.runtime import quant_triton as qt

OFFSET = 128.0


def _weight(n: int, k: int, group: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.int32)
    s = torch.rand(k // group, n, generator=g, dtype=torch.float64) * 0.01
    b = (torch.rand(k // group, n, generator=g, dtype=torch.float64) - 0.5) * 0.1
    return codes, s, b


def _reference(x, codes, s, b, group):
    w = codes.double() * s.t().repeat_interleave(group, 1) + b.t().repeat_interleave(group, 1)
    return x.double() @ w.t()


def _a_operand(words: torch.Tensor) -> torch.Tensor:
    """The kernel's ``_a_operand`` on words [BN, 4, 8]: output p holds nibble p of each word as
    OFFSET + code; joined (p0 innermost, as ``gl.join`` nests), reshaped and permuted alike."""
    outs = [((words >> (4 * p)) & 0xF).double() + OFFSET for p in range(8)]
    bn = words.shape[0]
    j0 = torch.stack(outs, -1).reshape(bn, 4, 8, 2, 2, 2).permute(0, 1, 2, 5, 4, 3)
    j1 = j0.reshape(bn, 4, 2, 2, 2, 2, 2, 2)
    return j1.permute(0, 7, 6, 5, 2, 3, 1, 4).reshape(bn, 256)


def _b_operand(x: torch.Tensor, t: int, c0: int, group: int) -> torch.Tensor:
    """The kernel's ``_b_operand``: x's tile t as [8 nibbles, 32 words, 8 group columns]
    (column c: the chunk's c-th group, zeros elsewhere), reshaped and permuted to [256, 8]."""
    nib = torch.arange(8).reshape(8, 1, 1)
    i = torch.arange(32).reshape(1, 32, 1)
    c = torch.arange(8).reshape(1, 1, 8)
    g = (t * 256 + 32 * nib) // group - (c0 * 256) // group
    xt = torch.where(g == c, x[t * 256 + 32 * nib + i], torch.zeros((), dtype=x.dtype))
    x6 = xt.reshape(8, 4, 2, 2, 2, 8)
    return x6.permute(0, 2, 3, 1, 4, 5).reshape(256, 8)


def _emulate(x, q, s, b, n, k, group, bn, ct, split):
    """y [n] as the kernel's programs compute it (output blocks of ``bn``, ``split`` slices of
    whole chunks of ``ct`` tiles, a fold at each chunk's end), in float64."""
    n_tiles, gpc = k // 256, ct * 256 // group
    per = -(-(-(-n_tiles // ct)) // split) * ct
    y = torch.zeros(n, dtype=torch.float64)
    for n0 in range(0, n, bn):
        rows = torch.clamp(torch.arange(n0, n0 + bn), max=n - 1)
        km, w = torch.arange(4).reshape(1, 4, 1), torch.arange(8).reshape(1, 1, 8)
        for pid_k in range(split):
            t_lo, t_hi = pid_k * per, min(n_tiles, pid_k * per + per)
            acc = torch.zeros(bn, 8, dtype=torch.float64)
            for t in range(t_lo, t_hi):
                words = q[rows.reshape(-1, 1, 1), t * 32 + km * 8 + w].long() & 0xFFFFFFFF
                c0 = t_lo + (t - t_lo) // ct * ct
                acc += _a_operand(words) @ _b_operand(x, t, c0, group)
                if (t - t_lo) % ct == ct - 1 or t == t_hi - 1:
                    g0 = c0 * 256 // group
                    g = g0 + torch.arange(8)
                    ok = (torch.arange(8) < gpc) & (g < k // group)
                    gc = torch.clamp(g, max=k // group - 1)
                    sc = torch.where(ok, s[gc][:, rows].t(), 0.0)
                    cc = torch.where(ok, b[gc][:, rows].t(), 0.0) - OFFSET * sc
                    xs = torch.stack([x[(g0 + j) * group:(g0 + j + 1) * group].sum()
                                      if ok[j] else torch.zeros((), dtype=torch.float64)
                                      for j in range(8)])
                    y[n0:n0 + bn] += ((acc * sc + cc * xs).sum(1))[:min(bn, n - n0)]
                    acc.zero_()
    return y


@pytest.mark.parametrize("n, k, group, bn, ct, split", [
    (100, 512, 128, 64, 4, 1),     # one chunk of two groups (K shorter than a chunk)
    (70, 1024, 64, 64, 2, 3),      # ragged N, slices of whole chunks, an empty slice
    (33, 768, 32, 16, 1, 2),       # groups of 32: eight groups a tile
    (40, 1536, 256, 64, 4, 2),     # groups of 256: one group a tile, four a chunk
    (16, 2048, 128, 64, 2, 1),     # chunks shorter than eight groups
])
def test_kernel_program_equals_the_product(n, k, group, bn, ct, split):
    codes, s, b = _weight(n, k, group)
    q = qt.pack_affine(codes, 4, 32)
    x = torch.randn(k, dtype=torch.float64)
    want = _reference(x.reshape(1, -1), codes, s, b, group).reshape(-1)
    got = _emulate(x, q, s, b, n, k, group, bn, ct, split)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-9)


def test_logical_columns_is_what_the_operands_hold():
    from engine.runtime.affine_mma import logical_columns

    cols = logical_columns()
    assert sorted(cols.tolist()) == list(range(256))
    # the weight operand's column j holds the code of tile column cols[j] ...
    codes = torch.arange(16).repeat(16)[torch.randperm(256)].reshape(1, 256).int()
    q = qt.pack_affine(codes, 4, 32)
    words = q[0, torch.arange(4).reshape(4, 1) * 8 + torch.arange(8)].reshape(1, 4, 8).long()
    assert torch.equal(_a_operand(words)[0] - OFFSET, codes[0, cols].double())
    # ... and the activation operand's row j holds x at the same column (group 256: column 0)
    x = torch.arange(256, dtype=torch.float64)
    assert torch.equal(_b_operand(x, 0, 0, 256)[:, 0], cols.double())


def test_route_spec_names_shapes_and_their_launches():
    route = qt._mma_route("28672x4096:1,4,4,1,1,1,1,4;6144x4096:1,4,4,2")
    assert route == {(28672, 4096): (1, 4, 4, 1, 1, 1, 1, 4), (6144, 4096): (1, 4, 4, 2)}
    assert qt._mma_route("") == {}
    with pytest.raises(ValueError, match="ENGINE_AFFINE_MMA_ROUTE: '4096:1,4' is not NxK"):
        qt._mma_route("4096:1,4")


def test_supported_refuses_what_it_does_not_serve():
    from engine.runtime import affine_mma as am

    x = torch.zeros(1, 512, dtype=torch.bfloat16)
    assert not am.supported(x, 4, 128, 32, 512)  # not on a GPU
    if torch.cuda.is_available():
        xc = x.cuda()
        assert not am.supported(xc.repeat(2, 1), 4, 128, 32, 512)  # two rows
        assert not am.supported(xc, 8, 128, 32, 512)  # 8-bit codes
        assert not am.supported(xc, 4, 16, 16, 512)  # slices of 16
        assert not am.supported(xc[:, :320], 4, 64, 32, 320)  # K not whole tiles


@pytest.mark.parametrize("stages, depth", [(3, 1), (16, 1), (2, 2), (1, 1)])
def test_launch_refuses_stages_it_cannot_build(stages, depth):
    """Shared-memory stages are a power of two from 2 to 8, with one tile of words a warp in
    registers (depth 1): anything else is refused before a launch, naming both."""
    from engine.runtime import affine_mma as am

    codes, s, b = _weight(64, 512, 128)
    q = qt.pack_affine(codes, 4, 32)
    x = torch.zeros(1, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"stages {stages} with depth {depth}"):
        am.affine_mma(x, q, s.float(), b.float(), 128, config=(1, 4, 4, 1, depth, 1, 1, stages))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n, k, group", [(1000, 1280, 128), (4100, 2816, 64), (24, 256, 32),
                                         (300, 4096, 256)])
def test_gpu_kernel_equals_the_float32_product(dtype, n, k, group):
    from engine.runtime import affine_mma as am

    if not am.supported(torch.zeros(1, k, dtype=dtype, device="cuda"), 4, group, 32, k):
        pytest.skip("no Gluon or no 16-bit matrix instruction here")
    codes, s, b = _weight(n, k, group)
    q = qt.pack_affine(codes, 4, 32).cuda()
    sf, bf = s.float().cuda(), b.float().cuda()
    x = torch.randn(1, k).to(dtype).cuda()
    bias = torch.randn(n).to(dtype).cuda()
    want = _reference(x.cpu(), codes, s.float().double(), b.float().double(), group)
    ct_max = 8 * group // 256
    staged = [(1, 4, ct, split, 1, 1, 1, st) for ct in {1, ct_max} for split in (1, 3)
              for st in (2, 4, 8)]
    for cfg in [None] + staged + [(1, 4, ct, split, d) for ct in {1, ct_max}
                                  for split in (1, 3) for d in (1, 2, 3)]:
        got = am.affine_mma(x, q, sf, bf, group, config=cfg).double().cpu()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
        got = am.affine_mma(x, q, sf, bf, group, bias=bias, config=cfg).double().cpu()
        torch.testing.assert_close(got, want + bias.double().cpu(), rtol=2e-2,
                                   atol=2e-2 * want.abs().max().item())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_affine_mm_routes_one_row_here(monkeypatch):
    from engine.runtime import affine_mma as am

    codes, s, b = _weight(512, 1024, 128)
    q = qt.pack_affine(codes, 4, 32).cuda()
    x = torch.randn(1, 1024).to(torch.bfloat16).cuda()
    if not am.supported(x, 4, 128, 32, 1024):
        pytest.skip("no Gluon or no 16-bit matrix instruction here")
    calls = []
    real = am.affine_mma
    monkeypatch.setattr(am, "affine_mma", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(qt, "AFFINE_MMA", True)
    y = qt.affine_mm(x, q, s.float().cuda(), b.float().cuda(), 4, 128, 32)
    assert calls and y.shape == (1, 512)
    monkeypatch.setattr(qt, "AFFINE_MMA", False)
    calls.clear()
    qt.affine_mm(x, q, s.float().cuda(), b.float().cuda(), 4, 128, 32)
    assert not calls
    monkeypatch.setattr(qt, "AFFINE_MMA_ROUTE", {(512, 1024): (1, 4, 4, 1, 1, 1, 1, 4)})
    y2 = qt.affine_mm(x, q, s.float().cuda(), b.float().cuda(), 4, 128, 32)
    assert calls
    torch.testing.assert_close(y2, y, rtol=2e-2, atol=2e-2 * y.abs().max().item())
