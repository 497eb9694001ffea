/* Matrix products straight from GGML K-quant weights (x86-64, AVX2; AVX-VNNI / AVX512-VNNI when
 * the compiler targets them).
 *
 * W [N, K] is stored as GGML rows of 256-value super-blocks (K a multiple of 256). Layouts, as
 * ggml and the gguf package's quants.py read them (d, dmin: fp16):
 *   Q2_K  84 B: scales[16] (4-bit scale | 4-bit min << 4), qs[64] (2 bits), d, dmin
 *               value = d * sc * q - dmin * m                       (16-value sub-blocks)
 *   Q3_K 110 B: hmask[32], qs[64] (low 2 bits), scales[12] (16 x 6 bits), d
 *               value = d * (sc - 32) * (q_low - (hbit ? 0 : 4))   (16-value sub-blocks)
 *   Q4_K 144 B: d, dmin, scales[12] (8 x 6-bit scale, 8 x 6-bit min), qs[128] (4 bits)
 *               value = d * sc * q - dmin * m                       (32-value sub-blocks)
 *   Q5_K 176 B: d, dmin, scales[12], qh[32] (fifth bit), qs[128]     (as Q4_K, q has 5 bits)
 *   Q6_K 210 B: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d
 *               value = d * sc * (q - 32)                           (16-value sub-blocks)
 *
 * Every super-block unpacks to eight vectors of 32 unsigned codes in value order (vector g holds
 * values 32g..32g+31) and a vector of 16-bit scales. Activations are quantized the way llama.cpp
 * does (Q8_K): per row and super-block a float scale, 256 int8 values and the sums of each 16,
 * which give the K-quant minimums (and the offsets of Q3_K / Q6_K) as one small integer product.
 * The per-super-block dot products are integer (exact), then scaled and accumulated in float32
 * vector lanes (a fixed order per output: its super-blocks in turn, then the lanes).
 *
 * Threads split the rows of W only (never the reduction) and each activation row is quantized on
 * its own, so an output row never depends on the other rows of the batch.
 *
 * The library is built with -std=c11 (no floating-point contraction), which the dequantizer
 * relies on to round exactly like the gguf package (a product, then a difference).
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "panel_ops.h"

enum { Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14 }; /* GGML type ids */

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define KQ_PATH 2
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define DPWSSD(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#elif defined(__AVXVNNI__)
#define KQ_PATH 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#else
#define KQ_PATH 0
#endif

#define KQ_ROW_TILE 8 /* weight rows per task */
#define KQ_MAX_MB 4   /* activation rows per register-blocked pass */
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* One activation super-block, Q8_K style: x ~= d * qs. */
typedef struct {
    int8_t qs[256];
    int16_t bsums[16];   /* sums of each 16 values, even groups first: 0, 2, .., 14, 1, 3, .. 15 */
    int16_t bsums32[16]; /* sums of each 32 values (8), then zeros */
    float d;
    float pad[7];
} q8k;

/* One unpacked weight super-block. */
typedef struct {
    __m256i q[8]; /* unsigned codes; vector g = values 32g .. 32g+31 */
    __m256i sc;   /* int16 scales: lane position g is the scale of vector g's lane (below) */
    __m256i mn;   /* int16 weights of the activation group sums (minimums / offsets) */
    float d, dmin;
} kblock;
/* Scales: for 32-value sub-blocks (Q4_K, Q5_K) both 128-bit lanes hold sc0..sc7; for 16-value
 * sub-blocks (Q2_K, Q3_K, Q6_K) a vector's lanes are two sub-blocks (2g and 2g+1), so the low
 * lane holds the even sub-blocks' scales and the high lane the odd ones' (matching bsums). */

static ALWAYS_INLINE int kq_block_bytes(int t) {
    return t == Q2_K ? 84 : t == Q3_K ? 110 : t == Q4_K ? 144 : t == Q5_K ? 176 : 210;
}

static ALWAYS_INLINE float kq_f16(const uint8_t *p) {
    return _cvtsh_ss((uint16_t)(p[0] | (p[1] << 8)));
}

/* Q4_K / Q5_K: the 12 bytes of 6-bit scales and minimums -> sc0..sc7, m0..m7 (16 bytes). */
static ALWAYS_INLINE void kq_scale_min_k4(const uint8_t *s, uint32_t u[4]) {
    memcpy(u, s, 12);
    const uint32_t m03 = u[1] & 0x3f3f3f3fu;
    u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = m03;
    u[0] &= 0x3f3f3f3fu;
}

/* Q3_K: the 12 bytes of 6-bit scales -> 16 bytes of (scale + 32). */
static ALWAYS_INLINE void kq_scales_q3(const uint8_t *s, uint32_t a[4]) {
    memcpy(a, s, 12);
    const uint32_t t = a[2];
    a[2] = ((a[0] >> 4) & 0x0f0f0f0fu) | (((t >> 4) & 0x03030303u) << 4);
    a[3] = ((a[1] >> 4) & 0x0f0f0f0fu) | (((t >> 6) & 0x03030303u) << 4);
    a[0] = (a[0] & 0x0f0f0f0fu) | ((t & 0x03030303u) << 4);
    a[1] = (a[1] & 0x0f0f0f0fu) | (((t >> 2) & 0x03030303u) << 4);
}

/* 16 int8 scales in sub-block order -> int16 [even sub-blocks | odd sub-blocks]. */
static ALWAYS_INLINE __m256i kq_even_odd(__m128i s8, int is_signed) {
    const __m128i eo = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i v = _mm_shuffle_epi8(s8, eo);
    return is_signed ? _mm256_cvtepi8_epi16(v) : _mm256_cvtepu8_epi16(v);
}

/* Bit `from` of each byte of v (only that bit may be set) moved to bit `to`. */
#define KQ_MOVE_BIT(v, from, to)                                                              \
    ((from) < (to) ? _mm256_slli_epi16(v, (to) - (from))                                      \
                   : (from) > (to) ? _mm256_srli_epi16(v, (from) - (to)) : (v))

static ALWAYS_INLINE void kq_unpack(int T, const uint8_t *b, kblock *kb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
    if (T == Q4_K || T == Q5_K) {
        kb->d = kq_f16(b);
        kb->dmin = kq_f16(b + 2);
        uint32_t u[4];
        kq_scale_min_k4(b + 4, u);
        const __m128i sm = _mm_loadu_si128((const __m128i *)u);
        kb->sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        kb->mn = _mm256_zextsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)));
        const uint8_t *qs = b + (T == Q4_K ? 16 : 48);
        for (int h = 0; h < 4; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            kb->q[2 * h] = _mm256_and_si256(v, m4);
            kb->q[2 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        if (T == Q5_K) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
#define KQ_Q5_HIGH(g)                                                                         \
    kb->q[g] = _mm256_or_si256(                                                               \
        kb->q[g], KQ_MOVE_BIT(_mm256_and_si256(qh, _mm256_set1_epi8((char)(1 << (g)))), g, 4))
            KQ_Q5_HIGH(0); KQ_Q5_HIGH(1); KQ_Q5_HIGH(2); KQ_Q5_HIGH(3);
            KQ_Q5_HIGH(4); KQ_Q5_HIGH(5); KQ_Q5_HIGH(6); KQ_Q5_HIGH(7);
#undef KQ_Q5_HIGH
        }
    } else if (T == Q6_K) {
        const __m256i m30 = _mm256_set1_epi8(0x30);
        kb->d = kq_f16(b + 208);
        kb->dmin = 0.0f;
        const __m128i s8 = _mm_loadu_si128((const __m128i *)(b + 192));
        kb->sc = kq_even_odd(s8, 1);
        kb->mn = _mm256_slli_epi16(kb->sc, 5); /* q - 32: offset 32 * sc per group sum */
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
            kb->q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            kb->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            kb->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                               _mm256_and_si256(qh, m30));
            kb->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
        }
    } else if (T == Q3_K) {
        kb->d = kq_f16(b + 108);
        kb->dmin = 0.0f;
        uint32_t a[4];
        kq_scales_q3(b + 96, a);
        const __m128i s8 = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)a), _mm_set1_epi8(32));
        kb->sc = kq_even_odd(s8, 1);
        kb->mn = _mm256_slli_epi16(kb->sc, 2); /* codes are q + 4: offset 4 * sc */
        const __m256i hm = _mm256_loadu_si256((const __m256i *)b);
#define KQ_Q3(g, v)                                                                           \
    kb->q[g] = _mm256_or_si256(                                                               \
        _mm256_and_si256(_mm256_srli_epi16(v, 2 * ((g) & 3)), m3),                            \
        KQ_MOVE_BIT(_mm256_and_si256(hm, _mm256_set1_epi8((char)(1 << (g)))), g, 2))
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(b + 32));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(b + 64));
        KQ_Q3(0, v0); KQ_Q3(1, v0); KQ_Q3(2, v0); KQ_Q3(3, v0);
        KQ_Q3(4, v1); KQ_Q3(5, v1); KQ_Q3(6, v1); KQ_Q3(7, v1);
#undef KQ_Q3
    } else { /* Q2_K */
        kb->d = kq_f16(b + 80);
        kb->dmin = kq_f16(b + 82);
        const __m128i s = _mm_loadu_si128((const __m128i *)b);
        const __m128i lo = _mm_set1_epi8(0x0F);
        kb->sc = kq_even_odd(_mm_and_si128(s, lo), 0);
        kb->mn = kq_even_odd(_mm_and_si128(_mm_srli_epi16(s, 4), lo), 0);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * h));
            kb->q[4 * h + 0] = _mm256_and_si256(v, m3);
            kb->q[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), m3);
            kb->q[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m3);
            kb->q[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), m3);
        }
    }
}

/* sum over the super-block of scale(sub-block) * code * activation, as 8 int32 partial sums. */
static ALWAYS_INLINE __m256i kq_idot(const kblock *kb, const int8_t *a) {
    __m256i isum = _mm256_setzero_si256();
#if KQ_PATH
    /* two vectors' 4-byte dot products packed to int16 (|.| <= 4 * 63 * 127), then one
     * 16-bit multiply-add with their scales */
    for (int p = 0; p < 4; p++) {
        const char c0 = (char)(4 * p), c1 = (char)(4 * p + 1), c2 = (char)(4 * p + 2),
                   c3 = (char)(4 * p + 3);
        const __m256i ctrl = _mm256_setr_epi8(c0, c1, c0, c1, c0, c1, c0, c1, c2, c3, c2, c3, c2,
                                              c3, c2, c3, c0, c1, c0, c1, c0, c1, c0, c1, c2, c3,
                                              c2, c3, c2, c3, c2, c3);
        const __m256i s0 = DPBUSD(_mm256_setzero_si256(), kb->q[2 * p],
                                  _mm256_loadu_si256((const __m256i *)(a + 64 * p)));
        const __m256i s1 = DPBUSD(_mm256_setzero_si256(), kb->q[2 * p + 1],
                                  _mm256_loadu_si256((const __m256i *)(a + 64 * p + 32)));
        isum = DPWSSD(isum, _mm256_packs_epi32(s0, s1), _mm256_shuffle_epi8(kb->sc, ctrl));
    }
#else
    for (int g = 0; g < 8; g++) {
        const __m256i ctrl = _mm256_set1_epi16((short)((2 * g) | ((2 * g + 1) << 8)));
        const __m256i p = _mm256_maddubs_epi16(kb->q[g],
                                               _mm256_loadu_si256((const __m256i *)(a + 32 * g)));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_shuffle_epi8(kb->sc, ctrl)));
    }
#endif
    return isum;
}

/* The super-block's contribution to one output. Its integer sums are reduced to one integer
 * each before any rounding, so the result does not depend on how the dot-product path spreads
 * them over vector lanes (the AVX2 and VNNI builds agree bit for bit). */
/* acc + the super-block's contribution to one output (8 float partial sums). */
static ALWAYS_INLINE __m256 kq_block_dot(int T, const kblock *kb, const q8k *a, __m256 acc) {
    __m256i isum = kq_idot(kb, a->qs);
    if (T == Q3_K || T == Q6_K) { /* signed levels: subtract offset * scale * group sum */
        isum = _mm256_sub_epi32(
            isum, _mm256_madd_epi16(kb->mn, _mm256_loadu_si256((const __m256i *)a->bsums)));
        return _mm256_fmadd_ps(_mm256_set1_ps(kb->d * a->d), _mm256_cvtepi32_ps(isum), acc);
    }
    const __m256i msum = _mm256_madd_epi16( /* the minimums: dmin * m * group sum */
        kb->mn, _mm256_loadu_si256((const __m256i *)(T == Q2_K ? a->bsums : a->bsums32)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(kb->d * a->d), _mm256_cvtepi32_ps(isum), acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(-(kb->dmin * a->d)), _mm256_cvtepi32_ps(msum), acc);
}

static ALWAYS_INLINE float kq_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rows [n0, n1) of W against MB activation rows (quantized, nb super-blocks each). MB is a
 * constant at every call site, so the accumulators live in registers. */
static ALWAYS_INLINE void kq_rows(int T, int MB, const uint8_t *w, int64_t nb, int64_t n0,
                                  int64_t n1, const q8k *xq, float *y, int64_t ldy) {
    const int64_t bb = kq_block_bytes(T);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w + n * nb * bb;
        __m256 acc[KQ_MAX_MB];
        for (int m = 0; m < MB; m++) acc[m] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            kblock kb;
            kq_unpack(T, row + b * bb, &kb);
            for (int m = 0; m < MB; m++) acc[m] = kq_block_dot(T, &kb, xq + m * nb + b, acc[m]);
        }
        for (int m = 0; m < MB; m++) y[m * ldy + n] = kq_hsum(acc[m]);
    }
}

#define KQ_DISPATCH_MB(T)                                                                     \
    switch (mb) {                                                                             \
    case 1: kq_rows(T, 1, w, nb, n0, n1, xq, y, ldy); break;                                  \
    case 2: kq_rows(T, 2, w, nb, n0, n1, xq, y, ldy); break;                                  \
    case 3: kq_rows(T, 3, w, nb, n0, n1, xq, y, ldy); break;                                  \
    default: kq_rows(T, 4, w, nb, n0, n1, xq, y, ldy); break;                                 \
    }

static void kq_tile(int qtype, int mb, const uint8_t *w, int64_t nb, int64_t n0, int64_t n1,
                    const q8k *xq, float *y, int64_t ldy) {
    switch (qtype) {
    case Q2_K: KQ_DISPATCH_MB(Q2_K) break;
    case Q3_K: KQ_DISPATCH_MB(Q3_K) break;
    case Q4_K: KQ_DISPATCH_MB(Q4_K) break;
    case Q5_K: KQ_DISPATCH_MB(Q5_K) break;
    default: KQ_DISPATCH_MB(Q6_K) break;
    }
}

/* One activation super-block (256 floats) -> Q8_K: d = max|x| / 127, qs = round(x / d). */
static void kq_quantize_block(const float *x, q8k *o) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int i = 0; i < 32; i++) {
        const __m256 v = _mm256_loadu_ps(x + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float am = _mm_cvtss_f32(m);
    memset(o->bsums32, 0, sizeof o->bsums32);
    if (!(am > 0.0f) || !(am <= FLT_MAX) || _mm256_movemask_ps(nan)) {
        /* all zero: d = 0; a NaN or an infinity: d = NaN, so the products are NaN too */
        memset(o->qs, 0, sizeof o->qs);
        memset(o->bsums, 0, sizeof o->bsums);
        o->d = am == 0.0f && !_mm256_movemask_ps(nan) ? 0.0f : NAN;
        return;
    }
    o->d = am / 127.0f;
    const __m256 id = _mm256_set1_ps(127.0f / am);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i quads[8];
    for (int i = 0; i < 8; i++) {
        const float *xi = x + 32 * i;
        const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xi), id));
        const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xi + 8), id));
        const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xi + 16), id));
        const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xi + 24), id));
        __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        q = _mm256_permutevar8x32_epi32(q, perm);
        _mm256_storeu_si256((__m256i *)(o->qs + 32 * i), q);
        /* sums of each 4 values: int32 0..3 cover values 0..15, 4..7 values 16..31 */
        quads[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
    }
    /* -> [groups 0, 2, 4, 6 | 1, 3, 5, 7] and [8, 10, 12, 14 | 9, 11, 13, 15] */
    const __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(quads[0], quads[1]),
                                         _mm256_hadd_epi32(quads[2], quads[3]));
    const __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(quads[4], quads[5]),
                                         _mm256_hadd_epi32(quads[6], quads[7]));
    const __m256i eo = _mm256_packs_epi32(g0, g1); /* even groups | odd groups (int16) */
    _mm256_storeu_si256((__m256i *)o->bsums, eo);
    _mm_storeu_si128((__m128i *)o->bsums32,
                     _mm_add_epi16(_mm256_castsi256_si128(eo), _mm256_extracti128_si256(eo, 1)));
}

static int kq_known(int qtype) { return qtype >= Q2_K && qtype <= Q6_K; }

/* Which integer dot-product path was compiled: 2 AVX512-VNNI, 1 AVX-VNNI, 0 AVX2. */
int engine_gguf_kq_path(void) { return KQ_PATH; }

/* y [m, n] (row stride ldy) = x [m, k] @ W[n, k]^T. Returns 0; -1 for an unknown type, K not a
 * multiple of 256 or a bad size; -2 when scratch memory cannot be had. */
int engine_gguf_kq_matmul_ld(int qtype, const uint8_t *w, int64_t n, int64_t k, const float *x,
                             int64_t m, float *y, int64_t ldy) {
    if (!kq_known(qtype) || k <= 0 || k % 256 != 0 || n < 0 || m < 0 || ldy < n) return -1;
    if (m == 0 || n == 0) return 0;
    const int64_t nb = k / 256;
    const size_t bytes = (sizeof(q8k) * (size_t)(m * nb) + 63) & ~(size_t)63;
    q8k *xq = (q8k *)aligned_alloc(64, bytes);
    if (!xq) return -2;
#pragma omp parallel for schedule(static) if (m * nb >= 64)
    for (int64_t i = 0; i < m * nb; i++) kq_quantize_block(x + i * 256, xq + i);
    const int64_t tiles = (n + KQ_ROW_TILE - 1) / KQ_ROW_TILE;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n0 = t * KQ_ROW_TILE, n1 = n0 + KQ_ROW_TILE < n ? n0 + KQ_ROW_TILE : n;
        for (int64_t r = 0; r < m; r += KQ_MAX_MB) {
            const int mb = (int)(m - r < KQ_MAX_MB ? m - r : KQ_MAX_MB);
            kq_tile(qtype, mb, w, nb, n0, n1, xq + r * nb, y + r * ldy, ldy);
        }
    }
    free(xq);
    return 0;
}

int engine_gguf_kq_matmul(int qtype, const uint8_t *w, int64_t n, int64_t k, const float *x,
                          int64_t m, float *y) {
    return engine_gguf_kq_matmul_ld(qtype, w, n, k, x, m, y, n);
}

/* Scales (and minimums) of one super-block in sub-block order, as floats the way the gguf
 * package computes them: dl = d * sc, ml = dmin * m (float32 products). Returns the number of
 * sub-blocks (16 or 8). */
static int kq_float_scales(int T, const uint8_t *b, float dl[16], float ml[16]) {
    if (T == Q4_K || T == Q5_K) {
        const float d = kq_f16(b), dmin = kq_f16(b + 2);
        uint32_t u[4];
        kq_scale_min_k4(b + 4, u);
        const uint8_t *s = (const uint8_t *)u;
        for (int j = 0; j < 8; j++) {
            dl[j] = d * (float)s[j];
            ml[j] = dmin * (float)s[8 + j];
        }
        return 8;
    }
    if (T == Q6_K) {
        const float d = kq_f16(b + 208);
        for (int j = 0; j < 16; j++) {
            dl[j] = d * (float)(int8_t)b[192 + j];
            ml[j] = 0.0f;
        }
    } else if (T == Q3_K) {
        const float d = kq_f16(b + 108);
        uint32_t a[4];
        kq_scales_q3(b + 96, a);
        const uint8_t *s = (const uint8_t *)a;
        for (int j = 0; j < 16; j++) {
            dl[j] = d * (float)((int)s[j] - 32);
            ml[j] = 0.0f;
        }
    } else {
        const float d = kq_f16(b + 80), dmin = kq_f16(b + 82);
        for (int j = 0; j < 16; j++) {
            dl[j] = d * (float)(b[j] & 0x0F);
            ml[j] = dmin * (float)(b[j] >> 4);
        }
    }
    return 16;
}

static ALWAYS_INLINE void kq_dequantize_row(int T, const uint8_t *row, int64_t nb, float *out) {
    const int64_t bb = kq_block_bytes(T);
    /* codes -> signed levels: Q3_K codes are q + 4, Q6_K codes q + 32 */
    const __m256i off = _mm256_set1_epi32(T == Q3_K ? 4 : T == Q6_K ? 32 : 0);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bb;
        kblock kb;
        kq_unpack(T, blk, &kb);
        float dl[16], ml[16];
        const int subs = kq_float_scales(T, blk, dl, ml);
        float *o = out + b * 256;
        for (int g = 0; g < 8; g++) {
            const __m128i lo = _mm256_castsi256_si128(kb.q[g]);
            const __m128i hi = _mm256_extracti128_si256(kb.q[g], 1);
            const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
            for (int t = 0; t < 4; t++) {
                const int sub = subs == 8 ? g : 2 * g + (t >> 1);
                const __m256 q = _mm256_cvtepi32_ps(
                    _mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[t]), off));
                __m256 v = _mm256_mul_ps(_mm256_set1_ps(dl[sub]), q);
                if (T == Q2_K || T == Q4_K || T == Q5_K)
                    v = _mm256_sub_ps(v, _mm256_set1_ps(ml[sub]));
                _mm256_storeu_ps(o + 32 * g + 8 * t, v);
            }
        }
    }
}

/* out [n, k] = the float32 values of W, as the gguf package's dequantizers compute them.
 * Returns 0, or -1 as engine_gguf_kq_matmul. */
int engine_gguf_kq_dequantize(int qtype, const uint8_t *w, int64_t n, int64_t k, float *out) {
    if (!kq_known(qtype) || k <= 0 || k % 256 != 0 || n < 0) return -1;
    const int64_t nb = k / 256, rb = nb * kq_block_bytes(qtype);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; r++) {
        switch (qtype) {
        case Q2_K: kq_dequantize_row(Q2_K, w + r * rb, nb, out + r * k); break;
        case Q3_K: kq_dequantize_row(Q3_K, w + r * rb, nb, out + r * k); break;
        case Q4_K: kq_dequantize_row(Q4_K, w + r * rb, nb, out + r * k); break;
        case Q5_K: kq_dequantize_row(Q5_K, w + r * rb, nb, out + r * k); break;
        default: kq_dequantize_row(Q6_K, w + r * rb, nb, out + r * k); break;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Panels (AVX512-VNNI only): Q4_K, Q5_K and Q6_K weights repacked at load, 16 rows a panel, as
 * kernels.c does for Q4_0/Q4_1/Q8_0. A panel's super-block (one after another along K) holds:
 *   NIB  2048 B: unit u (values 32u..32u+31) in 4 registers of 64 B; register t, row j in
 *                32-bit lane j, byte i: low nibble = code 32u+8t+i, high nibble = code
 *                32u+8t+4+i (low 4 bits of each code);
 *   HIGH Q5_K 512 B, unit u one register: byte (j, i) bit s = bit 4 of code 32u+4s+i;
 *        Q6_K 1024 B, unit u two registers v: byte (j, i) bits 2r..2r+1 = bits 4..5 of code
 *        32u+4(4v+r)+i;
 *   SC   Q4_K / Q5_K 8 x 16 B: scale of sub-block g (32 values) for row j (6 bits);
 *        Q6_K 16 x 16 B: scale of sub-block g (16 values), int8;
 *   MN   Q4_K / Q5_K 4 x 32 B: minimums m_2p, m_2p+1 of row j as two bytes;
 *   D    16 fp16 (d); DMIN (Q4_K / Q5_K) 16 fp16.
 * One dpbusd serves 4 codes of 16 rows (an activation row's 4 codes broadcast). Per output and
 * super-block the sums are exact integers, scales and minimums included:
 *   Q4_K / Q5_K: T = sum_g sc_g <q_g, x_g>, M = sum_g m_g sum(x_g);  y += T d d_x - M dmin d_x
 *   Q6_K:        T = sum_g sc_g (<q_g, x_g> - 32 sum(x_g));           y += T d d_x
 * super-block by super-block in order: a row's result never depends on the other rows. */

#if KQ_PATH == 2 && defined(__AVX512F__) && defined(__AVX512BW__)
#define KQ_PANELS 1
#define KP 16  /* rows a panel */
#define KP_MR 6 /* activation rows per register-blocked pass */

static int kp_high_bytes(int T) { return T == Q5_K ? 512 : T == Q6_K ? 1024 : 0; }
static int kp_sc_bytes(int T) { return T == Q6_K ? 256 : 128; }
static int kp_block_bytes(int T) {
    return 2048 + kp_high_bytes(T) + kp_sc_bytes(T) + (T == Q6_K ? 32 : 128 + 64);
}
static int kp_known(int T) { return T == Q4_K || T == Q5_K || T == Q6_K; }

/* One super-block's 256 codes (unsigned: Q6_K's are q + 32), scales, minimums and d, dmin as
 * their fp16 bytes. */
typedef struct {
    uint8_t q[256];
    uint8_t sc[16], mn[8];
    uint8_t d[2], dmin[2];
} kp_fields;

static void kp_decode(int T, const uint8_t *b, kp_fields *f) {
    if (T == Q6_K) {
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 32; j++) {
                const uint8_t l0 = b[64 * h + j], l1 = b[64 * h + 32 + j], qh = b[128 + 32 * h + j];
                f->q[128 * h + j] = (uint8_t)((l0 & 0x0F) | (qh & 3) << 4);
                f->q[128 * h + 32 + j] = (uint8_t)((l1 & 0x0F) | (qh >> 2 & 3) << 4);
                f->q[128 * h + 64 + j] = (uint8_t)((l0 >> 4) | (qh >> 4 & 3) << 4);
                f->q[128 * h + 96 + j] = (uint8_t)((l1 >> 4) | (qh >> 6 & 3) << 4);
            }
        memcpy(f->sc, b + 192, 16);
        f->d[0] = b[208], f->d[1] = b[209];
        return;
    }
    f->d[0] = b[0], f->d[1] = b[1], f->dmin[0] = b[2], f->dmin[1] = b[3];
    uint32_t u[4];
    kq_scale_min_k4(b + 4, u);
    memcpy(f->sc, u, 8);
    memcpy(f->mn, (const uint8_t *)u + 8, 8);
    const uint8_t *qs = b + (T == Q4_K ? 16 : 48);
    for (int h = 0; h < 4; h++)
        for (int j = 0; j < 32; j++) {
            f->q[64 * h + j] = qs[32 * h + j] & 0x0F;
            f->q[64 * h + 32 + j] = qs[32 * h + j] >> 4;
        }
    if (T == Q5_K)
        for (int v = 0; v < 256; v++) f->q[v] |= (uint8_t)((b[16 + v % 32] >> (v / 32) & 1) << 4);
}

static void kp_encode(int T, const kp_fields *f, uint8_t *b) {
    if (T == Q6_K) {
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 32; j++) {
                const uint8_t *q = f->q + 128 * h;
                b[64 * h + j] = (uint8_t)((q[j] & 0x0F) | (q[64 + j] & 0x0F) << 4);
                b[64 * h + 32 + j] = (uint8_t)((q[32 + j] & 0x0F) | (q[96 + j] & 0x0F) << 4);
                b[128 + 32 * h + j] = (uint8_t)((q[j] >> 4) | (q[32 + j] >> 4) << 2 |
                                                (q[64 + j] >> 4) << 4 | (q[96 + j] >> 4) << 6);
            }
        memcpy(b + 192, f->sc, 16);
        b[208] = f->d[0], b[209] = f->d[1];
        return;
    }
    b[0] = f->d[0], b[1] = f->d[1], b[2] = f->dmin[0], b[3] = f->dmin[1];
    for (int j = 0; j < 4; j++) { /* the inverse of kq_scale_min_k4 */
        b[4 + j] = (uint8_t)(f->sc[j] | (f->sc[j + 4] >> 4) << 6);
        b[8 + j] = (uint8_t)(f->mn[j] | (f->mn[j + 4] >> 4) << 6);
        b[12 + j] = (uint8_t)((f->sc[j + 4] & 0x0F) | (f->mn[j + 4] & 0x0F) << 4);
    }
    uint8_t *qs = b + (T == Q4_K ? 16 : 48);
    for (int h = 0; h < 4; h++)
        for (int j = 0; j < 32; j++)
            qs[32 * h + j] =
                (uint8_t)((f->q[64 * h + j] & 0x0F) | (f->q[64 * h + 32 + j] & 0x0F) << 4);
    if (T == Q5_K)
        for (int j = 0; j < 32; j++) {
            uint8_t h = 0;
            for (int g = 0; g < 8; g++) h |= (uint8_t)((f->q[32 * g + j] >> 4 & 1) << g);
            b[16 + j] = h;
        }
}

/* Row j's fields into (put) or out of (!put) a panel's super-block p. */
static void kp_place(int T, uint8_t *p, int j, kp_fields *f, int put) {
    const int hb = kp_high_bytes(T), sb = kp_sc_bytes(T);
    uint8_t *high = p + 2048, *sc = high + hb, *mn = sc + sb;
    uint8_t *d = T == Q6_K ? mn : mn + 128, *dmin = d + 32;
    for (int u = 0; u < 8; u++)
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 4; i++) {
                uint8_t *o = p + 64 * (4 * u + t) + 4 * j + i;
                uint8_t *a = f->q + 32 * u + 8 * t + i, *c = a + 4;
                if (put) {
                    *o = (uint8_t)((*a & 0x0F) | (*c & 0x0F) << 4);
                } else {
                    *a = *o & 0x0F;
                    *c = *o >> 4;
                }
            }
    for (int u = 0; u < 8; u++)
        for (int i = 0; i < 4; i++) {
            if (T == Q5_K) {
                uint8_t *o = high + 64 * u + 4 * j + i;
                if (put) *o = 0;
                for (int s = 0; s < 8; s++) {
                    uint8_t *q = f->q + 32 * u + 4 * s + i;
                    if (put) *o |= (uint8_t)((*q >> 4 & 1) << s);
                    else *q |= (uint8_t)((*o >> s & 1) << 4);
                }
            } else if (T == Q6_K) {
                for (int v = 0; v < 2; v++) {
                    uint8_t *o = high + 128 * u + 64 * v + 4 * j + i;
                    if (put) *o = 0;
                    for (int r = 0; r < 4; r++) {
                        uint8_t *q = f->q + 32 * u + 4 * (4 * v + r) + i;
                        if (put) *o |= (uint8_t)((*q >> 4 & 3) << (2 * r));
                        else *q |= (uint8_t)((*o >> (2 * r) & 3) << 4);
                    }
                }
            }
        }
    const int subs = T == Q6_K ? 16 : 8;
    for (int g = 0; g < subs; g++) {
        if (put) sc[16 * g + j] = f->sc[g];
        else f->sc[g] = sc[16 * g + j];
    }
    if (T != Q6_K)
        for (int g = 0; g < 8; g++) {
            uint8_t *o = mn + 32 * (g / 2) + 2 * j + g % 2;
            if (put) *o = f->mn[g];
            else f->mn[g] = *o;
        }
    for (int i = 0; i < 2; i++) {
        if (put) {
            d[2 * j + i] = f->d[i];
            if (T != Q6_K) dmin[2 * j + i] = f->dmin[i];
        } else {
            f->d[i] = d[2 * j + i];
            if (T != Q6_K) f->dmin[i] = dmin[2 * j + i];
        }
    }
}

/* Code vector of step s (codes 4s..4s+3 of each row) from the nibbles (lo / hi of register
 * s / 2) and, for Q5_K / Q6_K, the unit's high-bit registers h0, h1. */
static ALWAYS_INLINE __m512i kp_codes(int T, int s, __m512i nib, __m512i h0, __m512i h1) {
    if (T == Q5_K) {
        const __m512i h = s < 4 ? _mm512_slli_epi16(h0, 4 - s)
                          : s > 4 ? _mm512_srli_epi16(h0, s - 4) : h0;
        return _mm512_or_si512(nib, _mm512_and_si512(h, _mm512_set1_epi8(0x10)));
    }
    if (T == Q6_K) {
        const __m512i v = s < 4 ? h0 : h1;
        const int r = s % 4;
        const __m512i h = r == 0 ? _mm512_slli_epi16(v, 4) : r == 1 ? _mm512_slli_epi16(v, 2)
                          : r == 2 ? v : _mm512_srli_epi16(v, 2);
        return _mm512_or_si512(nib, _mm512_and_si512(h, _mm512_set1_epi8(0x30)));
    }
    return nib;
}

static ALWAYS_INLINE void kp_rows(int T, int MR, const uint8_t *pan, int64_t nb, const q8k *xq,
                                  float *y, int64_t ldy, __mmask16 cols) {
    const int pb = kp_block_bytes(T), hb = kp_high_bytes(T), sb = kp_sc_bytes(T);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[KP_MR];
    for (int m = 0; m < MR; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = pan + b * pb, *high = p + 2048, *sc = high + hb, *mn = sc + sb;
        const uint8_t *d = T == Q6_K ? mn : mn + 128;
        __m512i tot[KP_MR], dot[KP_MR];
        for (int m = 0; m < MR; m++) tot[m] = dot[m] = _mm512_setzero_si512();
        for (int u = 0; u < 8; u++) {
            __m512i h0 = _mm512_setzero_si512(), h1 = h0;
            if (T == Q5_K) h0 = _mm512_loadu_si512((const void *)(high + 64 * u));
            if (T == Q6_K) {
                h0 = _mm512_loadu_si512((const void *)(high + 128 * u));
                h1 = _mm512_loadu_si512((const void *)(high + 128 * u + 64));
            }
            for (int t = 0; t < 4; t++) {
                if (t == 0 || (T == Q6_K && t == 2)) { /* a sub-block starts */
                    const int g = T == Q6_K ? 2 * u + t / 2 : u;
                    for (int m = 0; m < MR; m++) {
                        if (T == Q6_K) {
                            const q8k *a = xq + m * nb + b;
                            const int bs = a->bsums[g / 2 + 8 * (g % 2)];
                            dot[m] = _mm512_set1_epi32(-32 * bs);
                        } else {
                            dot[m] = _mm512_setzero_si512();
                        }
                    }
                }
                const __m512i z = _mm512_loadu_si512((const void *)(p + 64 * (4 * u + t)));
                const __m512i c0 = kp_codes(T, 2 * t, _mm512_and_si512(z, m4), h0, h1);
                const __m512i c1 = kp_codes(T, 2 * t + 1,
                                            _mm512_and_si512(_mm512_srli_epi16(z, 4), m4), h0, h1);
                for (int m = 0; m < MR; m++) {
                    const int8_t *x = xq[m * nb + b].qs + 32 * u + 8 * t;
                    dot[m] = dpbusd_4(dot[m], c0, x);
                    dot[m] = dpbusd_4(dot[m], c1, x + 4);
                }
                if (t == 3 || (T == Q6_K && t == 1)) { /* a sub-block ends: times its scale */
                    const int g = T == Q6_K ? 2 * u + t / 2 : u;
                    const __m128i s8 = _mm_loadu_si128((const __m128i *)(sc + 16 * g));
                    const __m512i s =
                        T == Q6_K ? _mm512_cvtepi8_epi32(s8) : _mm512_cvtepu8_epi32(s8);
                    for (int m = 0; m < MR; m++)
                        tot[m] = _mm512_add_epi32(tot[m], _mm512_mullo_epi32(dot[m], s));
                }
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d));
        if (T == Q6_K) {
            for (int m = 0; m < MR; m++) {
                const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(xq[m * nb + b].d));
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[m]), dd, acc[m]);
            }
        } else {
            const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + 32)));
            __m512i pairs[4];
            for (int q = 0; q < 4; q++)
                pairs[q] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(mn + 32 * q)));
            for (int m = 0; m < MR; m++) {
                const q8k *a = xq + m * nb + b;
                __m512i ms = _mm512_setzero_si512();
                for (int q = 0; q < 4; q++) {
                    int32_t two;
                    memcpy(&two, a->bsums32 + 2 * q, 4);
                    ms = _mm512_dpwssd_epi32(ms, pairs[q], _mm512_set1_epi32(two));
                }
                const __m512 dx = _mm512_set1_ps(a->d);
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[m]), _mm512_mul_ps(dw, dx), acc[m]);
                acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dmin, dx), acc[m]);
            }
        }
    }
    for (int m = 0; m < MR; m++) _mm512_mask_storeu_ps(y + m * ldy, cols, acc[m]);
}

#define KP_DISPATCH_MR(T)                                                                     \
    switch (mr) {                                                                             \
    case 1: kp_rows(T, 1, pan, nb, xq, y, ldy, cols); break;                                  \
    case 2: kp_rows(T, 2, pan, nb, xq, y, ldy, cols); break;                                  \
    case 3: kp_rows(T, 3, pan, nb, xq, y, ldy, cols); break;                                  \
    case 4: kp_rows(T, 4, pan, nb, xq, y, ldy, cols); break;                                  \
    case 5: kp_rows(T, 5, pan, nb, xq, y, ldy, cols); break;                                  \
    default: kp_rows(T, 6, pan, nb, xq, y, ldy, cols); break;                                 \
    }

static void kp_tile(int T, int mr, const uint8_t *pan, int64_t nb, const q8k *xq, float *y,
                    int64_t ldy, __mmask16 cols) {
    if (T == Q4_K) {
        KP_DISPATCH_MR(Q4_K)
    } else if (T == Q5_K) {
        KP_DISPATCH_MR(Q5_K)
    } else {
        KP_DISPATCH_MR(Q6_K)
    }
}
#else
#define KQ_PANELS 0
#endif

/* Bytes of the panel form of an [n, k] weight of a K-quant type (0 where there is none). */
int64_t engine_gguf_kq_panel_bytes(int qtype, int64_t n, int64_t k) {
#if KQ_PANELS
    if (!kp_known(qtype) || k <= 0 || k % 256 != 0 || n <= 0) return 0;
    return (n + KP - 1) / KP * (k / 256) * kp_block_bytes(qtype);
#else
    (void)qtype, (void)n, (void)k;
    return 0;
#endif
}

/* Every row's blocks (GGUF bytes, nb a row of bb bytes) into their panels of 16 rows (pb
 * bytes a block) through row(qtype, panel block, lane, GGUF block or NULL for a padding row,
 * to_panels), or (!to_panels) back out into w. Returns 0. */
int engine_gguf_repack_rows(int qtype, uint8_t *w, int64_t n, int64_t nb, int bb, int pb,
                            uint8_t *pan, int to_panels,
                            void (*row)(int, uint8_t *, int, uint8_t *, int)) {
    const int64_t panels = (n + 15) / 16;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++)
        for (int64_t b = 0; b < nb; b++)
            for (int j = 0; j < 16; j++) {
                const int64_t r = p * 16 + j;
                if (r < n || to_panels)
                    row(qtype, pan + (p * nb + b) * pb, j, r < n ? w + (r * nb + b) * bb : NULL,
                        to_panels);
            }
    return 0;
}

#if KQ_PANELS
static void kp_row(int qtype, uint8_t *p, int j, uint8_t *blk, int to_panels) {
    kp_fields f;
    memset(&f, 0, sizeof f); /* a padding row: zero codes and scales */
    if (to_panels) {
        if (blk) kp_decode(qtype, blk, &f);
        kp_place(qtype, p, j, &f, 1);
    } else {
        kp_place(qtype, p, j, &f, 0);
        kp_encode(qtype, &f, blk);
    }
}
#endif

/* GGUF super-blocks w [n, k] <-> the panel form pan (to_panels: w -> pan). Returns 0 or -1. */
int engine_gguf_kq_repack(int qtype, uint8_t *w, int64_t n, int64_t k, uint8_t *pan,
                          int to_panels) {
#if KQ_PANELS
    if (!engine_gguf_kq_panel_bytes(qtype, n, k)) return -1;
    return engine_gguf_repack_rows(qtype, w, n, k / 256, kq_block_bytes(qtype),
                                   kp_block_bytes(qtype), pan, to_panels, kp_row);
#else
    (void)qtype, (void)w, (void)n, (void)k, (void)pan, (void)to_panels;
    return -1;
#endif
}

/* y [m, n] (row stride ldy) = x [m, k] @ W^T from W's panel form: the arguments of
 * engine_gguf_kq_matmul_ld. Returns 0, -1 (no panel form) or -2 (no memory). */
int engine_gguf_kq_panel_q8(int qtype, const uint8_t *w, int64_t n, int64_t k, const float *x,
                            int64_t m, float *y, int64_t ldy) {
#if KQ_PANELS
    if (!engine_gguf_kq_panel_bytes(qtype, n, k) || m < 0 || ldy < n) return -1;
    if (m == 0) return 0;
    const int64_t nb = k / 256, panels = (n + KP - 1) / KP;
    const int pb = kp_block_bytes(qtype);
    const size_t bytes = (sizeof(q8k) * (size_t)(m * nb) + 63) & ~(size_t)63;
    q8k *xq = (q8k *)aligned_alloc(64, bytes);
    if (!xq) return -2;
#pragma omp parallel for schedule(static) if (m * nb >= 64)
    for (int64_t i = 0; i < m * nb; i++) kq_quantize_block(x + i * 256, xq + i);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        const int64_t n0 = p * KP;
        const __mmask16 cols = n - n0 >= KP ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - n0)) - 1);
        for (int64_t r = 0; r < m; r += KP_MR) {
            const int mr = (int)(m - r < KP_MR ? m - r : KP_MR);
            kp_tile(qtype, mr, w + p * nb * pb, nb, xq + r * nb, y + r * ldy + n0, ldy, cols);
        }
    }
    free(xq);
    return 0;
#else
    (void)qtype, (void)w, (void)n, (void)k, (void)x, (void)m, (void)y, (void)ldy;
    return -1;
#endif
}
