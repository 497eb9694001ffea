"""Triton kernels over the paged KV pool (``k``/``v`` [slots, Hkv, D], slots through
``req_to_token``).

Decode (two kernels):

* ``_decode_split_kernel``, grid ``(B, Hkv, S)``: program ``(b, g, s)`` takes the ``G = Hq / Hkv``
  query heads of KV head ``g`` (padded to ``BLOCK_H`` >= 16 rows so the score and value products
  are matrix products) and the ``s``-th chunk of request ``b``'s context, in ``BLOCK_N``-token
  tiles: slots from ``req_to_token``, K and V rows gathered once for the whole group, online
  softmax. It stores the chunk's normalized partial output [G, D] and its log-sum-exp [G]
  (``-inf`` and zeros for an empty chunk); with a single split (``S == 1``) it writes the final
  output instead and no merge runs.
* ``_decode_merge_kernel``, grid ``(B, Hkv)``: for the group's heads, folds the request's
  non-empty chunks in order with a running log-sum-exp (so a request's result never depends on
  how many splits the longest request of the batch needed) and writes the final rows.

Extend, ``_extend_kernel``, grid ``(Hq / ROW_HEADS, tiles)``, also GQA-aware: the ``BLOCK_M``
query rows of a program are ``TILE_TOKENS = BLOCK_M // ROW_HEADS`` new tokens ``m0..`` of one
request times ``ROW_HEADS`` query heads of one KV head (row ``r``: token ``m0 + r // ROW_HEADS``,
head ``hb*ROW_HEADS + r % ROW_HEADS``). ``ROW_HEADS`` is the whole group ``G`` by default, so
each K/V tile is loaded once for the group; with fewer heads a tile (1: one head's tokens, the
plain flash-attention layout) a tile holds more tokens and the group's programs share each K/V
tile through L2. The tile -> request table is built on the host from the CPU
copies of the lengths, the tiles with the most keys first (the programs of a long causal
prefill differ in cost by its length; the heaviest start first, the light ones fill the tail).
Phase 1 walks the whole key tiles of ``0 .. prefix + m0`` (the cached prefix pages, then the
new tokens before the tile), which every row sees, with no mask at all; phase 2 the rest up to
the tile's own diagonal block ``.. prefix + m0 + TILE_TOKENS`` with the causal mask. A
speculative tree (``HAS_TREE``): phase 1 covers the prefix only and phase 2 every new token up to
the tile's end, masked by the tree (``tree_ptr`` [B, Q, Q] uint8: ancestors and self; a token's
ancestors come before it, so none lies past the tile). Online
softmax in float32 (base 2), the output in q's dtype. When a batch has too few tiles to fill the
GPU (a speculative verify, a short chunk), ``NUM_SPLITS`` programs share phase 1's whole key
tiles, the last of them also doing the rest; each stores a partial output and its log-sum-exp
and ``_extend_merge_kernel``, grid ``(T, Hkv)``, folds them in split order.

Phase 1's whole tiles read K/V through the pool's pages (``PAGE``, its page size): position
``p`` of a request is at slot ``req_to_token[p - p % PAGE] + p % PAGE`` (whole, aligned pages),
and a tile starts at a multiple of ``BLOCK_N`` keys. A page holding whole tiles (``PAGE`` a
multiple of ``BLOCK_N``): one table entry gives the tile's first slot and its K (and V) rows are
one [BLOCK_N, D] block of the [slots, Hkv * D] view, read from a scalar base with offsets that
stay the same from tile to tile, or with ``TMA`` through tensor descriptors (TMA on Hopper; the
host passes them only for a power-of-two head dimension). Tiles of several pages
(``BLOCK_N`` a multiple of ``PAGE``): one entry per page, expanded. Otherwise (``PAGE`` 1, or
neither divides the other), and for every masked tile (phase 2, decode), one entry per key.

This forward's own K/V can come as contiguous rows (``NEW_KV``: ``kn_desc`` / ``vn_desc``, the
cached prefix alone through the pool), the query tile as one [tokens, heads, D] box of q
(``Q_DESC``: rows past the request hold other tokens' queries, never stored). (The output
tile stored as one box through a descriptor was even to 1.5 % slower: removed.)

Every load past a length is masked (never issued), so only slots the batch owns are read.
An ``fp4_mx_block16`` pool (``KV_FP4``: rows of packed E2M1 codes and their blocks' scale bytes)
is unpacked in registers (``_fp4_rows``). An fp8 pool (``KV_FP8``) is read as its bit patterns and
widened to q's dtype; its per-layer K
scale is folded into the softmax scale and its V scale multiplies the output.
Softmax runs in base 2: callers pass ``scale * log2(e)``, and the decode log-sum-exp is in base 2.
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.api.triton import (fp8_from_bits, index_load, line_offsets, pdl_trigger, pdl_wait,
                               prefetch_l2, store_group_codes)


#: growth of a running maximum (base 2) that a LAZY tile step tolerates before it rescales
LAZY_GROWTH = tl.constexpr(8.0)


@triton.jit
def _tile(q, m_i, l_i, acc, r2t_row, n0, offs_n, n_mask, allowed, k_ptr, v_ptr, g, stride_ks,
          stride_kh, stride_vs, stride_vh, offs_d, d_mask, scale, DOT_PREC: tl.constexpr,
          MASKED: tl.constexpr = True, EVEN_D: tl.constexpr = False, KV_FP8: tl.constexpr = 0,
          PAGE: tl.constexpr = 1, k_desc=None, v_desc=None, TMA: tl.constexpr = False,
          LAZY: tl.constexpr = False, INDEX_ASM: tl.constexpr = False,
          OFF32: tl.constexpr = False, CONTIG: tl.constexpr = False, base=0,
          KV_FP4: tl.constexpr = False, k_pre=None, v_pre=None, PRE_KV: tl.constexpr = False):
    """One online-softmax step over the keys at positions ``n0 + offs_n`` (``n_mask``: in
    range; ``allowed``: which (query row, key) scores count): K/V rows of KV head ``g`` read
    through ``req_to_token``, scores, running max ``m_i``, sum ``l_i`` and output ``acc``
    updated. ``MASKED=False``: a whole tile (``n0`` a multiple of its ``BLOCK_N`` keys, every key
    in range and allowed: no masks, no selects), whose slots come from the pool's pages
    (``_page_slots``; ``TMA``: K and V then come through the tensor descriptors ``k_desc`` /
    ``v_desc`` where the tile lies in one page). ``EVEN_D``: the head dimension fills
    ``offs_d``. ``scale`` (> 0) is applied to the scores in the exponent's multiply-add.
    ``KV_FP8`` (1: e4m3, 2: e5m2): the pool holds fp8 bit patterns (uint8), read as fp8 and
    widened to q's dtype (exact); the caller folds the K scale into ``scale`` and multiplies the
    output by the V scale. LAZY: the running maxima (and so ``acc`` and ``l_i``) are moved
    only when some row's maximum grows by more than :data:`LAZY_GROWTH` (base 2), one
    decision for the whole tile; in between a row's probabilities are taken against its
    older maximum (at most 2^LAZY_GROWTH, no overflow), which leaves ``acc / l_i`` as it is
    and skips the accumulator's rescaling at most tiles. INDEX_ASM: a whole tile's table
    entries are read by ``index_load`` (outside the software pipeliner, which then keeps the
    K/V loads ``num_stages - 1`` tiles ahead instead of one). OFF32: the K/V buffers hold
    fewer than 2^31 elements, so gathered rows' offsets are 32-bit (half the registers).
    CONTIG: the keys are rows ``base + n0 ..`` of ``k_desc`` / ``v_desc`` themselves (this
    forward's own K/V, contiguous), read through the descriptors with no table (the caller
    passes ``TMA`` and ``EVEN_D``); rows past ``n_mask`` then belong to the next request or
    lie past the end (zeros), and weigh nothing. KV_FP4: the pool holds ``fp4_mx_block16``
    rows (:func:`_fp4_rows`; the head dimension fills ``offs_d``, no descriptors). PRE_KV: the
    tile's K and V rows are ``k_pre`` / ``v_pre`` (read by the caller, masked as MASKED
    reads them; fp8 ones still as bit patterns), nothing is read here."""
    BLOCK_N: tl.constexpr = offs_n.shape[0]
    # a whole tile in one page (a masked one too where descriptors read it: aligned, n0 < end)
    ONE_PAGE: tl.constexpr = CONTIG or (PAGE // BLOCK_N * BLOCK_N == PAGE
                                        and (not MASKED or (TMA and EVEN_D)))
    if ONE_PAGE:  # consecutive slots from the tile's first (one table entry): a scalar base
        if CONTIG:
            slot0 = base + n0
        else:
            slot0 = index_load(r2t_row + n0, INDEX_ASM)  # and offsets that do not change
        k_rows = k_ptr + slot0 * stride_ks
        v_rows = v_ptr + slot0 * stride_vs
        k_row = offs_n[:, None] * stride_ks + g * stride_kh
        v_row = offs_n[:, None] * stride_vs + g * stride_vh
    else:
        if MASKED:
            slot = tl.load(r2t_row + n0 + offs_n, mask=n_mask, other=0)
        else:
            slot = _page_slots(r2t_row, n0, offs_n, PAGE, INDEX_ASM)
        k_rows, v_rows = k_ptr, v_ptr
        if OFF32:
            slot = slot.to(tl.int32)
        k_row = slot[:, None] * stride_ks + g * stride_kh
        v_row = slot[:, None] * stride_vs + g * stride_vh
    k_off = k_row + offs_d[None, :]
    v_off = v_row + offs_d[None, :]
    if MASKED:
        kv_mask = n_mask[:, None] & d_mask[None, :]
    else:
        kv_mask = d_mask[None, :]
    DESC: tl.constexpr = TMA and ONE_PAGE and EVEN_D and not PRE_KV
    if PRE_KV:
        k = k_pre
    elif DESC:  # a [BLOCK_N, D] block of the [slots, Hkv * D] view
        k = k_desc.load([slot0.to(tl.int32), g * offs_d.shape[0]])
    elif KV_FP4:
        k = _fp4_rows(k_rows + k_row, n_mask, offs_d.shape[0], MASKED, q.dtype)
    elif EVEN_D and not MASKED:
        k = tl.load(k_rows + k_off)
    else:
        k = tl.load(k_rows + k_off, mask=kv_mask, other=0.0)
    k = fp8_from_bits(k, KV_FP8)
    qk = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PREC)
    if MASKED:
        qk = tl.where(allowed, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * scale)
    if LAZY:  # rescale only when a maximum has grown by more than LAZY_GROWTH
        grow = tl.where(m_new > m_i, m_new - m_i, 0.0)  # (+inf for a row's first keys)
        if tl.max(grow, 0) > LAZY_GROWTH:
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
        else:
            m_new = m_i
        p = tl.exp2(qk * scale - m_new[:, None])
    else:
        p = tl.exp2(qk * scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
    if PRE_KV:
        v = v_pre
    elif DESC:
        v = v_desc.load([slot0.to(tl.int32), g * offs_d.shape[0]])
        # rows past the keys in range: whatever the page holds, weighted 0 (CONTIG: other
        # tokens' values or zeros past the end, finite, times probabilities of 0: as they are,
        # so the tile goes to the matrix unit straight from shared memory)
        if MASKED and not CONTIG:
            v = tl.where(n_mask[:, None], v, tl.zeros_like(v))
    elif KV_FP4:
        v = _fp4_rows(v_rows + v_row, n_mask, offs_d.shape[0], MASKED, q.dtype)
    elif EVEN_D and not MASKED:
        v = tl.load(v_rows + v_off)
    else:
        v = tl.load(v_rows + v_off, mask=kv_mask, other=0.0)
    v = fp8_from_bits(v, KV_FP8)
    if LAZY:
        acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc, input_precision=DOT_PREC)
        l_i = l_i + tl.sum(p, 1)
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype),
                                            input_precision=DOT_PREC)
        l_i = l_i * alpha + tl.sum(p, 1)
    return m_new, l_i, acc


@triton.jit
def _fp4_rows(rows, n_mask, D: tl.constexpr, MASKED: tl.constexpr, dt: tl.constexpr):
    """The ``fp4_mx_block16`` rows at ``rows`` [BLOCK_N, 1] (``D / 2`` bytes of E2M1 codes, the
    element ``2j`` in byte ``j``'s low nibble, then one scale byte ``e + 127`` per 16 values)
    as [BLOCK_N, D] of ``dt``; rows off ``n_mask`` (MASKED) read as zeros. Each value is built
    by its float32 bit pattern: magnitude code ``m`` = 2 exponent bits ``x`` and a mantissa bit
    ``b`` is ``(1 + b / 2) 2^(x - 1)`` from ``m = 2`` on and ``b / 2`` below, times ``2^e``:
    the exponent field ``x - 1 + e + 127`` with ``b`` as the mantissa's top bit, or ``e +
    126`` with none for ``m = 1``, or zero."""
    BLOCK_N: tl.constexpr = rows.shape[0]
    HALF: tl.constexpr = D // 2
    NB: tl.constexpr = D // 16
    at_data = rows + tl.arange(0, HALF)[None, :]
    at_scale = rows + HALF + tl.arange(0, NB)[None, :]
    if MASKED:
        data = tl.load(at_data, mask=n_mask[:, None], other=0)
        sc = tl.load(at_scale, mask=n_mask[:, None], other=127)
    else:
        data = tl.load(at_data)
        sc = tl.load(at_scale)
    data = data.to(tl.uint32)
    codes = tl.reshape(tl.join(data & 15, data >> 4), [BLOCK_N, D])
    e = tl.reshape(tl.broadcast_to(sc.to(tl.uint32)[:, :, None], [BLOCK_N, NB, 16]),
                   [BLOCK_N, D])
    m = codes & 7
    bits = tl.where(m >= 2, ((e + (m >> 1) - 1) << 23) | ((m & 1) << 22),
                    tl.where(m == 1, (e - 1) << 23, 0))
    bits = bits | ((codes & 8) << 28)  # the sign
    return bits.to(tl.float32, bitcast=True).to(dt)


@triton.jit
def _page_slots(r2t_row, n0, offs_n, PAGE: tl.constexpr, INDEX_ASM: tl.constexpr):
    """Slots of the whole key tile ``n0 + offs_n`` (``n0`` a multiple of the tile's keys): a
    page is ``PAGE`` consecutive slots, so a tile of whole pages needs one table entry per page,
    expanded; any other layout (``PAGE`` 1, or not dividing the tile) one entry per key."""
    BLOCK_N: tl.constexpr = offs_n.shape[0]
    if PAGE > 1 and BLOCK_N % PAGE == 0:
        base = index_load(r2t_row + n0 + tl.arange(0, BLOCK_N // PAGE) * PAGE, INDEX_ASM)
        slot = tl.reshape(base[:, None] + tl.arange(0, PAGE)[None, :], [BLOCK_N])
    else:
        slot = index_load(r2t_row + n0 + offs_n, INDEX_ASM)
    return slot


@triton.jit
def _splits(seq_len, split_len_fixed, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
            FIXED_TILE: tl.constexpr):
    """(tokens of one split, splits holding any) of a request of ``seq_len`` tokens: the fixed
    tile, or NUM_SPLITS chunks each a whole number of key tiles (plain arithmetic: cheaper to
    interpret)."""
    if FIXED_TILE:
        split_len = split_len_fixed
    else:
        chunk = (seq_len + NUM_SPLITS - 1) // NUM_SPLITS
        split_len = (chunk + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    return split_len, (seq_len + split_len - 1) // split_len


@triton.jit
def _prefetch_kv(r2t_row, start, end, offs_n, k_ptr, v_ptr, g, stride_ks, stride_kh,
                 stride_vs, stride_vh, BLOCK_D: tl.constexpr):
    """Ask the K and V rows of KV head ``g`` at the positions ``start + offs_n`` (below
    ``end``) into L2, one address per 128-byte line."""
    pos = start + offs_n
    slot = tl.load(r2t_row + pos, mask=pos < end, other=0).to(tl.int64)
    lines = line_offsets(k_ptr, BLOCK_D)[None, :]
    prefetch_l2(k_ptr + slot[:, None] * stride_ks + g * stride_kh + lines, True)
    prefetch_l2(v_ptr + slot[:, None] * stride_vs + g * stride_vh + lines, True)


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, req_to_token_ptr, req_pool_ptr, seq_lens_ptr,
    part_out_ptr, part_lse_ptr, out_ptr, cnt_ptr,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_r2t,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ot, stride_oh,
    scale, split_len_fixed, v_scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    FIXED_TILE: tl.constexpr, DOT_PREC: tl.constexpr, KV_FP8: tl.constexpr = 0,
    FUSED_MERGE: tl.constexpr = False, PDL: tl.constexpr = False, KV_FP4: tl.constexpr = False,
    PRELOAD: tl.constexpr = False,
):
    b = tl.program_id(0)
    g = tl.program_id(1)
    s = tl.program_id(2)
    pdl_trigger(PDL)
    # the batch's lengths, rows and slot table are written before the step's first kernel
    # (no kernel of the step writes them): read before the wait
    seq_len = tl.load(seq_lens_ptr + b)
    row = tl.load(req_pool_ptr + b)
    split_len, used = _splits(seq_len, split_len_fixed, NUM_SPLITS, BLOCK_N, FIXED_TILE)
    start = s * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = g * GROUP + offs_h
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    hd_mask = h_mask[:, None] & d_mask[None, :]
    r2t_row = req_to_token_ptr + row * stride_r2t
    if PRELOAD:  # the chunk's first key tile read while the previous kernel runs, all but
        # the newest token's row (which that kernel writes: read after the wait)
        pos0 = start + offs_n
        in0 = pos0 < end
        slot0 = tl.load(r2t_row + pos0, mask=in0, other=0).to(tl.int64)
        old = (in0 & (pos0 < seq_len - 1))[:, None] & d_mask[None, :]
        k_at = k_ptr + slot0[:, None] * stride_ks + g * stride_kh + offs_d[None, :]
        v_at = v_ptr + slot0[:, None] * stride_vs + g * stride_vh + offs_d[None, :]
        k0 = tl.load(k_at, mask=old, other=0.0)
        v0 = tl.load(v_at, mask=old, other=0.0)
    elif PDL and not KV_FP4:  # the chunk's first key tile asked into L2 while the previous
        # kernel runs (the newest token's K/V, which that kernel writes, is read again after
        # the wait anyway: L2 is where the write lands; fp4 rows are not D elements wide)
        _prefetch_kv(r2t_row, start, end, offs_n, k_ptr, v_ptr, g, stride_ks, stride_kh,
                     stride_vs, stride_vh, BLOCK_D)
    pdl_wait(PDL)
    q = tl.load(q_ptr + b * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=hd_mask, other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    first = start
    if PRELOAD:
        if start < end:  # (an empty chunk takes no step)
            new = (in0 & (pos0 == seq_len - 1))[:, None] & d_mask[None, :]
            k0 = tl.where(new, tl.load(k_at, mask=new, other=0.0), k0)
            v0 = tl.where(new, tl.load(v_at, mask=new, other=0.0), v0)
            m_i, l_i, acc = _tile(q, m_i, l_i, acc, r2t_row, start, offs_n, in0, in0[None, :],
                                  k_ptr, v_ptr, g, stride_ks, stride_kh, stride_vs,
                                  stride_vh, offs_d, d_mask, scale, DOT_PREC, KV_FP8=KV_FP8,
                                  k_pre=k0, v_pre=v0, PRE_KV=True)
        first = start + BLOCK_N
    for n0 in range(first, end, BLOCK_N):
        pos = n0 + offs_n
        n_mask = pos < end
        m_i, l_i, acc = _tile(q, m_i, l_i, acc, r2t_row, n0, offs_n, n_mask, n_mask[None, :],
                              k_ptr, v_ptr, g, stride_ks, stride_kh, stride_vs, stride_vh,
                              offs_d, d_mask, scale, DOT_PREC, KV_FP8=KV_FP8, KV_FP4=KV_FP4)
    if KV_FP8 != 0:
        acc = acc * v_scale

    if NUM_SPLITS == 1:  # the whole context in one chunk: final rows, no merge
        out = acc * (1.0 / l_i)[:, None]  # (a reciprocal a row: cheaper than a division
        # an element)
        tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=hd_mask)
    else:
        nonempty = end > start
        safe_l = tl.where(l_i > 0, l_i, 1.0)
        out = tl.where(nonempty, acc * (1.0 / safe_l)[:, None], 0.0)
        lse = tl.where(nonempty, m_i + tl.log2(safe_l), float("-inf"))
        part_rows = part_out_ptr + b * stride_pb + heads[:, None] * stride_ph + offs_d[None, :]
        lse_rows = part_lse_ptr + b * stride_lb + heads * stride_lh
        tl.store(part_rows + s * stride_ps, out.to(part_out_ptr.dtype.element_ty),
                 mask=hd_mask)
        tl.store(lse_rows + s, lse, mask=h_mask)
        if FUSED_MERGE:  # the last split of (b, g) to finish folds them all
            tl.debug_barrier()  # every thread's partials issued before the release below
            cnt = cnt_ptr + b * tl.num_programs(1) + g
            arrived = tl.atomic_add(cnt, 1, sem="acq_rel")
            if arrived == NUM_SPLITS - 1:
                final = _fold_splits(part_rows, lse_rows, stride_ps, used, hd_mask, h_mask,
                                     BLOCK_H, BLOCK_D, ".cg", NUM_SPLITS)
                tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                         final.to(out_ptr.dtype.element_ty), mask=hd_mask)
                tl.atomic_xchg(cnt, 0)


@triton.jit
def _decode_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, seq_lens_ptr,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ot, stride_oh,
    split_len_fixed, codes_ptr, scales_ptr, tokens, stride_ct,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    FIXED_TILE: tl.constexpr, PDL: tl.constexpr = False, CODES: tl.constexpr = False,
    FP8: tl.constexpr = 1, QMAX: tl.constexpr = 448.0, MANT: tl.constexpr = 3,
    EMIN: tl.constexpr = -6, GRID: tl.constexpr = True,
):
    """Fold each (request, KV head)'s split partials into its query heads' outputs. CODES: the
    outputs written instead as fp8 codes per head (a group of HEAD_DIM columns: the next
    layer's input, rows of ``tokens`` codes at ``codes_ptr``, scales [heads, tokens] at
    ``scales_ptr``), as ``quant_groups`` makes them of the rows written otherwise; ``out_ptr``
    then only gives the rows' dtype."""
    b = tl.program_id(0)
    g = tl.program_id(1)
    pdl_trigger(PDL)
    # the lengths are the step's own (written before its first kernel, as the split kernel
    # reads them before its wait too): read over the wait
    seq_len = tl.load(seq_lens_ptr + b)
    _, used = _splits(seq_len, split_len_fixed, NUM_SPLITS, BLOCK_N, FIXED_TILE)
    pdl_wait(PDL)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = g * GROUP + offs_g
    g_mask = offs_g < GROUP
    gd_mask = g_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
    # in split order: the result depends on this request alone
    out = _fold_splits(part_out_ptr + b * stride_pb + heads[:, None] * stride_ph
                       + offs_d[None, :], part_lse_ptr + b * stride_lb + heads * stride_lh,
                       stride_ps, used, gd_mask, g_mask, BLOCK_G, BLOCK_D, "", NUM_SPLITS)
    if CODES:
        rows = tl.where(gd_mask, out.to(out_ptr.dtype.element_ty).to(tl.float32), 0.0)
        store_group_codes(rows, codes_ptr + b * stride_ct + heads[:, None] * HEAD_DIM
                          + offs_d[None, :], gd_mask, scales_ptr + heads[:, None] * tokens + b,
                          g_mask[:, None], FP8, QMAX, MANT, EMIN, GRID)
    else:
        tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=gd_mask)


@triton.jit
def _fold_splits(part_ptrs, lse_ptrs, stride_ps, count, gd_mask, g_mask,
                 BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, CACHE: tl.constexpr,
                 NUM: tl.constexpr):
    """The first ``count`` (of at most NUM) split partial outputs ([G, D] at ``part_ptrs + s *
    stride_ps``, log-sum-exps at ``lse_ptrs + s``) folded in split order with a running
    log-sum-exp; a split with no key (``-inf``) adds nothing, wherever it is. The NUM steps
    are unrolled, those past ``count`` masked (they add exactly nothing), so every split's
    loads are asked for at once rather than one trip to L2 a split (a loop of ``count`` steps
    was 0.6 us slower a layer at batch 1 on an H100). CACHE: the loads' cache modifier (".cg":
    from L2, for partials other programs of the same kernel wrote)."""
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for s in tl.static_range(NUM):
        here = s < count
        m, total, acc = _fold_step(m, total, acc, part_ptrs, lse_ptrs, stride_ps, s,
                                   tl.where(here, gd_mask, False),
                                   tl.where(here, g_mask, False), CACHE)
    return acc * (1.0 / tl.where(total > 0, total, 1.0))[:, None]


@triton.jit
def _fold_step(m, total, acc, part_ptrs, lse_ptrs, stride_ps, s, gd_mask, g_mask,
               CACHE: tl.constexpr):
    """Split ``s`` folded into the running (maximum, total, accumulator)."""
    lse = tl.load(lse_ptrs + s, mask=g_mask, other=float("-inf"), cache_modifier=CACHE)
    part = tl.load(part_ptrs + s * stride_ps, mask=gd_mask, other=0.0, cache_modifier=CACHE)
    m_new = tl.maximum(m, lse)
    live = m_new > float("-inf")
    alpha = tl.where(live, tl.exp2(m - m_new), 1.0)
    w = tl.where(live, tl.exp2(lse - m_new), 0.0)
    acc = acc * alpha[:, None] + part.to(tl.float32) * w[:, None]
    total = total * alpha + w
    return m_new, total, acc


@triton.jit
def _extend_new_kv(q, m_i, l_i, acc, r2t_row, prefix, ext, m0, qo, tok, offs_n, k_ptr, v_ptr, g,
                   stride_ks, stride_kh, stride_vs, stride_vh, offs_d, d_mask, scale, k_desc,
                   v_desc, kn_desc, vn_desc, DOT_PREC: tl.constexpr, TILE_TOKENS: tl.constexpr,
                   EVEN_D: tl.constexpr, PAGE: tl.constexpr, TMA: tl.constexpr,
                   LAZY: tl.constexpr, INDEX_ASM: tl.constexpr, OFF32: tl.constexpr):
    """The extend tile's keys when this forward's new K/V come as contiguous rows (``kn_desc``
    / ``vn_desc``, request rows from ``qo``): the cached prefix's whole tiles and its last
    partial tile through the pool, then the new tokens before the tile as whole tiles of
    their own rows, then the tile's diagonal block of them, causally (``tok``: each row's new
    token)."""
    BLOCK_N: tl.constexpr = offs_n.shape[0]
    pfull = prefix - prefix % BLOCK_N
    for n0 in range(0, pfull, BLOCK_N):
        m_i, l_i, acc = _tile(q, m_i, l_i, acc, r2t_row, n0, offs_n, offs_n, offs_n, k_ptr,
                              v_ptr, g, stride_ks, stride_kh, stride_vs, stride_vh, offs_d,
                              d_mask, scale, DOT_PREC, MASKED=False, EVEN_D=EVEN_D, PAGE=PAGE,
                              k_desc=k_desc, v_desc=v_desc, TMA=TMA, LAZY=LAZY,
                              INDEX_ASM=INDEX_ASM, OFF32=OFF32)
    if pfull < prefix:
        n_mask = pfull + offs_n < prefix
        m_i, l_i, acc = _tile(q, m_i, l_i, acc, r2t_row, pfull, offs_n, n_mask,
                              n_mask[None, :], k_ptr, v_ptr, g, stride_ks, stride_kh,
                              stride_vs, stride_vh, offs_d, d_mask, scale, DOT_PREC,
                              EVEN_D=EVEN_D, PAGE=PAGE, k_desc=k_desc, v_desc=v_desc, TMA=TMA,
                              LAZY=LAZY, OFF32=OFF32)
    nfull = m0 - m0 % BLOCK_N  # new tokens every row of the tile sees
    for n0 in range(0, nfull, BLOCK_N):
        m_i, l_i, acc = _tile(q, m_i, l_i, acc, r2t_row, n0, offs_n, offs_n, offs_n, k_ptr,
                              v_ptr, g, stride_ks, stride_kh, stride_vs, stride_vh, offs_d,
                              d_mask, scale, DOT_PREC, MASKED=False, EVEN_D=True,
                              k_desc=kn_desc, v_desc=vn_desc, TMA=True, LAZY=LAZY,
                              CONTIG=True, base=qo)
    # the diagonal block, causally: a row's keys up to its own token, which lies before the
    # request's end, so no key past it counts (rows past the end are never stored; each
    # still sees key nfull <= m0, so none is all -inf)
    if BLOCK_N % TILE_TOKENS == 0:  # one key tile holds the whole block: no loop
        causal = (nfull + offs_n)[None, :] <= tok[:, None]
        m_i, l_i, acc = _tile(q, m_i, l_i, acc, r2t_row, nfull, offs_n, offs_n, causal, k_ptr,
                              v_ptr, g, stride_ks, stride_kh, stride_vs, stride_vh, offs_d,
                              d_mask, scale, DOT_PREC, EVEN_D=True, k_desc=kn_desc,
                              v_desc=vn_desc, TMA=True, LAZY=LAZY, CONTIG=True, base=qo)
    else:
        hi = tl.minimum(m0 + TILE_TOKENS, ext)
        for n0 in range(nfull, hi, BLOCK_N):
            causal = (n0 + offs_n)[None, :] <= tok[:, None]
            m_i, l_i, acc = _tile(q, m_i, l_i, acc, r2t_row, n0, offs_n, offs_n, causal,
                                  k_ptr, v_ptr, g, stride_ks, stride_kh, stride_vs,
                                  stride_vh, offs_d, d_mask, scale, DOT_PREC, EVEN_D=True,
                                  k_desc=kn_desc, v_desc=vn_desc, TMA=True, LAZY=LAZY,
                                  CONTIG=True, base=qo)
    return m_i, l_i, acc


@triton.jit
def _extend_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, req_to_token_ptr, req_pool_ptr, prefix_lens_ptr,
    extend_lens_ptr, qo_start_ptr, tile_req_ptr, tile_start_ptr, tree_ptr,
    part_out_ptr, part_lse_ptr, k_desc, v_desc, kn_desc, vn_desc, qn_desc,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh,
    stride_r2t, stride_tb, stride_tq, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    scale, v_scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, TILE_TOKENS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PREC: tl.constexpr, HAS_TREE: tl.constexpr, KV_FP8: tl.constexpr = 0,
    NUM_SPLITS: tl.constexpr = 1, PAGE: tl.constexpr = 1, TMA: tl.constexpr = False,
    ROW_HEADS: tl.constexpr = 0, LAZY: tl.constexpr = False, INDEX_ASM: tl.constexpr = False,
    OFF32: tl.constexpr = False, NEW_KV: tl.constexpr = False, PDL: tl.constexpr = False,
    Q_DESC: tl.constexpr = False, KV_FP4: tl.constexpr = False,
):
    HEADS: tl.constexpr = ROW_HEADS if ROW_HEADS > 0 else GROUP  # query heads of a tile
    hb = tl.program_id(0)  # the tile's block of HEADS query heads (inside one KV head's)
    g = hb * HEADS // GROUP  # their KV head
    t = tl.program_id(1)
    s = tl.program_id(2)  # the split of phase 1's key tiles (the last split also does phase 2)
    pdl_trigger(PDL)
    # the tile table and the batch's lengths, rows and offsets are copied in before the
    # step's first kernel (no kernel of the step writes them): their chain of loads runs
    # before the wait, beside the previous kernel's tail
    i = tl.load(tile_req_ptr + t)
    m0 = tl.load(tile_start_ptr + t)
    row = tl.load(req_pool_ptr + i)
    prefix = tl.load(prefix_lens_ptr + i).to(tl.int32)  # positions in 32 bits: cheaper masks
    ext = tl.load(extend_lens_ptr + i).to(tl.int32)
    qo = tl.load(qo_start_ptr + i)
    pdl_wait(PDL)
    if OFF32:  # (q, out and the partial outputs hold fewer than 2^31 elements too)
        qo = qo.to(tl.int32)
    r2t_row = req_to_token_ptr + row * stride_r2t

    # row r of the tile: new token m0 + r // HEADS, query head hb * HEADS + r % HEADS
    offs_r = tl.arange(0, BLOCK_M)
    tok = m0 + offs_r // HEADS
    head = hb * HEADS + offs_r % HEADS
    r_mask = (offs_r < TILE_TOKENS * HEADS) & (tok < ext)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    rd_mask = r_mask[:, None] & d_mask[None, :]
    if Q_DESC:  # the tile's [tokens, HEADS, D] box of q [T, H, D] (rows past the request
        # hold other tokens' queries, or zeros past T: their results are never stored)
        q = tl.reshape(qn_desc.load([(qo + m0).to(tl.int32), hb * HEADS, 0]),
                       (BLOCK_M, BLOCK_D))
    else:
        q = tl.load(q_ptr + (qo + tok)[:, None] * stride_qt + head[:, None] * stride_qh
                    + offs_d[None, :], mask=rd_mask, other=0.0)
    q_pos = prefix + tok  # absolute position of each row's token

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if NEW_KV:  # this forward's K/V at rows qo.. of kn/vn: the prefix alone through the pool
        m_i, l_i, acc = _extend_new_kv(
            q, m_i, l_i, acc, r2t_row, prefix, ext, m0, qo, tok, offs_n, k_ptr, v_ptr, g,
            stride_ks, stride_kh, stride_vs, stride_vh, offs_d, d_mask, scale, k_desc, v_desc,
            kn_desc, vn_desc, DOT_PREC, TILE_TOKENS, BLOCK_D == HEAD_DIM, PAGE, TMA, LAZY,
            INDEX_ASM, OFF32)
    else:
        # phase 1: the cached prefix pages, then new tokens before the tile: seen by every row,
        # whole key tiles without masks (a speculative tree: the prefix only; every new token goes
        # through the tree mask)
        if HAS_TREE:
            lo = prefix
        else:
            lo = prefix + m0
        full = lo - lo % BLOCK_N
        # split s walks its share of the whole tiles (NUM_SPLITS == 1: all of them)
        per = (full // BLOCK_N + NUM_SPLITS - 1) // NUM_SPLITS * BLOCK_N
        start = s * per
        stop = tl.minimum(full, start + per)
        for n0 in range(start, stop, BLOCK_N):
            m_i, l_i, acc = _tile(q, m_i, l_i, acc, r2t_row, n0, offs_n, offs_n, offs_n, k_ptr,
                                  v_ptr, g, stride_ks, stride_kh, stride_vs, stride_vh, offs_d,
                                  d_mask, scale, DOT_PREC, MASKED=False,
                                  EVEN_D=BLOCK_D == HEAD_DIM, KV_FP8=KV_FP8, PAGE=PAGE,
                                  k_desc=k_desc, v_desc=v_desc, TMA=TMA, LAZY=LAZY,
                                  INDEX_ASM=INDEX_ASM, OFF32=OFF32, KV_FP4=KV_FP4)
        if s == NUM_SPLITS - 1:
            if HAS_TREE:
                if full < lo:  # the prefix's last partial tile
                    n_mask = full + offs_n < lo
                    m_i, l_i, acc = _tile(q, m_i, l_i, acc, r2t_row, full, offs_n, n_mask,
                                          n_mask[None, :], k_ptr, v_ptr, g, stride_ks, stride_kh,
                                          stride_vs, stride_vh, offs_d, d_mask, scale, DOT_PREC,
                                          KV_FP8=KV_FP8, LAZY=LAZY, OFF32=OFF32,
                                          KV_FP4=KV_FP4)
            else:  # the partial tile before the tile's own tokens joins phase 2 (all keys pass)
                lo = full
            # phase 2: the tile's diagonal block of new tokens, causally (a tree: by its mask)
            hi = prefix + tl.minimum(m0 + TILE_TOKENS, ext)
            for n0 in range(lo, hi, BLOCK_N):
                pos = n0 + offs_n
                n_mask = pos < hi
                if HAS_TREE:
                    seen = tl.load(tree_ptr + i * stride_tb + tok[:, None] * stride_tq
                                   + (pos - prefix)[None, :],
                                   mask=r_mask[:, None] & n_mask[None, :], other=0)
                    causal = n_mask[None, :] & (seen != 0)
                else:
                    causal = n_mask[None, :] & (pos[None, :] <= q_pos[:, None])
                # (aligned tiles unless a tree: descriptors serve them as phase 1's)
                m_i, l_i, acc = _tile(q, m_i, l_i, acc, r2t_row, n0, offs_n, n_mask, causal,
                                      k_ptr, v_ptr, g, stride_ks, stride_kh, stride_vs, stride_vh,
                                      offs_d, d_mask, scale, DOT_PREC,
                                      EVEN_D=BLOCK_D == HEAD_DIM, KV_FP8=KV_FP8, PAGE=PAGE,
                                      k_desc=k_desc, v_desc=v_desc, TMA=TMA and not HAS_TREE,
                                      LAZY=LAZY, INDEX_ASM=INDEX_ASM, OFF32=OFF32,
                                      KV_FP4=KV_FP4)
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    # one reciprocal a row, then a multiply an element (a division an element is several
    # instructions each: its range checks and scaling)
    out = acc * (1.0 / safe_l)[:, None]
    if KV_FP8 != 0:
        out = out * v_scale
    if NUM_SPLITS == 1:
        tl.store(out_ptr + (qo + tok)[:, None] * stride_ot + head[:, None] * stride_oh
                 + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=rd_mask)
    else:  # a partial output and its log-sum-exp (-inf: no key), merged by the next kernel
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))
        tl.store(part_out_ptr + (qo + tok)[:, None] * stride_pt + head[:, None] * stride_ph
                 + s * stride_ps + offs_d[None, :], out.to(part_out_ptr.dtype.element_ty),
                 mask=rd_mask)
        tl.store(part_lse_ptr + (qo + tok) * stride_lt + head * stride_lh + s, lse,
                 mask=r_mask)


@triton.jit
def _extend_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr,
    stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
):
    """Fold a new token's split partial outputs, in split order (splits with no key skipped),
    into its final rows for the query heads of KV head ``g``; grid ``(T, Hkv)``."""
    tok = tl.program_id(0)
    g = tl.program_id(1)
    pdl_trigger(PDL)
    pdl_wait(PDL)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = g * GROUP + offs_g
    g_mask = offs_g < GROUP
    gd_mask = g_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
    out = _fold_splits(part_out_ptr + tok * stride_pt + heads[:, None] * stride_ph
                       + offs_d[None, :], part_lse_ptr + tok * stride_lt + heads * stride_lh,
                       stride_ps, NUM_SPLITS, gd_mask, g_mask, BLOCK_G, BLOCK_D, "",
                       NUM_SPLITS)
    tl.store(out_ptr + tok * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=gd_mask)
