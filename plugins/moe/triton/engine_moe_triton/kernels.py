"""The fused-MoE kernels.

Design (the SGLang/vLLM lineage, written here from the algorithm):

1. ``align_by_expert`` (torch ops, no host sync, so CUDA graphs can capture it): the ``T*k``
   (token, slot) pairs are sorted by expert and each expert's run padded up to a multiple of
   ``BLOCK_M``; ``sorted_ids`` holds pair ids (``T*k`` marks padding), ``block_expert`` the expert
   of each ``BLOCK_M`` block (-1 past the end), ``num_padded`` the used length.
2. ``grouped_gemm`` (one kernel, launched twice): program (m-block, n-block) gathers the rows of
   its block (``pair // top_k`` of the input), multiplies them by its expert's ``[N, K]`` matrix
   with float32 accumulation, optionally scales each row by its router weight, and writes the rows
   back at their pair positions. Launch 1: ``hidden @ w13[e].T`` (gate and up in one GEMM);
   launch 2: ``act @ w2[e].T`` weighted.
3. ``silu_and_mul`` between them; the combine (``combine_pairs``) sums the k slots of each
   token in float32.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from engine.api.triton import (launch_options, line_offsets, pdl_trigger, pdl_wait,
                               prefetch_l2)


def align_by_expert(topk_ids: torch.Tensor, block_m: int,
                    num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_ids [cap] int32, block_expert [cap // block_m] int32, num_padded [1] int32) with
    ``cap = T*k + E*(block_m-1)`` rounded up to ``block_m``; ids < 0 are dropped."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    bucket = torch.where(flat >= 0, flat, num_experts)  # foreign experts -> a dropped bucket
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))
    counts = counts[:num_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    starts = ends - padded
    order = torch.argsort(bucket, stable=True)
    sorted_bucket = bucket[order]
    first = torch.cumsum(torch.cat([counts.new_zeros(1), counts]), 0)  # unpadded run starts
    keep = sorted_bucket < num_experts
    safe = torch.where(keep, sorted_bucket, 0)
    rank = torch.arange(n, device=device) - first[safe]
    dest = torch.where(keep, starts[safe] + rank, -1)
    cap = (n + num_experts * (block_m - 1) + block_m - 1) // block_m * block_m
    sorted_ids = torch.full((cap + 1,), n, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, torch.where(keep, dest, cap), order.to(torch.int32))
    sorted_ids = sorted_ids[:cap]
    block_start = torch.arange(0, cap, block_m, device=device)
    block_expert = torch.searchsorted(ends, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_ids, block_expert, ends[-1:].to(torch.int32)


@triton.jit
def _grouped_gemm(a_ptr, b_ptr, c_ptr, w_ptr, sorted_ids_ptr, block_expert_ptr, num_padded_ptr,
                  N, K, num_pairs, stride_am, stride_ak, stride_be, stride_bn, stride_bk,
                  stride_cm, stride_cn, TOP_K: tl.constexpr, MUL_WEIGHT: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,
                  PDL: tl.constexpr):
    pdl_trigger(PDL)
    pdl_wait(PDL)
    pid = tl.program_id(0)
    cap_blocks = tl.cdiv(tl.num_programs(0), tl.cdiv(N, BLOCK_N))
    n_blocks = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * n_blocks)
    first_m = group * GROUP_M
    size_m = min(cap_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * n_blocks)) % size_m
    pid_n = (pid % (GROUP_M * n_blocks)) // size_m
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + rows)
    row_ok = pair < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (pair // TOP_K).to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = (b_ptr + expert * stride_be + offs_n.to(tl.int64)[None, :] * stride_bn
              + offs_k[:, None] * stride_bk)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = offs_k < K - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if IEEE:  # float32 weights: exact products, no TF32
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if MUL_WEIGHT:
        w = tl.load(w_ptr + pair, mask=row_ok, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, weights: torch.Tensor,
                 sorted_ids: torch.Tensor, block_expert: torch.Tensor, num_padded: torch.Tensor,
                 *, top_k: int, mul_weight: bool, block: dict[str, int]) -> None:
    """``out[pair] = a[pair // top_k] @ b[expert(pair)].T`` (times the pair's router weight)."""
    num_pairs = out.shape[0]
    _, n, k = b.shape
    bm, bn, bk = block["BLOCK_SIZE_M"], block["BLOCK_SIZE_N"], block["BLOCK_SIZE_K"]
    grid = (triton.cdiv(sorted_ids.shape[0], bm) * triton.cdiv(n, bn),)
    _grouped_gemm[grid](
        a, b, out, weights, sorted_ids, block_expert, num_padded, n, k, num_pairs,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2),
        out.stride(0), out.stride(1), TOP_K=top_k, MUL_WEIGHT=mul_weight,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=block["GROUP_SIZE_M"],
        EVEN_K=k % bk == 0, IEEE=a.dtype == torch.float32, num_warps=block.get("num_warps", 4),
        num_stages=block.get("num_stages", 3), **launch_options(a.device))


@triton.jit
def _silu_and_mul(x_ptr, out_ptr, inter, stride_x, stride_o, BLOCK: tl.constexpr,
                  PDL: tl.constexpr):
    pdl_trigger(PDL)
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < inter
    g = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + inter + offs, mask=ok, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    rows, inter = out.shape
    block = min(1024, triton.next_power_of_2(inter))
    _silu_and_mul[(rows, triton.cdiv(inter, block))](x, out, inter, x.stride(0), out.stride(0),
                                                     BLOCK=block, **launch_options(x.device))


# ---------------------------------------------------------------- small batches (decode)
#
# With few (token, expert) pairs, sorting them into BLOCK_M-row blocks costs more launches than
# the GEMMs themselves, and most of each block would be padding. Instead one program computes
# one pair's BLOCK_N outputs as a matrix-vector product straight from ``topk_ids``: the expert's
# weight tile is read once per pair (the step is bound by reading the active experts' weights).


@triton.jit
def _w_rows_tile(w_rows, k0, n_ok, K, BLOCK_K: tl.constexpr, EVICT: tl.constexpr):
    """Columns ``k0 ..`` of the weight rows ``w_rows`` [BLOCK_N, 1] (zeros from ``K`` on and
    past N: a tile wholly past K loads nothing), with the cache eviction policy EVICT ("":
    the default; "evict_first": lines read once, the first the L2 lets go)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    return tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & (offs_k < K)[None, :],
                   other=0.0, eviction_policy=EVICT)


@triton.jit
def silu_tile(gu_row, offs_k, I, MASKED: tl.constexpr = False):
    """``silu(gate) * up`` at columns ``offs_k`` of the gate/up row ``gu_row`` (the up half ``I``
    columns on), rounded to the row's type as a stored activation is, in float32 (MASKED:
    zeros from column I on; else whole columns, no mask)."""
    if MASKED:
        k_ok = offs_k < I
        g = tl.load(gu_row + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        u = tl.load(gu_row + I + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    else:
        g = tl.load(gu_row + offs_k).to(tl.float32)
        u = tl.load(gu_row + I + offs_k).to(tl.float32)
    return (g * tl.sigmoid(g) * u).to(gu_row.dtype.element_ty).to(tl.float32)


@triton.jit
def _pair_gemv_up(x_ptr, w_ptr, out_ptr, ids_ptr, N, K, stride_x, stride_we, stride_wn,
                  stride_o, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  ACC2D: tl.constexpr, NEXT: tl.constexpr, EVICT: tl.constexpr,
                  PDL: tl.constexpr, GLU: tl.constexpr = False):
    """GLU: a program's BLOCK_N rows are BLOCK_N / 2 features' gate and up rows (feature f's
    at rows f and f + N / 2, side by side), and it stores their ``silu(gate) * up`` at
    ``out[pair, f]`` (each rounded as the gate/up row and then the activation are when
    stored), not the rows. ACC2D: products accumulate elementwise over the K loop and are
    summed once at the end
    (else each tile's products are summed as they come). NEXT: each iteration loads the next
    iteration's weight tile before it uses its own (two tiles in flight a program: Triton's
    pipeliner leaves loads that feed no ``tl.dot`` alone). EVICT: the weights' cache eviction
    policy (``_w_rows_tile``; "evict_first" keeps this kernel's stream of weights, each read
    once, from pushing the down projection's prefetched rows out of L2). With PDL the next
    kernel (the down projection) may launch only once every program has waited here, so the
    router's expert ids are final when it starts, and it can bring its experts' weights into
    L2 while this kernel runs (``_pair_gemv_down``)."""
    pdl_wait(PDL)
    pdl_trigger(PDL)
    pair = tl.program_id(0).to(tl.int64)
    if GLU:  # (gate f, up f) side by side
        HALF: tl.constexpr = BLOCK_N // 2
        lane = tl.arange(0, BLOCK_N)
        feat = tl.program_id(1) * HALF + lane // 2
        offs_n = feat + (lane % 2) * (N // 2)
        n_ok = feat < N // 2
    else:
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    if expert < 0:
        return
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    x_row = x_ptr + (pair // TOP_K) * stride_x
    w_rows = w_ptr + expert * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
    if NEXT:
        w_next = _w_rows_tile(w_rows, 0, n_ok, K, BLOCK_K, EVICT)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(x_row + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        if NEXT:
            w = w_next
            w_next = _w_rows_tile(w_rows, k0 + BLOCK_K, n_ok, K, BLOCK_K, EVICT)
        else:
            w = _w_rows_tile(w_rows, k0, n_ok, K, BLOCK_K, EVICT)
        if ACC2D:
            acc2 += w.to(tl.float32) * x[None, :]
        else:
            acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    if ACC2D:
        acc = tl.sum(acc2, axis=1)
    dt: tl.constexpr = out_ptr.dtype.element_ty
    if GLU:
        gate, up = tl.split(tl.reshape(acc.to(dt).to(tl.float32), [HALF, 2]))
        act = (gate * tl.sigmoid(gate) * up).to(dt)
        feats = tl.program_id(1) * HALF + tl.arange(0, HALF)
        tl.store(out_ptr + pair * stride_o + feats, act, mask=feats < N // 2)
    else:
        tl.store(out_ptr + pair * stride_o + offs_n, acc.to(dt), mask=n_ok)


@triton.jit
def _pair_gemv_down(gu_ptr, w_ptr, out_ptr, ids_ptr, weights_ptr, N, I,
                    stride_gu, stride_we, stride_wn, stride_o,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    ACC2D: tl.constexpr, PREFETCH: tl.constexpr,
                    NEXT: tl.constexpr, EVICT: tl.constexpr, KEEP: tl.constexpr,
                    PDL: tl.constexpr, TILES: tl.constexpr = 0):
    """``out[pair] = weight * w2[e] @ (silu(gate) * up)``: the activation is computed on the fly
    from the gate/up row of the pair. ACC2D and NEXT as in ``_pair_gemv_up``. With PDL this
    kernel starts only once every program of the up projection has waited for the router
    (which wrote ``ids``), so it reads its expert before its own wait and asks that expert's
    rows of ``w2`` into L2 (one address a line) while the up projection still runs (PREFETCH:
    only where the pairs' rows of ``w2`` fit in L2; more would evict each other before use).
    EVICT: the weights' cache eviction policy as in ``_pair_gemv_up``; KEEP: the prefetch asks
    for its rows with the priority ``evict_last``. TILES > 0: the I inputs are exactly TILES
    tiles of BLOCK_K and N a multiple of BLOCK_N, so the loop is unrolled over whole tiles
    with no masks and the products accumulate elementwise, summed once (a third of the
    instructions of a masked loop at one token's launch)."""
    pdl_trigger(PDL)
    pair = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    if PDL and PREFETCH:
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        if expert >= 0:
            lines = line_offsets(w_ptr, BLOCK_K)
            rows = w_ptr + expert * stride_we + tl.minimum(offs_n, N - 1).to(tl.int64) * stride_wn
            for k0 in range(0, I, BLOCK_K):
                prefetch_l2(rows[:, None] + tl.minimum(k0 + lines, I - 1)[None, :], PDL,
                            KEEP)
    pdl_wait(PDL)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    gu_row = gu_ptr + pair * stride_gu
    if TILES > 0:  # whole tiles: unrolled, no masks, one sum at the end. No branch on the
        # expert, so the gate/up row's loads go out with the id's: another rank's expert (-1)
        # reads expert 0's rows and its row is zeroed (a branch measured 0.4 us slower at one
        # token, masked loads 2 us)
        IC: tl.constexpr = TILES * BLOCK_K  # (== I: the up half's offset a constant)
        w_rows = (w_ptr + tl.maximum(expert, 0) * stride_we
                  + offs_n.to(tl.int64)[:, None] * stride_wn)
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for t in tl.static_range(TILES):
            offs_k = t * BLOCK_K + tl.arange(0, BLOCK_K)
            w = tl.load(w_rows + offs_k[None, :], eviction_policy=EVICT)
            acc2 += w.to(tl.float32) * silu_tile(gu_row, offs_k, IC)[None, :]
        acc = tl.sum(acc2, axis=1) * tl.load(weights_ptr + pair)
        acc = tl.where(expert >= 0, acc, 0.0)
        tl.store(out_ptr + pair * stride_o + offs_n, acc.to(out_ptr.dtype.element_ty))
        return
    if expert < 0:  # another rank's expert: this pair contributes zeros
        tl.store(out_ptr + pair * stride_o + offs_n,
                 tl.zeros((BLOCK_N,), dtype=tl.float32).to(out_ptr.dtype.element_ty), mask=n_ok)
        return
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    w_rows = w_ptr + expert * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
    if NEXT:
        w_next = _w_rows_tile(w_rows, 0, n_ok, I, BLOCK_K, EVICT)
    for k0 in range(0, I, BLOCK_K):
        act = silu_tile(gu_row, k0 + tl.arange(0, BLOCK_K), I, True)
        if NEXT:
            w = w_next
            w_next = _w_rows_tile(w_rows, k0 + BLOCK_K, n_ok, I, BLOCK_K, EVICT)
        else:
            w = _w_rows_tile(w_rows, k0, n_ok, I, BLOCK_K, EVICT)
        if ACC2D:
            acc2 += w.to(tl.float32) * act[None, :]
        else:
            acc += tl.sum(w.to(tl.float32) * act[None, :], axis=1)
    if ACC2D:
        acc = tl.sum(acc2, axis=1)
    acc = acc * tl.load(weights_ptr + pair)
    tl.store(out_ptr + pair * stride_o + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


def pair_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
             topk_weights: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, *,
             block_n: int = 32, block_k: int = 128, warps: int = 4,
             down_block_n: int | None = None, down_block_k: int | None = None,
             down_warps: int | None = None, acc2d: bool = False, next_tile: bool = False,
             l2_hints: int = 0, even_down: tuple[int, int, int] | None = None) -> None:
    """The small-batch path: ``down[pair]`` = the pair's weighted expert output (zeros for
    ``-1`` ids; :func:`combine_pairs` sums a token's pairs). ``acc2d``: sum each output's
    products once at the end of its K loop.
    ``next_tile``: each K iteration loads the next one's weights first (``NEXT``).
    ``down_warps``: the down projection's warps a program (default ``warps``).
    ``l2_hints``: 1, both projections read their weights with the L2 eviction policy
    "evict_first" (``EVICT``); 2, the down projection's prefetch also asks for its rows with
    the priority "evict_last" (``KEEP``); 0, neither.
    ``even_down``: (BLOCK_N, BLOCK_K, warps) of the down projection where its inputs are whole
    tiles of BLOCK_K, at most :data:`EVEN_DOWN_TILES` of them, and its outputs whole blocks of
    BLOCK_N (``TILES``: unrolled, no masks, and no prefetch before the wait: measured slower
    with it); else the launch above."""
    evict = "evict_first" if l2_hints else ""
    t, k = topk_ids.shape
    pairs = t * k
    _, n13, h = w13.shape
    inter = n13 // 2
    ids = topk_ids.reshape(-1)
    _pair_gemv_up[(pairs, triton.cdiv(n13, block_n))](
        x, w13, gate_up, ids, n13, h, x.stride(0), w13.stride(0), w13.stride(1),
        gate_up.stride(0), TOP_K=k, BLOCK_N=block_n,
        BLOCK_K=min(block_k, triton.next_power_of_2(h)), ACC2D=acc2d, NEXT=next_tile,
        EVICT=evict, num_warps=warps, **launch_options(x.device))
    dbn, dw, tiles = down_block_n or block_n, down_warps or warps, 0
    dbk = min(down_block_k or block_k, triton.next_power_of_2(inter))
    if even_down is not None:
        ebn, ebk, ew = even_down
        if inter % ebk == 0 and h % ebn == 0 and inter // ebk <= EVEN_DOWN_TILES:
            dbn, dbk, dw, tiles = ebn, ebk, ew, inter // ebk
    _pair_gemv_down[(pairs, triton.cdiv(h, dbn))](
        gate_up, w2, down, ids, topk_weights.reshape(-1), h, inter, gate_up.stride(0),
        w2.stride(0), w2.stride(1), down.stride(0), BLOCK_N=dbn, BLOCK_K=dbk, ACC2D=acc2d,
        PREFETCH=(tiles == 0
                  and pairs * w2[0].numel() * w2.element_size() <= _l2_budget(x.device)),
        NEXT=next_tile, EVICT=evict, KEEP=l2_hints >= 2, num_warps=dw, TILES=tiles,
        **launch_options(x.device))


#: the most whole input tiles :func:`pair_moe`'s ``even_down`` launch unrolls (more: the loop)
EVEN_DOWN_TILES = 12


@triton.jit
def _token_down(act_ptr, w_ptr, out_ptr, ids_ptr, weights_ptr, res_ptr, ss_ptr, stride_a,
                stride_we, stride_wn, TOP_K: tl.constexpr, I: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RES: tl.constexpr,
                EVICT: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr):
    """One token's down projection through all its TOP_K pairs, with their combine: program p's
    BLOCK_N outputs are ``sum_j round(w_j * w2[e_j] @ act[j])`` (float32, slots in order, each
    pair's row rounded to out's dtype as a stored row is), rounded; RES: plus ``res``, rounded
    again, and the sum of squares of the program's outputs at ``ss[p]``. ``act`` [TOP_K, I]:
    the pairs' activations (``_pair_gemv_up``'s GLU form). I is whole tiles of BLOCK_K and the
    outputs whole blocks of BLOCK_N (no masks); the loops are unrolled, so every tile's loads
    may go out at once. A -1 id (another rank's expert) adds nothing. The ids, weights and
    residual are final when this launches (every up-projection program has waited for the
    router's top-k, which waited for the products before it): the residual is read before the
    wait; PREFETCH: the pairs' ids too, and their rows of ``w2`` asked into L2 then."""
    pdl_trigger(PDL)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    if RES:
        res = tl.load(res_ptr + offs_n).to(tl.float32)
    if PREFETCH:
        lines = line_offsets(w_ptr, BLOCK_K)
        for j in tl.static_range(TOP_K):
            rows = (w_ptr + tl.maximum(tl.load(ids_ptr + j), 0).to(tl.int64) * stride_we
                    + offs_n.to(tl.int64) * stride_wn)
            for k0 in tl.static_range(0, I, BLOCK_K):
                prefetch_l2(rows[:, None] + tl.minimum(k0 + lines, I - 1)[None, :], PDL)
    pdl_wait(PDL)
    dt: tl.constexpr = out_ptr.dtype.element_ty
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        expert = tl.load(ids_ptr + j)
        rows = (w_ptr + tl.maximum(expert, 0).to(tl.int64) * stride_we
                + offs_n.to(tl.int64)[:, None] * stride_wn)
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in tl.static_range(0, I, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            w = tl.load(rows + offs_k[None, :], eviction_policy=EVICT)
            a = tl.load(act_ptr + j * stride_a + offs_k).to(tl.float32)
            acc2 += w.to(tl.float32) * a[None, :]
        part = tl.sum(acc2, axis=1) * tl.load(weights_ptr + j)
        total += tl.where(expert >= 0, part, 0.0).to(dt).to(tl.float32)
    if RES:
        total = (total.to(dt).to(tl.float32) + res).to(dt).to(tl.float32)
        tl.store(ss_ptr + tl.program_id(0), tl.sum(total * total, axis=0))
    tl.store(out_ptr + offs_n, total.to(dt))


#: the most tiles (pairs x input tiles) :func:`token_moe`'s down projection unrolls
TOKEN_DOWN_TILES = 64


def token_down_fits(top_k: int, hidden: int, inter: int, block_n: int, block_k: int) -> bool:
    """Whether :func:`token_moe` serves these widths with this down launch."""
    return (hidden % block_n == 0 and inter % block_k == 0
            and top_k * (inter // block_k) <= TOKEN_DOWN_TILES)


def glu_up(x: torch.Tensor, w13: torch.Tensor, ids: torch.Tensor, act: torch.Tensor,
           top_k: int, block_n: int, block_k: int, warps: int, evict: str) -> None:
    """The up projection's GLU form: ``act[p] = silu(gate) * up`` of ``w13[ids[p]] @ x[p //
    top_k]`` (``block_n`` rows a program, at least 2: half of them gate rows and half the same
    features' up rows; ``evict``: the weights' cache eviction policy)."""
    _, n13, h = w13.shape
    block_n = max(2, block_n)
    _pair_gemv_up[(ids.numel(), triton.cdiv(n13 // 2, block_n // 2))](
        x, w13, act, ids, n13, h, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        TOP_K=top_k, BLOCK_N=block_n, BLOCK_K=min(block_k, triton.next_power_of_2(h)),
        ACC2D=False, NEXT=False, EVICT=evict, GLU=True, num_warps=warps,
        **launch_options(x.device))


def token_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
              topk_weights: torch.Tensor, act: torch.Tensor, out: torch.Tensor,
              residual: torch.Tensor | None = None, ss: torch.Tensor | None = None, *,
              block_n: int = 2, block_k: int = 2048, warps: int = 4,
              token_down: tuple[int, int, int] = (4, 256, 4), l2_hints: int = 0,
              prefetch: bool = False) -> None:
    """One token (``x`` [1, H]) through its k experts in two launches: the up projection
    storing each pair's activation (``act`` [k, I]; ``block_n`` rows a program, half of them
    gate rows and half the same features' up rows), then the down projection of all k pairs
    with their combine (``token_down`` = (BLOCK_N, BLOCK_K, warps); :func:`token_down_fits`
    must hold): ``out`` [1, H] (``residual`` [1, H]: plus it, with ``ss`` [H / BLOCK_N] the
    sums of squares of the output's pieces). ``prefetch``: the down projection asks its rows
    into L2 before its wait. No combine kernel."""
    k = topk_ids.numel()
    _, n13, h = w13.shape
    inter = n13 // 2
    dbn, dbk, dw = token_down
    if not token_down_fits(k, h, inter, dbn, dbk):
        raise ValueError(f"token_moe: down launch {token_down} does not fit H={h}, I={inter}")
    ids = topk_ids.reshape(-1)
    evict = "evict_first" if l2_hints else ""
    glu_up(x, w13, ids, act, k, block_n, block_k, warps, evict)
    _token_down[(h // dbn,)](
        act, w2, out, ids, topk_weights.reshape(-1),
        residual if residual is not None else out, ss if ss is not None else out,
        act.stride(0), w2.stride(0), w2.stride(1), TOP_K=k, I=inter, BLOCK_N=dbn,
        BLOCK_K=dbk, RES=residual is not None, EVICT=evict, PREFETCH=prefetch, num_warps=dw,
        **launch_options(x.device))


@functools.lru_cache(maxsize=None)
def _l2_budget(device: torch.device) -> int:
    """Bytes of weights worth asking into L2 ahead of use: half the GPU's L2 (0 on a CPU)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).L2_cache_size // 2


@triton.jit
def _combine_pairs(down_ptr, out_ptr, H, stride_d, stride_o, res_ptr, ss_ptr, stride_r,
                   TOP_K: tl.constexpr, BLOCK: tl.constexpr, RES: tl.constexpr,
                   PDL: tl.constexpr):
    """``out[t] = sum_j down[t * TOP_K + j]`` in float32 (slots in order), rounded to out's
    dtype; grid ``(T, cdiv(H, BLOCK))``. RES: that sum plus ``res[t]``, rounded again (as a
    separate residual add rounds it), with the sum of squares of the program's outputs at
    ``ss[t, program]`` (a row's pieces, which the next layer's first product norms from)."""
    pdl_trigger(PDL)
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    if RES:
        res = tl.load(res_ptr + t * stride_r + offs, mask=ok, other=0.0).to(tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(down_ptr + (t * TOP_K + j) * stride_d + offs, mask=ok,
                       other=0.0).to(tl.float32)
    dt: tl.constexpr = out_ptr.dtype.element_ty
    if RES:
        acc = (acc.to(dt).to(tl.float32) + res).to(dt).to(tl.float32)
        tl.store(ss_ptr + t * tl.num_programs(1) + tl.program_id(1),
                 tl.sum(tl.where(ok, acc * acc, 0.0), axis=0))
    tl.store(out_ptr + t * stride_o + offs, acc.to(dt), mask=ok)


def combine_pairs(down: torch.Tensor, top_k: int, dtype: torch.dtype,
                  residual: torch.Tensor | None = None
                  ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The combine: each token's ``top_k`` weighted expert rows of ``down`` [T * top_k, H]
    summed in float32, as ``dtype`` [T, H]. A Triton kernel rather than a torch reduction so
    that, under PDL, it launches while the down projection finishes. With ``residual`` [T, H]:
    (that sum plus the residual, each rounded to ``dtype``; the float32 sums of squares of its
    rows' pieces [T, pieces])."""
    pairs, h = down.shape
    t = pairs // top_k
    out = torch.empty((t, h), dtype=dtype, device=down.device)
    block = min(1024, triton.next_power_of_2(h))
    pieces = triton.cdiv(h, block)
    ss = (torch.empty((t, pieces), dtype=torch.float32, device=down.device)
          if residual is not None else out)
    _combine_pairs[(t, pieces)](down, out, h, down.stride(0), out.stride(0),
                                residual if residual is not None else out, ss,
                                residual.stride(0) if residual is not None else 0,
                                TOP_K=top_k, BLOCK=block, RES=residual is not None,
                                num_warps=4, **launch_options(down.device))
    return out if residual is None else (out, ss)
