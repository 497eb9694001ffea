/* Matrix products straight from GGUF block-quantized weights (x86-64, AVX2 + FMA + F16C).
 *
 * y[m, n] = sum_k x[m, k] * W[n, k] for float32 activations x [M, K] (row-major) and a weight
 * W [N, K] stored as GGUF rows of blocks of 32 values along K:
 *   Q4_0: fp16 d, 16 bytes of nibbles           value = d * (q - 8)
 *   Q4_1: fp16 d, fp16 m, 16 bytes of nibbles   value = d * q + m
 *   Q8_0: fp16 d, 32 int8                       value = d * q
 * Nibble byte j holds element j (low half) and element j + 16 (high half).
 *
 * Activations stay float32 (no requantization): each output is an exact-weight dot product, in
 * a fixed order that depends only on K, so an output row never depends on the other rows of the
 * batch. Rows of W are split across the OpenMP threads of the process (the runtime that torch
 * itself uses, so torch.set_num_threads applies).
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "panel_ops.h"

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 }; /* GGML type ids */
enum { KQ_FIRST = 10, KQ_LAST = 14 }; /* Q2_K..Q6_K, kquants.c's type ids */

#define ROW_TILE 16 /* weight rows per task: their blocks stay in L1 while row chunks reuse them */
#define MAX_MB 8    /* activation rows per register-blocked pass */

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float f16(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    return _cvtsh_ss(h);
}

static inline int block_bytes(int qtype) {
    return qtype == Q4_0 ? 18 : qtype == Q4_1 ? 20 : 34;
}

/* 32 quantized values of one block -> four vectors of 8 floats (integer levels, unscaled). */
static inline __attribute__((always_inline)) void unpack(int qtype, const uint8_t *blk,
                                                         __m256 q[4]) {
    if (qtype == Q8_0) {
        const uint8_t *qs = blk + 2;
        for (int i = 0; i < 4; i++) {
            __m128i b = _mm_loadl_epi64((const __m128i *)(qs + 8 * i));
            q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        }
        return;
    }
    const uint8_t *qs = blk + (qtype == Q4_1 ? 4 : 2);
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m128i mask = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(raw, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    __m256i lo0 = _mm256_cvtepu8_epi32(lo), lo1 = _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8));
    __m256i hi0 = _mm256_cvtepu8_epi32(hi), hi1 = _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8));
    if (qtype == Q4_0) {
        __m256i eight = _mm256_set1_epi32(8);
        lo0 = _mm256_sub_epi32(lo0, eight);
        lo1 = _mm256_sub_epi32(lo1, eight);
        hi0 = _mm256_sub_epi32(hi0, eight);
        hi1 = _mm256_sub_epi32(hi1, eight);
    }
    q[0] = _mm256_cvtepi32_ps(lo0);
    q[1] = _mm256_cvtepi32_ps(lo1);
    q[2] = _mm256_cvtepi32_ps(hi0);
    q[3] = _mm256_cvtepi32_ps(hi1);
}

/* Rows [n0, n1) of W against MB activation rows starting at x; xsum holds the per-block sums of
 * those rows (Q4_1 only). MB is a constant at every call site, so the accumulators live in
 * registers. */
static inline __attribute__((always_inline)) void rows(int qtype, int MB, const uint8_t *w,
                                                       int64_t nb, int64_t n0, int64_t n1,
                                                       const float *x, int64_t k,
                                                       const float *xsum, float *y,
                                                       int64_t ldy) {
    const int bb = block_bytes(qtype);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w + n * nb * bb;
        __m256 acc[MAX_MB];
        float extra[MAX_MB];
        for (int m = 0; m < MB; m++) {
            acc[m] = _mm256_setzero_ps();
            extra[m] = 0.0f;
        }
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = row + b * bb;
            __m256 q[4];
            unpack(qtype, blk, q);
            __m256 d = _mm256_set1_ps(f16(blk));
            for (int m = 0; m < MB; m++) {
                const float *xb = x + m * k + b * 32;
                __m256 s = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
                s = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), s);
                s = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), s);
                s = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), s);
                acc[m] = _mm256_fmadd_ps(d, s, acc[m]);
            }
            /* Q4_1 minimums: m_b * sum(x_b), eight blocks per vector (the rest one by one) */
            if (qtype == Q4_1 && (b & 7) == 7) {
                const uint8_t *g = row + (b - 7) * bb + 2;
                __m128i h = _mm_setr_epi16(
                    (short)(g[0] | g[1] << 8), (short)(g[bb] | g[bb + 1] << 8),
                    (short)(g[2 * bb] | g[2 * bb + 1] << 8), (short)(g[3 * bb] | g[3 * bb + 1] << 8),
                    (short)(g[4 * bb] | g[4 * bb + 1] << 8), (short)(g[5 * bb] | g[5 * bb + 1] << 8),
                    (short)(g[6 * bb] | g[6 * bb + 1] << 8), (short)(g[7 * bb] | g[7 * bb + 1] << 8));
                const __m256 mins = _mm256_cvtph_ps(h);
                for (int m = 0; m < MB; m++)
                    acc[m] = _mm256_fmadd_ps(mins, _mm256_loadu_ps(xsum + m * nb + b - 7), acc[m]);
            }
        }
        if (qtype == Q4_1)
            for (int64_t b = nb & ~(int64_t)7; b < nb; b++) {
                const float mn = f16(row + b * bb + 2);
                for (int m = 0; m < MB; m++) extra[m] += mn * xsum[m * nb + b];
            }
        for (int m = 0; m < MB; m++) y[m * ldy + n] = hsum(acc[m]) + extra[m];
    }
}

/* FN(QT, MB, ...) for the register-block size mb and the type qtype, both constants at each
 * call site (so the accumulators live in registers and the type's branches fold away). */
#define DISPATCH_MB(FN, QT, ...)                                                             \
    switch (mb) {                                                                            \
    case 1: FN(QT, 1, __VA_ARGS__); break;                                                   \
    case 2: FN(QT, 2, __VA_ARGS__); break;                                                   \
    case 3: FN(QT, 3, __VA_ARGS__); break;                                                   \
    case 4: FN(QT, 4, __VA_ARGS__); break;                                                   \
    case 5: FN(QT, 5, __VA_ARGS__); break;                                                   \
    case 6: FN(QT, 6, __VA_ARGS__); break;                                                   \
    case 7: FN(QT, 7, __VA_ARGS__); break;                                                   \
    default: FN(QT, 8, __VA_ARGS__); break;                                                  \
    }
#define DISPATCH(FN, ...)                                                                    \
    if (qtype == Q4_1) {                                                                     \
        DISPATCH_MB(FN, Q4_1, __VA_ARGS__)                                                   \
    } else if (qtype == Q4_0) {                                                              \
        DISPATCH_MB(FN, Q4_0, __VA_ARGS__)                                                   \
    } else {                                                                                 \
        DISPATCH_MB(FN, Q8_0, __VA_ARGS__)                                                   \
    }

static void tile(int qtype, int mb, const uint8_t *w, int64_t nb, int64_t n0, int64_t n1,
                 const float *x, int64_t k, const float *xsum, float *y, int64_t ldy) {
    DISPATCH(rows, w, nb, n0, n1, x, k, xsum, y, ldy)
}

/* y [m, n] = x [m, k] @ W[n, k]^T. Returns 0, or -1 for an unknown type / K not a multiple of
 * 32, or -2 when scratch memory cannot be had. */
int engine_gguf_matmul(int qtype, const uint8_t *w, int64_t n, int64_t k, const float *x,
                       int64_t m, float *y) {
    if ((qtype != Q4_0 && qtype != Q4_1 && qtype != Q8_0) || k % 32 != 0) return -1;
    const int64_t nb = k / 32;
    float *xsum = NULL;
    if (qtype == Q4_1) {
        xsum = (float *)malloc(sizeof(float) * (size_t)(m * nb));
        if (!xsum) return -2;
        for (int64_t r = 0; r < m; r++)
            for (int64_t b = 0; b < nb; b++) {
                const float *xb = x + r * k + b * 32;
                __m256 s = _mm256_add_ps(
                    _mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                    _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24)));
                xsum[r * nb + b] = hsum(s);
            }
    }
    const int64_t tiles = (n + ROW_TILE - 1) / ROW_TILE;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n0 = t * ROW_TILE, n1 = n0 + ROW_TILE < n ? n0 + ROW_TILE : n;
        for (int64_t r = 0; r < m; r += MAX_MB) {
            const int mb = (int)(m - r < MAX_MB ? m - r : MAX_MB);
            tile(qtype, mb, w, nb, n0, n1, x + r * k, k, xsum ? xsum + r * nb : NULL, y + r * n,
                 n);
        }
    }
    free(xsum);
    return 0;
}

/* out [n, k] = the float32 values of W, exactly as the gguf reference computes them (d * q, then
 * + m for Q4_1; no fused multiply-add). Returns 0, or -1 as engine_gguf_matmul. */
int engine_gguf_dequantize(int qtype, const uint8_t *w, int64_t n, int64_t k, float *out) {
    if ((qtype != Q4_0 && qtype != Q4_1 && qtype != Q8_0) || k % 32 != 0) return -1;
    const int64_t nb = k / 32;
    const int bb = block_bytes(qtype);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + (r * nb + b) * bb;
            __m256 q[4];
            unpack(qtype, blk, q);
            const __m256 d = _mm256_set1_ps(f16(blk));
            const __m256 mn = _mm256_set1_ps(qtype == Q4_1 ? f16(blk + 2) : 0.0f);
            float *o = out + r * k + b * 32;
            for (int j = 0; j < 4; j++) {
                __m256 v = _mm256_mul_ps(q[j], d);
                if (qtype == Q4_1) v = _mm256_add_ps(v, mn);
                _mm256_storeu_ps(o + 8 * j, v);
            }
        }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Integer path: the activations are quantized per block of 32 to int8 (scale d_x = max|x|/127,
 * q_x = round(x / d_x), as llama.cpp's Q8_0/Q8_1), and each block's dot product is an integer
 * one (u8 x s8 -> s32: VNNI's dpbusd where the CPU has it, AVX2 maddubs+madd otherwise):
 *   Q4_1: sum_j (d_w q_j + m) d_x x_j = d_w d_x <q, x> + m s_x        (s_x = d_x sum_j x_j)
 *   Q4_0: the same with m = -8 d_w
 *   Q8_0: d_w d_x <|w|, sign(w) x>                                     (signs moved onto x)
 * Each output is still accumulated by one thread over its blocks in order (batch-invariant). */

static inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                                                   _mm256_set1_epi16(1)));
#endif
}

/* One row of activations -> int8 blocks q [k], scales d [k/32] and d * sum(q) in s [k/32];
 * with si, the integer sums of the stored codes too (the panel kernels' zero points). */
static void quantize_row_q8(const float *x, int64_t k, int8_t *q, float *d, float *s,
                            int32_t *si) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / 32; b++) {
        const float *xb = x + b * 32;
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 mx = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        mx = _mm_max_ps(mx, _mm_movehl_ps(mx, mx));
        mx = _mm_max_ss(mx, _mm_movehdup_ps(mx));
        const float am = _mm_cvtss_f32(mx);
        const float db = am / 127.0f, id = am > 0.0f ? 127.0f / am : 0.0f;
        const __m256 mul = _mm256_set1_ps(id);
        __m256i i[4];
        for (int j = 0; j < 4; j++)
            i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], mul),
                                                      _MM_ROUND_NEAREST | _MM_FROUND_NO_EXC));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]),
                                       _mm256_packs_epi32(i[2], i[3]));
        /* the packs interleave 128-bit lanes: restore the element order */
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + b * 32), p);
        d[b] = db;
        s[b] = db * (float)hsum(_mm256_cvtepi32_ps(sum));
        if (si) { /* the codes as stored (the packs saturate to int8) */
            const __m256i lo = _mm256_set1_epi32(-128), hi = _mm256_set1_epi32(127);
            __m256i c = _mm256_setzero_si256();
            for (int j = 0; j < 4; j++)
                c = _mm256_add_epi32(c, _mm256_max_epi32(_mm256_min_epi32(i[j], hi), lo));
            const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(c),
                                            _mm256_extracti128_si256(c, 1));
            const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
            si[b] = _mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xb1)));
        }
    }
}

/* The 32 weights of one block as bytes in element order: nibbles (Q4, unsigned 0..15) or int8. */
static inline __m256i weight_bytes(int qtype, const uint8_t *blk) {
    if (qtype == Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (qtype == Q4_1 ? 4 : 2)));
    const __m128i mask = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask),
                            _mm_and_si128(raw, mask));
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__)
#define WIDE 1 /* two blocks per 512-bit vector */
#else
#define WIDE 0
#endif

static inline __attribute__((always_inline)) void rows_q8(int qtype, int MB, const uint8_t *w,
                                                          int64_t nb, int64_t n0, int64_t n1,
                                                          const int8_t *xq, const float *xd,
                                                          const float *xs, int64_t k, float *y,
                                                          int64_t ldy) {
    const int bb = block_bytes(qtype);
    float mins[nb + 8];
#if WIDE
    const __m512i pick = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
#endif
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w + n * nb * bb;
        __m256 acc[MAX_MB];
        for (int m = 0; m < MB; m++) acc[m] = _mm256_setzero_ps();
        int64_t b = 0;
#if WIDE
        __m512 acc2[MAX_MB];
        for (int m = 0; m < MB; m++) acc2[m] = _mm512_setzero_ps();
        for (; b + 2 <= nb; b += 2) {
            const uint8_t *b0 = row + b * bb, *b1 = b0 + bb;
            const float dw0 = f16(b0), dw1 = f16(b1);
            __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(weight_bytes(qtype, b0)),
                                           weight_bytes(qtype, b1), 1);
            __mmask64 neg = 0;
            if (qtype == Q8_0) {
                neg = _mm512_movepi8_mask(u);
                u = _mm512_abs_epi8(u);
            } else {
                mins[b] = qtype == Q4_1 ? f16(b0 + 2) : -8.0f * dw0;
                mins[b + 1] = qtype == Q4_1 ? f16(b1 + 2) : -8.0f * dw1;
            }
            const __m512 dw = _mm512_insertf32x8(_mm512_set1_ps(dw0), _mm256_set1_ps(dw1), 1);
            for (int m = 0; m < MB; m++) {
                __m512i xv = _mm512_loadu_si512((const void *)(xq + m * k + b * 32));
                if (qtype == Q8_0) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xv);
                const __m512 dx = _mm512_permutexvar_ps(
                    pick, _mm512_castpd_ps(_mm512_castpd128_pd512(
                              _mm_load_sd((const double *)(xd + m * nb + b)))));
                acc2[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx),
                                          acc2[m]);
            }
        }
        for (int m = 0; m < MB; m++)
            acc[m] = _mm256_add_ps(_mm512_castps512_ps256(acc2[m]),
                                   _mm512_extractf32x8_ps(acc2[m], 1));
#endif
        for (; b < nb; b++) {
            const uint8_t *blk = row + b * bb;
            const float dw = f16(blk);
            __m256i u = weight_bytes(qtype, blk);
            __m256i sw = u;
            if (qtype == Q8_0) {
                u = _mm256_sign_epi8(u, u); /* |w| */
            } else {
                mins[b] = qtype == Q4_1 ? f16(blk + 2) : -8.0f * dw;
            }
            for (int m = 0; m < MB; m++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + m * k + b * 32));
                if (qtype == Q8_0) xv = _mm256_sign_epi8(xv, sw);
                const __m256i isum = dot_u8s8(_mm256_setzero_si256(), u, xv);
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                                         _mm256_set1_ps(dw * xd[m * nb + b]), acc[m]);
            }
        }
        if (qtype != Q8_0) { /* + sum_b min_b * s_b, eight blocks per vector, then the rest */
            b = 0;
            for (; b + 8 <= nb; b += 8) {
                const __m256 mv = _mm256_loadu_ps(mins + b);
                for (int m = 0; m < MB; m++)
                    acc[m] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(xs + m * nb + b), acc[m]);
            }
            for (int m = 0; m < MB; m++) {
                float e = 0.0f;
                for (int64_t r = b; r < nb; r++) e += mins[r] * xs[m * nb + r];
                y[m * ldy + n] = hsum(acc[m]) + e;
            }
        } else {
            for (int m = 0; m < MB; m++) y[m * ldy + n] = hsum(acc[m]);
        }
    }
}

static void tile_q8(int qtype, int mb, const uint8_t *w, int64_t nb, int64_t n0, int64_t n1,
                    const int8_t *xq, const float *xd, const float *xs, int64_t k, float *y,
                    int64_t ldy) {
    DISPATCH(rows_q8, w, nb, n0, n1, xq, xd, xs, k, y, ldy)
}

/* y [m, n] = x [m, k] @ W[n, k]^T through 8-bit activations (see above); y rows are ldy apart.
 * Returns 0, -1 (unknown type, K not a multiple of 32) or -2 (no scratch memory). */
int engine_gguf_matmul_q8(int qtype, const uint8_t *w, int64_t n, int64_t k, const float *x,
                          int64_t m, float *y, int64_t ldy) {
    if ((qtype != Q4_0 && qtype != Q4_1 && qtype != Q8_0) || k % 32 != 0) return -1;
    const int64_t nb = k / 32;
    int8_t *xq = (int8_t *)malloc((size_t)(m * k) + 2 * sizeof(float) * (size_t)(m * nb) + 64);
    if (!xq) return -2;
    float *xd = (float *)(((uintptr_t)(xq + m * k) + 63) & ~(uintptr_t)63);
    float *xs = xd + m * nb;
#pragma omp parallel for schedule(static) if (m > 8)
    for (int64_t r = 0; r < m; r++) quantize_row_q8(x + r * k, k, xq + r * k, xd + r * nb,
                                                     xs + r * nb, NULL);
    const int64_t tiles = (n + ROW_TILE - 1) / ROW_TILE;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n0 = t * ROW_TILE, n1 = n0 + ROW_TILE < n ? n0 + ROW_TILE : n;
        for (int64_t r = 0; r < m; r += MAX_MB) {
            const int mb = (int)(m - r < MAX_MB ? m - r : MAX_MB);
            tile_q8(qtype, mb, w, nb, n0, n1, xq + r * k, xd + r * nb, xs + r * nb, k,
                    y + r * ldy, ldy);
        }
    }
    free(xq);
    return 0;
}

/* A fused layer whose shards came in different packed types, as one matmul of the common
 * signature: ``nparts`` (in place of a type) parts described by ``table`` (in place of the
 * weight): per part, int64 {column offset, columns, kernel address, type, weight address}; each
 * part's kernel writes its columns of y. */
typedef int (*part_fn)(int qtype, const uint8_t *w, int64_t n, int64_t k, const float *x,
                       int64_t m, float *y, int64_t ldy);

int engine_gguf_matmul_parts(int nparts, const uint8_t *table, int64_t n, int64_t k,
                             const float *x, int64_t m, float *y, int64_t ldy) {
    const int64_t *t = (const int64_t *)table;
    (void)n;
    for (int i = 0; i < nparts; i++, t += 5) {
        const int rc = ((part_fn)(intptr_t)t[2])((int)t[3], (const uint8_t *)(intptr_t)t[4],
                                                 t[1], k, x, m, y + t[0], ldy);
        if (rc) return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Panels: the integer path over weights repacked at load (AVX512-VNNI only; see
 * engine_gguf_panel_path). A panel is PANEL = 16 consecutive weight rows; its blocks are
 * stored one after another, each block holding the 16 rows' codes interleaved so that one
 * 512-bit register carries 4 consecutive codes of every row (row j in 32-bit lane j):
 *   Q4_0 / Q4_1: 4 x 64 bytes of nibbles, register t: low nibbles codes 8t..8t+3, high nibbles
 *                codes 8t+4..8t+7 of each row; then 16 fp16 scales d, then (Q4_1) 16 fp16 m;
 *   Q8_0:        8 x 64 bytes, register s: codes 4s..4s+3 of each row plus 128 (unsigned);
 *                then 16 fp16 scales.
 * One dpbusd per 4 codes of 16 rows, with an activation row's 4 int8 codes broadcast, leaves
 * each lane's block dot product, exact, in 8 steps; the zero points fold in as integers:
 *   Q4_0: <q - 8, x> = <q, x> - 8 sum(x)        Q8_0: <w, x> = <w + 128, x> - 128 sum(x)
 * and each block adds cvt(dot) * (d_w d_x) (+ m s_x for Q4_1) to its row's float sum, block
 * by block in order. Every output is computed by that fixed sequence whatever the batch, so a
 * row's result never depends on the other rows. Rows past n (padding of the last panel) have
 * zero scales and are never stored. */

#if WIDE
#define PANEL 16
#define PANEL_MR 8 /* activation rows per register-blocked pass */

static inline int panel_block_bytes(int qtype) {
    return qtype == Q4_1 ? 320 : qtype == Q4_0 ? 288 : 544;
}

static inline int panel_codes_bytes(int qtype) { return qtype == Q8_0 ? 512 : 256; }

/* One row of activations -> int16 codes q [k] per block of 32 (d = max|x| / 32767, q =
 * round(x / d)), d, d * sum(q) in s and sum(q) in si: the activations of the 16-bit products
 * (the logits head's; their rounding is ~1e-5 of a block's largest value). */
static void quantize_row_q16(const float *x, int64_t k, int16_t *q, float *d, float *s,
                             int32_t *si) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / 32; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
        const float am = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0),
                                                            _mm512_andnot_ps(sign, v1)));
        /* a NaN or an infinity: scale NaN, so the block's products are NaN (as float32's) */
        const int bad = _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) |
                        _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q) || !(am <= FLT_MAX);
        const float db = bad ? NAN : am / 32767.0f;
        const float id = !bad && am > 0.0f ? 32767.0f / am : 0.0f;
        const __m512 mul = _mm512_set1_ps(id);
        const int r = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        const __m512i i0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v0, mul), r));
        const __m512i i1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v1, mul), r));
        _mm256_storeu_si256((__m256i *)(q + b * 32), _mm512_cvtsepi32_epi16(i0));
        _mm256_storeu_si256((__m256i *)(q + b * 32 + 16), _mm512_cvtsepi32_epi16(i1));
        const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        d[b] = db;
        s[b] = db * (float)sum;
        si[b] = sum;
    }
}

/* dot + step s's codes (4 a row, unsigned bytes of each 32-bit lane) times the activation row's
 * codes 4s..4s+3 at xa: int8 activations (A16 0) by one dpbusd; int16 (A16 1) by two dpwssd on
 * the codes widened to 16-bit pairs (c0: codes 0 and 1 of each lane, c1: codes 2 and 3). */
static inline __attribute__((always_inline)) __m512i panel_step(int A16, __m512i dot,
                                                                __m512i c, __m512i c0,
                                                                __m512i c1, const void *xa) {
    if (!A16) return dpbusd_4(dot, c, xa);
    return dpwssd_4(dpwssd_4(dot, c0, xa), c1, (const char *)xa + 4);
}

/* The 16 rows of a panel against MR activation rows (int8 codes, or int16 with A16) from xa
 * (row m at element m * k), their per-block scales xd, d * sums xs and sums xi. */
static inline __attribute__((always_inline)) void panel_rows(int qtype, int A16, int MR,
                                                             const uint8_t *pan, int64_t nb,
                                                             const void *xa, const float *xd,
                                                             const float *xs, const int32_t *xi,
                                                             int64_t k, float *y, int64_t ldy,
                                                             __mmask16 cols) {
    const int pb = panel_block_bytes(qtype), cb = panel_codes_bytes(qtype), es = A16 ? 2 : 1;
    const int zp = qtype == Q4_0 ? -8 : qtype == Q8_0 ? -128 : 0;
    const __m512i nib = _mm512_set1_epi8(0x0F);
    /* per 32-bit lane [b0 b1 b2 b3] -> int16 pairs (b0, b1) and (b2, b3), zero-extended */
    const __m512i w01 = _mm512_set4_epi32((int)0x800d800c, (int)0x80098008, (int)0x80058004,
                                          (int)0x80018000);
    const __m512i w23 = _mm512_set4_epi32((int)0x800f800e, (int)0x800b800a, (int)0x80078006,
                                          (int)0x80038002);
    const char *x0 = (const char *)xa;
    __m512 acc[PANEL_MR];
    for (int m = 0; m < MR; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = pan + b * pb;
        __m512i dot[PANEL_MR];
        for (int m = 0; m < MR; m++)
            dot[m] = zp ? _mm512_set1_epi32(zp * xi[m * nb + b]) : _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {
            __m512i c;
            if (qtype == Q8_0) {
                c = _mm512_loadu_si512((const void *)(blk + 64 * s));
            } else {
                const __m512i z = _mm512_loadu_si512((const void *)(blk + 64 * (s / 2)));
                c = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(z, 4) : z, nib);
            }
            const __m512i c0 = A16 ? _mm512_shuffle_epi8(c, w01) : c;
            const __m512i c1 = A16 ? _mm512_shuffle_epi8(c, w23) : c;
            for (int m = 0; m < MR; m++)
                dot[m] = panel_step(A16, dot[m], c, c0, c1,
                                    x0 + es * (m * k + b * 32 + 4 * s));
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + cb)));
        if (qtype == Q4_1) {
            const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + cb + 32)));
            for (int m = 0; m < MR; m++) {
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[m]),
                                         _mm512_mul_ps(dw, _mm512_set1_ps(xd[m * nb + b])), acc[m]);
                acc[m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xs[m * nb + b]), acc[m]);
            }
        } else {
            for (int m = 0; m < MR; m++)
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[m]),
                                         _mm512_mul_ps(dw, _mm512_set1_ps(xd[m * nb + b])), acc[m]);
        }
    }
    for (int m = 0; m < MR; m++) _mm512_mask_storeu_ps(y + m * ldy, cols, acc[m]);
}

#define PANEL_DISPATCH_MR(QT, A16, ...)                                                     \
    switch (mr) {                                                                            \
    case 1: panel_rows(QT, A16, 1, __VA_ARGS__); break;                                      \
    case 2: panel_rows(QT, A16, 2, __VA_ARGS__); break;                                      \
    case 3: panel_rows(QT, A16, 3, __VA_ARGS__); break;                                      \
    case 4: panel_rows(QT, A16, 4, __VA_ARGS__); break;                                      \
    case 5: panel_rows(QT, A16, 5, __VA_ARGS__); break;                                      \
    case 6: panel_rows(QT, A16, 6, __VA_ARGS__); break;                                      \
    case 7: panel_rows(QT, A16, 7, __VA_ARGS__); break;                                      \
    default: panel_rows(QT, A16, 8, __VA_ARGS__); break;                                     \
    }

#define PANEL_DISPATCH(A16)                                                                 \
    if (qtype == Q4_1) {                                                                     \
        PANEL_DISPATCH_MR(Q4_1, A16, pan, nb, xa, xd, xs, xi, k, y, ldy, cols)               \
    } else if (qtype == Q4_0) {                                                              \
        PANEL_DISPATCH_MR(Q4_0, A16, pan, nb, xa, xd, xs, xi, k, y, ldy, cols)               \
    } else {                                                                                 \
        PANEL_DISPATCH_MR(Q8_0, A16, pan, nb, xa, xd, xs, xi, k, y, ldy, cols)               \
    }

static void panel_tile(int qtype, int a16, int mr, const uint8_t *pan, int64_t nb,
                       const void *xa, const float *xd, const float *xs, const int32_t *xi,
                       int64_t k, float *y, int64_t ldy, __mmask16 cols) {
    if (a16) {
        PANEL_DISPATCH(1)
    } else {
        PANEL_DISPATCH(0)
    }
}
#endif

/* 1 where the panel kernels were compiled (AVX512-VNNI), else 0. */
int engine_gguf_panel_path(void) { return WIDE; }

/* kquants.c's panel forms (Q4_K, Q5_K, Q6_K), behind the two entry points below. */
int64_t engine_gguf_kq_panel_bytes(int qtype, int64_t n, int64_t k);
int engine_gguf_kq_repack(int qtype, uint8_t *w, int64_t n, int64_t k, uint8_t *pan,
                          int to_panels);

/* Bytes of the panel form of an [n, k] weight of qtype, either family (0 where there is
 * none). */
int64_t engine_gguf_panel_bytes(int qtype, int64_t n, int64_t k) {
    if (qtype >= KQ_FIRST && qtype <= KQ_LAST) return engine_gguf_kq_panel_bytes(qtype, n, k);
#if WIDE
    if ((qtype != Q4_0 && qtype != Q4_1 && qtype != Q8_0) || k % 32 != 0) return 0;
    return (n + PANEL - 1) / PANEL * (k / 32) * panel_block_bytes(qtype);
#else
    (void)qtype, (void)n, (void)k;
    return 0;
#endif
}

/* One row's block (GGUF bytes at blk; NULL: a padding row) into lane j of a panel's block p
 * (to_panels), or back out of it. */
static void panel_row(int qtype, uint8_t *p, int j, uint8_t *blk, int to_panels) {
#if WIDE
    /* 32-bit words: a Q8_0 register s holds codes 4s..4s+3 (+ 128); a Q4 register t holds
     * codes 8t..8t+3 (low nibbles) and 8t+4..8t+7 (high). GGUF nibble byte e holds code e (low)
     * and code e + 16 (high), so with words A, B, C, D = nibble bytes 0-3, 4-7, 8-11, 12-15:
     * t0 = lo(A) | lo(B) << 4, t1 = lo(C) | lo(D) << 4, t2 = hi(A) | hi(B) << 4, t3 = hi(C) |
     * hi(D) << 4. */
    const uint32_t lo = 0x0F0F0F0Fu, hi = 0xF0F0F0F0u, flip = 0x80808080u;
    const int cb = panel_codes_bytes(qtype), off = qtype == Q4_1 ? 4 : 2;
    uint32_t v[8];
    if (to_panels) {
        if (qtype == Q8_0) {
            for (int r = 0; r < 8; r++) v[r] = flip; /* padding: zero codes */
            if (blk) memcpy(v, blk + 2, 32);
            for (int r = 0; r < 8; r++) v[r] ^= blk ? flip : 0;
        } else {
            uint32_t w[4] = {0, 0, 0, 0};
            if (blk) memcpy(w, blk + off, 16);
            v[0] = (w[0] & lo) | (w[1] & lo) << 4, v[1] = (w[2] & lo) | (w[3] & lo) << 4;
            v[2] = (w[0] >> 4 & lo) | (w[1] & hi), v[3] = (w[2] >> 4 & lo) | (w[3] & hi);
        }
        for (int r = 0; r < (qtype == Q8_0 ? 8 : 4); r++) memcpy(p + 64 * r + 4 * j, v + r, 4);
        for (int i = 0; i < off; i++) /* d (and Q4_1's m) as fp16 bytes; zeros for padding */
            p[cb + 32 * (i / 2) + 2 * j + i % 2] = blk ? blk[i] : 0;
        return;
    }
    for (int r = 0; r < (qtype == Q8_0 ? 8 : 4); r++) memcpy(v + r, p + 64 * r + 4 * j, 4);
    if (qtype == Q8_0) {
        for (int r = 0; r < 8; r++) v[r] ^= flip;
        memcpy(blk + 2, v, 32);
    } else {
        const uint32_t w[4] = {(v[0] & lo) | (v[2] << 4 & hi), (v[0] >> 4 & lo) | (v[2] & hi),
                               (v[1] & lo) | (v[3] << 4 & hi), (v[1] >> 4 & lo) | (v[3] & hi)};
        memcpy(blk + off, w, 16);
    }
    for (int i = 0; i < off; i++) blk[i] = p[cb + 32 * (i / 2) + 2 * j + i % 2];
#else
    (void)qtype, (void)p, (void)j, (void)blk, (void)to_panels;
#endif
}

/* The shared driver of kquants.c: every row's blocks into (or out of) their panels. */
int engine_gguf_repack_rows(int qtype, uint8_t *w, int64_t n, int64_t nb, int bb, int pb,
                            uint8_t *pan, int to_panels,
                            void (*row)(int, uint8_t *, int, uint8_t *, int));

/* GGUF blocks w [n, k] of qtype (either family) <-> the panel form pan
 * (engine_gguf_panel_bytes bytes; to_panels: w -> pan). Returns 0, or -1 (no panel form). */
int engine_gguf_repack(int qtype, uint8_t *w, int64_t n, int64_t k, uint8_t *pan,
                       int to_panels) {
    if (qtype >= KQ_FIRST && qtype <= KQ_LAST)
        return engine_gguf_kq_repack(qtype, w, n, k, pan, to_panels);
#if WIDE
    if (!engine_gguf_panel_bytes(qtype, n, k)) return -1;
    return engine_gguf_repack_rows(qtype, w, n, k / 32, block_bytes(qtype),
                                   panel_block_bytes(qtype), pan, to_panels, panel_row);
#else
    (void)qtype, (void)w, (void)n, (void)k, (void)pan, (void)to_panels;
    return -1;
#endif
}

/* y [m, n] = x [m, k] @ W^T from W's panel form (engine_gguf_repack), the activations
 * quantized per block of 32 to int8 (a16 0) or int16 (a16 1). */
static int panel_matmul(int qtype, int a16, const uint8_t *w, int64_t n, int64_t k,
                        const float *x, int64_t m, float *y, int64_t ldy) {
#if WIDE
    if (!engine_gguf_panel_bytes(qtype, n, k)) return -1;
    const int64_t nb = k / 32, panels = (n + PANEL - 1) / PANEL;
    const int pb = panel_block_bytes(qtype), es = a16 ? 2 : 1;
    char *xa = (char *)malloc((size_t)(m * k * es) + 3 * 4 * (size_t)(m * nb) + 64);
    if (!xa) return -2;
    float *xd = (float *)(((uintptr_t)(xa + m * k * es) + 63) & ~(uintptr_t)63);
    float *xs = xd + m * nb;
    int32_t *xi = (int32_t *)(xs + m * nb);
#pragma omp parallel for schedule(static) if (m > 8)
    for (int64_t r = 0; r < m; r++) {
        if (a16)
            quantize_row_q16(x + r * k, k, (int16_t *)xa + r * k, xd + r * nb, xs + r * nb,
                             xi + r * nb);
        else
            quantize_row_q8(x + r * k, k, (int8_t *)xa + r * k, xd + r * nb, xs + r * nb,
                            xi + r * nb);
    }
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        const int64_t n0 = p * PANEL;
        const __mmask16 cols = n - n0 >= PANEL ? (__mmask16)0xFFFF
                                               : (__mmask16)((1u << (n - n0)) - 1);
        for (int64_t r = 0; r < m; r += PANEL_MR) {
            const int mr = (int)(m - r < PANEL_MR ? m - r : PANEL_MR);
            panel_tile(qtype, a16, mr, w + p * nb * pb, nb, xa + r * k * es, xd + r * nb,
                       xs + r * nb, xi + r * nb, k, y + r * ldy + n0, ldy, cols);
        }
    }
    free(xa);
    return 0;
#else
    (void)qtype, (void)a16, (void)w, (void)n, (void)k, (void)x, (void)m, (void)y, (void)ldy;
    return -1;
#endif
}

/* The 8-bit-activation product from the panel form: the arguments of engine_gguf_matmul_q8.
 * Returns 0, -1 (no panel form) or -2 (no memory). */
int engine_gguf_panel_q8(int qtype, const uint8_t *w, int64_t n, int64_t k, const float *x,
                         int64_t m, float *y, int64_t ldy) {
    return panel_matmul(qtype, 0, w, n, k, x, m, y, ldy);
}

/* The same with 16-bit activations (the logits head of a model served with 8-bit ones). */
int engine_gguf_panel_q16(int qtype, const uint8_t *w, int64_t n, int64_t k, const float *x,
                          int64_t m, float *y, int64_t ldy) {
    return panel_matmul(qtype, 1, w, n, k, x, m, y, ldy);
}
