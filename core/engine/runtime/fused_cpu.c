/* The decoder's small per-layer operations on the CPU, float32 (see fused_cpu.py).
 *
 * A CPU decode step of a small model is bound by per-operation overhead as much as by weight
 * reads: written as torch ops, one layer's norms, RoPE, activation and attention are ~40 calls
 * with their temporaries. Here each is one call that makes one pass over its rows. Rows are
 * split across OpenMP threads only when there are enough of them (prefill); a decode step's
 * few rows run on the calling thread, which avoids a fork/join per operation.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Storage types of the pool's K/V and of dense weights: float32, IEEE half, bfloat16 (16-bit
 * values converted to float32 as they are read, exactly; products and sums stay float32), and,
 * in the pool only and read only, the fp8 formats (e4m3fn, e5m2; their per-layer scales are
 * the caller's). An fp8 byte becomes a half by its bits alone: e5m2 is a half's top byte, and
 * e4m3fn's sign, exponent and mantissa moved into a half's fields give its value times 2^-8
 * (normal or subnormal), which the caller's scales take back. */
enum { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2, KV_E4M3 = 3, KV_E5M2 = 4 };

static inline size_t kv_size(const int t) {
    return t == KV_F32 ? 4 : t == KV_E4M3 || t == KV_E5M2 ? 1 : 2;
}

static inline uint16_t fp8_half(uint8_t b, const int t) {
    if (t == KV_E5M2) return (uint16_t)(b << 8);
    return (uint16_t)(((b & 0x80) << 8) | ((b & 0x7f) << 7));
}

static inline __attribute__((always_inline)) __m256 kv_load8(const void *p, int64_t i,
                                                              const int t) {
    if (t == KV_F32) return _mm256_loadu_ps((const float *)p + i);
    if (t == KV_E4M3 || t == KV_E5M2) {
        const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)((const uint8_t *)p
                                                                                + i)));
        if (t == KV_E5M2) return _mm256_cvtph_ps(_mm_slli_epi16(b, 8));
        const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                                       _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7));
        return _mm256_cvtph_ps(h);
    }
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (t == KV_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __attribute__((always_inline)) float kv_load1(const void *p, int64_t i,
                                                            const int t) {
    if (t == KV_F32) return ((const float *)p)[i];
    if (t == KV_E4M3 || t == KV_E5M2) return _cvtsh_ss(fp8_half(((const uint8_t *)p)[i], t));
    const uint16_t h = ((const uint16_t *)p)[i];
    if (t == KV_F16) return _cvtsh_ss(h);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Rows of storage type t (float32, half or bfloat16 weights; a pool's K rows) are widened
 * exactly as they are read: every function below sums in w_dot's order, so a 16-bit row's
 * product is bit for bit its float32 copy's. The functions are always inlined, so each type
 * gets its own loop. */
#define AI static inline __attribute__((always_inline))

/* the row r of w [., k] */
AI const void *w_row(const void *w, int64_t r, int64_t k, const int t) {
    return (const char *)w + (size_t)(r * k) * kv_size(t);
}

/* w_dot's scalar tail, from i on (one function: every caller sums alike) */
AI float w_tail(float s, const void *w, const float *x, int64_t i, int64_t n, const int t) {
    for (; i < n; i++) s += kv_load1(w, i, t) * x[i];
    return s;
}

/* w . x for a row w of type t and float32 x [k] */
AI float w_dot(const void *w, const float *x, int64_t k, const int t) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        acc0 = _mm256_fmadd_ps(kv_load8(w, i, t), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(kv_load8(w, i + 8, t), _mm256_loadu_ps(x + i + 8), acc1);
    }
    return w_tail(hsum8(_mm256_add_ps(acc0, acc1)), w, x, i, k, t);
}

static inline float dot(const float *a, const float *b, int64_t n) {
    return w_dot(a, b, n, KV_F32);
}

/* w_dot(w, x0, k) and w_dot(w, x1, k) at once: w is loaded once for both rows, and four
 * accumulator chains run side by side. */
AI void dot2(const void *w, const float *x0, const float *x1, int64_t k, float *o, const int t) {
    __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(),
           b1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m256 wa = kv_load8(w, i, t), wb = kv_load8(w, i + 8, t);
        a0 = _mm256_fmadd_ps(wa, _mm256_loadu_ps(x0 + i), a0);
        b0 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(x0 + i + 8), b0);
        a1 = _mm256_fmadd_ps(wa, _mm256_loadu_ps(x1 + i), a1);
        b1 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(x1 + i + 8), b1);
    }
    o[0] = w_tail(hsum8(_mm256_add_ps(a0, b0)), w, x0, i, k, t);
    o[1] = w_tail(hsum8(_mm256_add_ps(a1, b1)), w, x1, i, k, t);
}

/* w_dot(row r of w, x, k) for the four rows r = 0..3 of w at once: each x vector is loaded
 * once for the four rows. */
AI void dot4(const void *w, int64_t k, const float *x, float *o, const int t) {
    const void *w1 = w_row(w, 1, k, t), *w2 = w_row(w, 2, k, t), *w3 = w_row(w, 3, k, t);
    __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(),
           b1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps(),
           a3 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m256 xa = _mm256_loadu_ps(x + i), xb = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(kv_load8(w, i, t), xa, a0);
        b0 = _mm256_fmadd_ps(kv_load8(w, i + 8, t), xb, b0);
        a1 = _mm256_fmadd_ps(kv_load8(w1, i, t), xa, a1);
        b1 = _mm256_fmadd_ps(kv_load8(w1, i + 8, t), xb, b1);
        a2 = _mm256_fmadd_ps(kv_load8(w2, i, t), xa, a2);
        b2 = _mm256_fmadd_ps(kv_load8(w2, i + 8, t), xb, b2);
        a3 = _mm256_fmadd_ps(kv_load8(w3, i, t), xa, a3);
        b3 = _mm256_fmadd_ps(kv_load8(w3, i + 8, t), xb, b3);
    }
    o[0] = w_tail(hsum8(_mm256_add_ps(a0, b0)), w, x, i, k, t);
    o[1] = w_tail(hsum8(_mm256_add_ps(a1, b1)), w1, x, i, k, t);
    o[2] = w_tail(hsum8(_mm256_add_ps(a2, b2)), w2, x, i, k, t);
    o[3] = w_tail(hsum8(_mm256_add_ps(a3, b3)), w3, x, i, k, t);
}

/* w_dot(w, x + j * sx, k) for j = 0..3 at once: w is loaded once for the four rows, and eight
 * accumulator chains run side by side. */
AI void dotx4(const void *w, const float *x, int64_t sx, int64_t k, float *o, const int t) {
    const float *x1 = x + sx, *x2 = x1 + sx, *x3 = x2 + sx;
    __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(),
           b1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps(),
           a3 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m256 wa = kv_load8(w, i, t), wb = kv_load8(w, i + 8, t);
        a0 = _mm256_fmadd_ps(wa, _mm256_loadu_ps(x + i), a0);
        b0 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(x + i + 8), b0);
        a1 = _mm256_fmadd_ps(wa, _mm256_loadu_ps(x1 + i), a1);
        b1 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(x1 + i + 8), b1);
        a2 = _mm256_fmadd_ps(wa, _mm256_loadu_ps(x2 + i), a2);
        b2 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(x2 + i + 8), b2);
        a3 = _mm256_fmadd_ps(wa, _mm256_loadu_ps(x3 + i), a3);
        b3 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(x3 + i + 8), b3);
    }
    o[0] = w_tail(hsum8(_mm256_add_ps(a0, b0)), w, x, i, k, t);
    o[1] = w_tail(hsum8(_mm256_add_ps(a1, b1)), w, x1, i, k, t);
    o[2] = w_tail(hsum8(_mm256_add_ps(a2, b2)), w, x2, i, k, t);
    o[3] = w_tail(hsum8(_mm256_add_ps(a3, b3)), w, x3, i, k, t);
}

/* out[i * so] = w_dot(w, x + i * sx, k) for the rows i in [i0, i0 + n) of x, four or two rows
 * at a time (dotx4, dot2: each row summed as w_dot sums it) */
AI void dots(const void *w, const float *x, int64_t sx, int64_t k, int64_t i0, int64_t n,
             float *out, int64_t so, const int t) {
    int64_t i = i0;
    for (; i + 4 <= i0 + n; i += 4) {
        float o[4];
        dotx4(w, x + i * sx, sx, k, o, t);
        for (int j = 0; j < 4; j++) out[(i + j) * so] = o[j];
    }
    for (; i + 2 <= i0 + n; i += 2) {
        float o[2];
        dot2(w, x + i * sx, x + (i + 1) * sx, k, o, t);
        out[i * so] = o[0];
        out[(i + 1) * so] = o[1];
    }
    if (i < i0 + n) out[i * so] = w_dot(w, x + i * sx, k, t);
}

#define PAR_ROWS 16 /* rows from which a call splits its rows across threads */
#define PAR_GEMV_FLOATS (1 << 16) /* weights from which a product splits its outputs */
#define GEMV_BLOCK_ROWS 4          /* rows of x from which ... */
#define GEMV_BLOCK_FLOATS (1 << 24) /* ... a weight smaller than this goes four rows at a time */

/* engine_cpu_gemv_f32 for a weight of type t */
AI void gemv(const void *w, int64_t n, int64_t k, const float *x, int64_t sx, int64_t m,
             const float *bias, float *out, int64_t so, const int t) {
    if (t == KV_F32 && m >= GEMV_BLOCK_ROWS && n * k < GEMV_BLOCK_FLOATS) {
        /* several rows of a float32 weight that is not huge: four weight rows at a time, so
         * each x vector is loaded once for four of them (the dot products stay the same). A
         * 16-bit weight stays one row against four input rows below (dotx4): each weight
         * vector is widened once for four rows, which measured faster than widening blocks. */
        const int64_t nb = n / 4;
#pragma omp parallel for schedule(static) if (n * k >= PAR_GEMV_FLOATS)
        for (int64_t q = 0; q < nb; q++) {
            float o[4];
            for (int64_t i = 0; i < m; i++) {
                dot4(w_row(w, 4 * q, k, t), k, x + i * sx, o, t);
                for (int j = 0; j < 4; j++)
                    out[i * so + 4 * q + j] = o[j] + (bias ? bias[4 * q + j] : 0.0f);
            }
        }
        for (int64_t r = 4 * nb; r < n; r++)
            for (int64_t i = 0; i < m; i++)
                out[i * so + r] = w_dot(w_row(w, r, k, t), x + i * sx, k, t) +
                                  (bias ? bias[r] : 0.0f);
        return;
    }
#pragma omp parallel for schedule(static) if (n * k >= PAR_GEMV_FLOATS)
    for (int64_t r = 0; r < n; r++) {
        dots(w_row(w, r, k, t), x, sx, k, 0, m, out + r, so, t);
        if (bias)
            for (int64_t i = 0; i < m; i++) out[i * so + r] += bias[r];
    }
}

/* out[i, r] = x[i, :] . w[r, :] (+ bias[r]) for the m rows of x [m, k] (row stride sx) and
 * the n rows of w [n, k] (contiguous); out row stride so. Each weight row is read once for
 * all m rows of x (which stay in cache): the product streams the weights at memory speed,
 * where a general matrix product of a few rows does not. The outputs are split across
 * threads for a large w; each output is one dot product, so a row's result never depends on
 * the other rows. */
void engine_cpu_gemv_f32(const float *w, int64_t n, int64_t k, const float *x, int64_t sx,
                         int64_t m, const float *bias, float *out, int64_t so) {
    gemv(w, n, k, x, sx, m, bias, out, so, KV_F32);
}

/* engine_cpu_gemv_f32 for a weight w stored as half (t = 1) or bfloat16 (t = 2): the same
 * result, bit for bit, as the product of its float32 copy, reading half the bytes. */
void engine_cpu_gemv_half(const void *w, int64_t t, int64_t n, int64_t k, const float *x,
                          int64_t sx, int64_t m, const float *bias, float *out, int64_t so) {
    if (t == KV_F16)
        gemv(w, n, k, x, sx, m, bias, out, so, KV_F16);
    else
        gemv(w, n, k, x, sx, m, bias, out, so, KV_BF16);
}

/* out = rms_norm(x + res) * w and res_out = x + res (res may be NULL: then out = rms_norm(x) *
 * w and res_out is not written). All [rows, n]; x and res with the given row strides (floats),
 * out and res_out contiguous. */
void engine_cpu_add_rms_norm(const float *x, int64_t sx, const float *res, int64_t sr,
                             float *res_out, const float *w, float *out, int64_t rows, int64_t n,
                             float eps) {
#pragma omp parallel for schedule(static) if (rows >= PAR_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * sx;
        float *o = out + r * n;
        const float *src = xr;
        if (res) {
            const float *rr = res + r * sr;
            float *ro = res_out + r * n;
            int64_t i = 0;
            for (; i + 8 <= n; i += 8)
                _mm256_storeu_ps(ro + i, _mm256_add_ps(_mm256_loadu_ps(xr + i),
                                                       _mm256_loadu_ps(rr + i)));
            for (; i < n; i++) ro[i] = xr[i] + rr[i];
            src = ro;
        }
        const float scale = 1.0f / sqrtf(dot(src, src, n) / (float)n + eps);
        const __m256 s = _mm256_set1_ps(scale);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + i), s),
                                                  _mm256_loadu_ps(w + i)));
        for (; i < n; i++) o[i] = src[i] * scale * w[i];
    }
}

/* Rotate-half RoPE, in place, on the first (hq + hk) heads of each row of qk ([rows, >= (hq +
 * hk) * d], row stride sq): x' = x * cos + swap_halves(x) * sin_signed, with cos/sin rows of the
 * [max_pos, d] caches at each token's position (sin's first half negated, as Rotary keeps it).
 * With norm weights (qw [d], kw [d]: per-head RMSNorm of q and k first, Qwen3). */
void engine_cpu_qk_norm_rope(float *qk, int64_t sq, int64_t rows, int64_t hq, int64_t hk,
                             int64_t d, const int64_t *pos, const float *cos_c,
                             const float *sin_c, const float *qw, const float *kw, float eps) {
    const int64_t half = d / 2;
#pragma omp parallel for schedule(static) if (rows >= PAR_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos_c + pos[r] * d, *s = sin_c + pos[r] * d;
        for (int64_t h = 0; h < hq + hk; h++) {
            float *x = qk + r * sq + h * d;
            const float *nw = h < hq ? qw : kw;
            if (nw) {
                const float scale = 1.0f / sqrtf(dot(x, x, d) / (float)d + eps);
                for (int64_t i = 0; i < d; i++) x[i] = x[i] * scale * nw[i];
            }
            int64_t i = 0;
            for (; i + 8 <= half; i += 8) {
                const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + half + i);
                _mm256_storeu_ps(x + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(c + i),
                                                        _mm256_mul_ps(b, _mm256_loadu_ps(s + i))));
                _mm256_storeu_ps(x + half + i,
                                 _mm256_fmadd_ps(b, _mm256_loadu_ps(c + half + i),
                                                 _mm256_mul_ps(a, _mm256_loadu_ps(s + half + i))));
            }
            for (; i < half; i++) {
                const float a = x[i], b = x[half + i];
                x[i] = a * c[i] + b * s[i];
                x[half + i] = b * c[half + i] + a * s[half + i];
            }
        }
    }
}

/* exp for x <= 0 (softmax and SiLU arguments are kept non-positive), 8 lanes: 2^(x log2 e) by
 * splitting into an integer power of two and a degree-6 polynomial on [-0.5, 0.5]
 * (relative error ~2e-7). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_mul_ps(_mm256_sub_ps(t, n), _mm256_set1_ps(0.6931471805599453f));
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                         _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* out [rows, inter] = silu(x[:, :inter]) * x[:, inter:] (x row stride sx, out row stride so). */
void engine_cpu_silu_and_mul(const float *x, int64_t sx, float *out, int64_t so, int64_t rows,
                             int64_t inter) {
#pragma omp parallel for schedule(static) if (rows >= PAR_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = x + r * sx, *u = g + inter;
        float *o = out + r * so;
        int64_t i = 0;
        const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
        for (; i + 8 <= inter; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            /* sigmoid(g) = 1 / (1 + e^-g) for g >= 0, e^g / (1 + e^g) for g < 0 */
            const __m256 e = exp8(_mm256_or_ps(gv, sign)); /* e^-|g| */
            const __m256 pos = _mm256_div_ps(one, _mm256_add_ps(one, e));
            const __m256 neg = _mm256_mul_ps(e, pos);
            const __m256 sig = _mm256_blendv_ps(pos, neg, gv); /* sign bit of g picks neg */
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
        }
        for (; i < inter; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* The routed experts of a MoE layer for rows sorted by expert, in one call: run r is rows
 * [start[r], start[r] + count[r]) of x [*, hidden], all routed to expert eid[r]. For each run,
 * gu = rows @ w13[e]^T ([2 * inter] outputs: gate then up), mid = silu(gate) * up, then
 * y rows = mid @ w2[e]^T ([hidden] outputs). Only the experts that received rows are read,
 * each weight row once for all of its run's rows; the work items (a run and a chunk of its
 * output rows) are spread over the threads, so a step's few rows per expert still keep every
 * core streaming weights. The runs cover rows 0.. in order; gu [*, 2 * inter] is scratch.
 * phases: 1 gate/up into mid [*, inter], 2 down from mid, 3 both in one parallel region (a
 * caller that rounds mid in between makes two calls). */
#define MOE_CHUNK 16

AI void moe_experts_t(const float *x, int64_t hidden, int64_t inter, const int64_t *eid,
                      const int64_t *start, const int64_t *count, int64_t runs,
                      const void *w13, const void *w2, float *gu, float *mid, float *y,
                      int phases, const int t) {
    const int64_t n1 = 2 * inter, c1 = (n1 + MOE_CHUNK - 1) / MOE_CHUNK;
    const int64_t c2 = (hidden + MOE_CHUNK - 1) / MOE_CHUNK;
    int64_t rows = 0;
    for (int64_t r = 0; r < runs; r++) rows += count[r];
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t it = 0; it < (phases & 1 ? runs * c1 : 0); it++) {
            const int64_t r = it / c1, o0 = (it % c1) * MOE_CHUNK;
            const int64_t o1 = o0 + MOE_CHUNK < n1 ? o0 + MOE_CHUNK : n1;
            for (int64_t o = o0; o < o1; o++)
                dots(w_row(w13, eid[r] * n1 + o, hidden, t), x, hidden, hidden, start[r],
                     count[r], gu + o, n1, t);
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < (phases & 1 ? rows : 0); i++)
            engine_cpu_silu_and_mul(gu + i * n1, n1, mid + i * inter, inter, 1, inter);
#pragma omp for schedule(static)
        for (int64_t it = 0; it < (phases & 2 ? runs * c2 : 0); it++) {
            const int64_t r = it / c2, o0 = (it % c2) * MOE_CHUNK;
            const int64_t o1 = o0 + MOE_CHUNK < hidden ? o0 + MOE_CHUNK : hidden;
            for (int64_t o = o0; o < o1; o++)
                dots(w_row(w2, eid[r] * hidden + o, inter, t), mid, inter, inter, start[r],
                     count[r], y + o, hidden, t);
        }
    }
}

/* w13 / w2 of storage type wt: float32, or half / bfloat16 widened exactly as read (the
 * float32 copy's result bit for bit) */
void engine_cpu_moe_f32(const float *x, int64_t hidden, int64_t inter, const int64_t *eid,
                        const int64_t *start, const int64_t *count, int64_t runs,
                        const void *w13, const void *w2, float *gu, float *mid, float *y,
                        int phases, int64_t wt) {
#define MOE_EXPERTS(T) \
    moe_experts_t(x, hidden, inter, eid, start, count, runs, w13, w2, gu, mid, y, phases, T)
    if (wt == KV_F16) MOE_EXPERTS(KV_F16);
    else if (wt == KV_BF16) MOE_EXPERTS(KV_BF16);
    else MOE_EXPERTS(KV_F32);
#undef MOE_EXPERTS
}

/* A whole routed-experts layer from the router's choice: topk_ids / topk_w [t, k] (ids < 0:
 * not an expert of this rank, skipped). The (token, slot) pairs are sorted by expert (stable
 * counting sort), their rows gathered, engine_cpu_moe_f32 runs every expert, and
 * out[t] = sum over slots, in slot order, of w[t, j] * y[pair]. Scratch: xs [t*k, hidden],
 * gu [t*k, 2 * inter], mid [t*k, inter], y [t*k, hidden]; ints [4 * e + 2 * t * k]. Weights
 * of storage type wt (as engine_cpu_moe_f32). */
void engine_cpu_moe_routed_f32(const float *x, int64_t t, int64_t k, int64_t hidden,
                               int64_t inter, int64_t e, const int64_t *ids, const float *tw,
                               const void *w13, const void *w2, float *xs, float *gu,
                               float *mid, float *y, int64_t *ints, float *out, int64_t wt) {
    int64_t *cnt = ints, *eid = ints + e, *start = ints + 2 * e, *count = ints + 3 * e;
    int64_t *pos = ints + 4 * e, *src = pos + t * k;
    for (int64_t i = 0; i < e; i++) cnt[i] = 0;
    for (int64_t p = 0; p < t * k; p++)
        if (ids[p] >= 0 && ids[p] < e) cnt[ids[p]]++;
    int64_t runs = 0, rows = 0;
    for (int64_t i = 0; i < e; i++) {
        const int64_t c = cnt[i];
        if (c) {
            eid[runs] = i;
            start[runs] = rows;
            count[runs++] = c;
        }
        cnt[i] = rows; /* now the next free row of expert i */
        rows += c;
    }
    for (int64_t p = 0; p < t * k; p++) {
        pos[p] = -1;
        if (ids[p] >= 0 && ids[p] < e) {
            pos[p] = cnt[ids[p]]++;
            src[pos[p]] = p / k;
        }
    }
#pragma omp parallel for schedule(static) if (rows >= PAR_ROWS)
    for (int64_t i = 0; i < rows; i++)
        memcpy(xs + i * hidden, x + src[i] * hidden, (size_t)hidden * sizeof(float));
    engine_cpu_moe_f32(xs, hidden, inter, eid, start, count, runs, w13, w2, gu, mid, y, 3, wt);
#pragma omp parallel for schedule(static) if (t >= PAR_ROWS)
    for (int64_t i = 0; i < t; i++) {
        float *o = out + i * hidden;
        for (int64_t c = 0; c < hidden; c++) o[c] = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const int64_t q = pos[i * k + j];
            if (q < 0) continue;
            const float wj = tw[i * k + j];
            const float *yr = y + q * hidden;
            for (int64_t c = 0; c < hidden; c++) o[c] += wj * yr[c];
        }
    }
}

/* The dot products of q [n] with the 8 rows at r[0..7] (storage type t), in one vector: the
 * 8 sums accumulate side by side and are reduced together (a transpose of adds), where 8
 * single dot products would each end in a horizontal sum. */
static inline __m256 kv_dot8(const float *q, const void *const *r, int64_t n, const int t) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(x, kv_load8(r[0], i, t), a0);
        a1 = _mm256_fmadd_ps(x, kv_load8(r[1], i, t), a1);
        a2 = _mm256_fmadd_ps(x, kv_load8(r[2], i, t), a2);
        a3 = _mm256_fmadd_ps(x, kv_load8(r[3], i, t), a3);
        a4 = _mm256_fmadd_ps(x, kv_load8(r[4], i, t), a4);
        a5 = _mm256_fmadd_ps(x, kv_load8(r[5], i, t), a5);
        a6 = _mm256_fmadd_ps(x, kv_load8(r[6], i, t), a6);
        a7 = _mm256_fmadd_ps(x, kv_load8(r[7], i, t), a7);
    }
    const __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20),
                               _mm256_permute2f128_ps(s0, s1, 0x31));
    if (i < n) {
        float tail[8];
        _mm256_storeu_ps(tail, sum);
        for (int k = 0; k < 8; k++)
            for (int64_t m = i; m < n; m++) tail[k] += q[m] * kv_load1(r[k], m, t);
        sum = _mm256_loadu_ps(tail);
    }
    return sum;
}

#define KV_AHEAD 16 /* keys between a K or V row's prefetch and its use */

/* Asks for the cache lines of bytes [p, p + n) (a row read a few iterations on). */
AI void prefetch_row(const char *p, size_t n) {
    for (size_t o = 0; o < n; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

/* For G heads (scores p [G, len], outputs o [G, d], scales inv [G]): o[h, c] = inv[h] * sum_l
 * p[h, l] v_l[c] for the columns c0 <= c < c_end (c_end - c0 a multiple of 32), 32 at a time:
 * each head's element is an FMA chain over l in order, its V vector loaded once for the G
 * heads. */
AI void pv_heads(const float *p, int64_t len, const int64_t *slots, int64_t hk, int64_t kh,
                 const void *vp, int64_t d, int64_t c0, int64_t c_end, float *o,
                 const float *inv, const int G, const int t) {
    const size_t elem = kv_size(t);
    for (int64_t c = c0; c < c_end; c += 32) {
        __m256 acc[4][4];
        for (int h = 0; h < G; h++)
            for (int v = 0; v < 4; v++) acc[h][v] = _mm256_setzero_ps();
        for (int64_t l = 0; l < len; l++) {
            const void *vv = (const char *)vp + (size_t)((slots[l] * hk + kh) * d + c) * elem;
            if (l + KV_AHEAD < len)
                prefetch_row((const char *)vp + (size_t)((slots[l + KV_AHEAD] * hk + kh) * d + c)
                             * elem, 32 * elem);
            const __m256 v0 = kv_load8(vv, 0, t), v1 = kv_load8(vv, 8, t),
                         v2 = kv_load8(vv, 16, t), v3 = kv_load8(vv, 24, t);
            for (int h = 0; h < G; h++) {
                const __m256 p8 = _mm256_set1_ps(p[h * len + l]);
                acc[h][0] = _mm256_fmadd_ps(p8, v0, acc[h][0]);
                acc[h][1] = _mm256_fmadd_ps(p8, v1, acc[h][1]);
                acc[h][2] = _mm256_fmadd_ps(p8, v2, acc[h][2]);
                acc[h][3] = _mm256_fmadd_ps(p8, v3, acc[h][3]);
            }
        }
        for (int h = 0; h < G; h++) {
            const __m256 s8 = _mm256_set1_ps(inv[h]);
            for (int v = 0; v < 4; v++)
                _mm256_storeu_ps(o + h * d + c + 8 * v, _mm256_mul_ps(acc[h][v], s8));
        }
    }
}

#ifdef __AVX512F__
/* 16 values of a pool row from element i, widened to float32 (kv_load8's values) */
AI __m512 kv_load16(const void *p, int64_t i, const int t) {
    if (t == KV_F32) return _mm512_loadu_ps((const float *)p + i);
    return _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castpd256_pd512(_mm256_castps_pd(kv_load8(p, i, t))),
        _mm256_castps_pd(kv_load8(p, i + 8, t)), 1));
}

/* pv_heads for the columns c < c_end (a multiple of 64), 64 at a time in 16-lane vectors: a
 * 64-column head dimension reads each V row once instead of in two halves. Every element is
 * the same FMA chain over l as pv_heads' (lanes are independent): the same bits. */
AI void pv_heads64(const float *p, int64_t len, const int64_t *slots, int64_t hk, int64_t kh,
                   const void *vp, int64_t d, int64_t c_end, float *o, const float *inv,
                   const int G, const int t) {
    const size_t elem = kv_size(t);
    for (int64_t c = 0; c < c_end; c += 64) {
        __m512 acc[4][4];
        for (int h = 0; h < G; h++)
            for (int v = 0; v < 4; v++) acc[h][v] = _mm512_setzero_ps();
        for (int64_t l = 0; l < len; l++) {
            const void *vv = (const char *)vp + (size_t)((slots[l] * hk + kh) * d + c) * elem;
            if (l + KV_AHEAD < len)
                prefetch_row((const char *)vp + (size_t)((slots[l + KV_AHEAD] * hk + kh) * d + c)
                             * elem, 64 * elem);
            const __m512 v0 = kv_load16(vv, 0, t), v1 = kv_load16(vv, 16, t),
                         v2 = kv_load16(vv, 32, t), v3 = kv_load16(vv, 48, t);
            for (int h = 0; h < G; h++) {
                const __m512 p16 = _mm512_set1_ps(p[h * len + l]);
                acc[h][0] = _mm512_fmadd_ps(p16, v0, acc[h][0]);
                acc[h][1] = _mm512_fmadd_ps(p16, v1, acc[h][1]);
                acc[h][2] = _mm512_fmadd_ps(p16, v2, acc[h][2]);
                acc[h][3] = _mm512_fmadd_ps(p16, v3, acc[h][3]);
            }
        }
        for (int h = 0; h < G; h++) {
            const __m512 s16 = _mm512_set1_ps(inv[h]);
            for (int v = 0; v < 4; v++)
                _mm512_storeu_ps(o + h * d + c + 16 * v, _mm512_mul_ps(acc[h][v], s16));
        }
    }
}
#endif

/* The scores s [len] replaced by exp(s - max s); returns their sum (vectors of 8, then the
 * rest one by one: the same order for every caller). */
static inline float exp_sum(float *s, int64_t len) {
    __m256 m = _mm256_set1_ps(-INFINITY);  /* the largest score, 8 lanes at a time */
    int64_t l = 0;
    for (; l + 8 <= len; l += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + l));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float mx = _mm_cvtss_f32(h);
    for (; l < len; l++) mx = s[l] > mx ? s[l] : mx;
    l = 0;
    const __m256 m8 = _mm256_set1_ps(mx);
    __m256 s8 = _mm256_setzero_ps();
    for (; l + 8 <= len; l += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + l), m8));
        _mm256_storeu_ps(s + l, e);
        s8 = _mm256_add_ps(s8, e);
    }
    float sum = hsum8(s8);
    for (; l < len; l++) {
        s[l] = expf(s[l] - mx);
        sum += s[l];
    }
    return sum;
}

/* n float32 values into the pool at element offset off, rounded to nearest even as torch's
 * conversions round (so the plan's pool equals the per-operation path's). */
static inline void kv_store(void *pool, int64_t off, const float *x, int64_t n, const int t) {
    if (t == KV_F32) {
        memcpy((float *)pool + off, x, sizeof(float) * (size_t)n);
        return;
    }
    uint16_t *dst = (uint16_t *)pool + off;
    int64_t i = 0;
    if (t == KV_F16) {
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(dst + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        for (; i < n; i++) dst[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
        return;
    }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) dst[i] = 0x7fc0; /* NaN */
        else dst[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

/* Decode attention straight from the paged pool: for each request b and query head h, the
 * softmax(scale q.k) weighted sum of V over the request's seq_lens[b] slots, read through
 * req_to_token[req_pool_indices[b]] (no gather). q/out [B, hq, d] float32; k/v pools
 * [slots, hk, d] of storage type kv_type; query head h reads KV head h / (hq / hk). Work items
 * are (request, KV head) pairs, dealt round-robin to the threads: an item takes the group's
 * query heads together, so each K row is read (and widened) once for all of them; a head's
 * scores come 8 keys at a time (kv_dot8; single dot products for the last len % 8), and its
 * weighted sum of V keeps 32 columns of up to four heads in registers through the keys; K and V
 * rows are prefetched KV_AHEAD keys ahead (the slots are scattered). When there are few items
 * (one request's decode: 3 KV heads on 2 threads would leave one thread two of them), each
 * thread takes a contiguous run of the query heads instead, a group possibly split between two
 * threads. Every head's arithmetic depends only on its query, its keys and their count (never
 * on the grouping, the threads or the batch), so a token's output is the same decoded or
 * prefilled, alone or batched. */

/* The query heads [j0, j1) of request b's KV head kh (q/out rows of d), over the request's
 * len keys at slots; sc: scratch for (j1 - j0) * len scores. Heads taken together share
 * each K and V row read; each head's arithmetic is the same whichever heads it is taken with. */
AI void attend_heads(const float *q, const void *kp, const void *vp, const int64_t *slots,
                     int64_t len, int64_t hq, int64_t hk, int64_t b, int64_t kh, int64_t j0,
                     int64_t j1, int64_t d, float scale, float v_mul, float *out, float *sc,
                     const int t) {
    const int64_t group = j1 - j0, first = b * hq + kh * (hq / hk) + j0;
    const float *qg = q + first * d;  /* the heads' queries, one after another */
    float *og = out + first * d;
    const size_t elem = kv_size(t);
    int64_t l = 0;
    /* 16-bit and fp8 rows read by several heads are widened once, into a float32 tile (the
     * same values: the sums are the same bits) */
    const int widen = t != KV_F32 && group > 1;
    float tile[widen ? 8 * d : 1];
    for (; l + 8 <= len; l += 8) {  /* 8 keys at a time, each row read once */
        const void *rows[8];
        for (int k = 0; k < 8; k++)
            rows[k] = (const char *)kp + (size_t)((slots[l + k] * hk + kh) * d) * elem;
        if (l + 8 + KV_AHEAD <= len)  /* rows KV_AHEAD keys on asked for now */
            for (int k = KV_AHEAD; k < 8 + KV_AHEAD; k++)
                prefetch_row((const char *)kp + (size_t)((slots[l + k] * hk + kh) * d) * elem,
                             d * elem);
        const __m256 sc8 = _mm256_set1_ps(scale);
        if (widen) {
            for (int k = 0; k < 8; k++) {
                int64_t i = 0;
                for (; i + 8 <= d; i += 8) _mm256_storeu_ps(tile + k * d + i,
                                                            kv_load8(rows[k], i, t));
                for (; i < d; i++) tile[k * d + i] = kv_load1(rows[k], i, t);
                rows[k] = tile + k * d;
            }
            for (int64_t j = 0; j < group; j++)
                _mm256_storeu_ps(sc + j * len + l,
                                 _mm256_mul_ps(kv_dot8(qg + j * d, rows, d, KV_F32), sc8));
        } else {
            for (int64_t j = 0; j < group; j++)
                _mm256_storeu_ps(sc + j * len + l,
                                 _mm256_mul_ps(kv_dot8(qg + j * d, rows, d, t), sc8));
        }
    }
    for (; l < len; l++) {
        const int64_t at = (slots[l] * hk + kh) * d;
        for (int64_t j = 0; j < group; j++)
            sc[j * len + l] = w_dot((const char *)kp + at * elem, qg + j * d, d, t) * scale;
    }
    float inv[group];
    for (int64_t j = 0; j < group; j++) inv[j] = v_mul / exp_sum(sc + j * len, len);
    /* o = sum_l p_l v_l, each element in the order of l: 32 columns of up to four heads stay
     * in registers through the keys, each V vector read once for them */
    const int64_t c_end = d - d % 32;
#ifdef __AVX512F__
    const int64_t c64 = d - d % 64;  /* 64 columns at a time first (pv_heads64) */
#define PV(G) do { \
        pv_heads64(sc + j * len, len, slots, hk, kh, vp, d, c64, og + j * d, inv + j, G, t); \
        pv_heads(sc + j * len, len, slots, hk, kh, vp, d, c64, c_end, og + j * d, inv + j, G, \
                 t); \
    } while (0)
#else
#define PV(G) pv_heads(sc + j * len, len, slots, hk, kh, vp, d, 0, c_end, og + j * d, inv + j, \
                       G, t)
#endif
    for (int64_t j = 0; j < group; j += 4) {
        const int64_t g = group - j < 4 ? group - j : 4;
        if (g == 4) PV(4);
        else if (g == 3) PV(3);
        else if (g == 2) PV(2);
        else PV(1);
    }
#undef PV
    for (int64_t j = 0; j < group; j++) {
        const float *p = sc + j * len;
        float *o = og + j * d;
        const int64_t c = c_end;
        if (c < d) {  /* columns past the last whole chunk, one vector or value each */
            memset(o + c, 0, sizeof(float) * (size_t)(d - c));
            for (int64_t l = 0; l < len; l++) {
                const int64_t at = (slots[l] * hk + kh) * d;
                const void *vv = (const char *)vp + at * elem;
                const __m256 p8 = _mm256_set1_ps(p[l]);
                int64_t i = c;
                for (; i + 8 <= d; i += 8)
                    _mm256_storeu_ps(o + i, _mm256_fmadd_ps(p8, kv_load8(vv, i, t),
                                                            _mm256_loadu_ps(o + i)));
                for (; i < d; i++) o[i] += p[l] * kv_load1(vv, i, t);
            }
            for (int64_t i = c; i < d; i++) o[i] *= inv[j];
        }
    }
}

static inline __attribute__((always_inline)) void decode_attention_t(
        const float *q, const void *kp, const void *vp, const int64_t *req_to_token,
        int64_t rt_stride, const int64_t *req_idx, const int64_t *seq_lens, float *out,
        int64_t batch, int64_t hq, int64_t hk, int64_t d, float scale, int64_t max_len,
        float v_mul, const int t) {
    const int64_t group = hq / hk, items = batch * hk;
    const int threads = omp_get_max_threads();
    int64_t total = 0;  /* the keys all query heads read */
    for (int64_t b = 0; b < batch; b++) total += seq_lens[b] * hq;
    if (items < 4 * threads && group > 1 && threads > 1 && total >= 256 * hq) {
        /* Few KV heads (one request's decode): each thread takes a contiguous run of the
         * query heads, weighed by their keys, so that a KV head's group may be split between
         * two threads (its K and V rows read by both) instead of a whole group left to one */
#pragma omp parallel
        {
            const int64_t n = omp_get_num_threads(), me = omp_get_thread_num();
            float *sc = (float *)malloc(sizeof(float) * (size_t)(max_len > 0 ? max_len : 1) *
                                        (size_t)group);
            int64_t before = 0;  /* the keys of the heads ahead of this one */
            for (int64_t b = 0; b < batch && sc; b++) {
                const int64_t len = seq_lens[b];
                const int64_t *slots = req_to_token + req_idx[b] * rt_stride;
                for (int64_t kh = 0; kh < hk; kh++) {
                    int64_t j0 = -1, j1 = -1;  /* this thread's heads of the group */
                    for (int64_t j = 0; j < group; j++, before += len) {
                        /* a head is its thread's whose share its middle key falls in */
                        if ((2 * before + len) * n / (2 * total) != me) continue;
                        if (j0 < 0) j0 = j;
                        j1 = j + 1;
                    }
                    if (j0 >= 0)
                        attend_heads(q, kp, vp, slots, len, hq, hk, b, kh, j0, j1, d, scale,
                                     v_mul, out, sc, t);
                }
            }
            free(sc);
        }
        return;
    }
    /* one scores buffer per thread (not per work item: an extend batch has T * hk items);
     * items dealt round-robin: an extend's token t reads t + 1 keys, so contiguous halves
     * would leave one thread most of the work */
#pragma omp parallel if (items > 1 && batch * max_len >= 256)
    {
        float *sc = (float *)malloc(sizeof(float) * (size_t)(max_len > 0 ? max_len : 1) *
                                    (size_t)group);
#pragma omp for schedule(static, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!sc) continue;
            const int64_t b = it / hk, kh = it % hk;
            attend_heads(q, kp, vp, req_to_token + req_idx[b] * rt_stride, seq_lens[b], hq, hk,
                         b, kh, 0, group, d, scale, v_mul, out, sc, t);
        }
        free(sc);
    }
}

/* v_mul multiplies every output (an fp8 pool's V scale; the K scale is the caller's to fold
 * into scale). */
void engine_cpu_decode_attention(const float *q, const void *kp, const void *vp,
                                 const int64_t *req_to_token, int64_t rt_stride,
                                 const int64_t *req_idx, const int64_t *seq_lens, float *out,
                                 int64_t batch, int64_t hq, int64_t hk, int64_t d, float scale,
                                 int64_t max_len, int64_t kv_type, float v_mul) {
#define DECODE_ATTENTION(T)                                                                   \
    decode_attention_t(q, kp, vp, req_to_token, rt_stride, req_idx, seq_lens, out, batch, hq,  \
                       hk, d, scale, max_len, v_mul, T)
    if (kv_type == KV_F16) DECODE_ATTENTION(KV_F16);
    else if (kv_type == KV_BF16) DECODE_ATTENTION(KV_BF16);
    else if (kv_type == KV_E4M3) DECODE_ATTENTION(KV_E4M3);
    else if (kv_type == KV_E5M2) DECODE_ATTENTION(KV_E5M2);
    else DECODE_ATTENTION(KV_F32);
#undef DECODE_ATTENTION
}

/* Decode attention over an fp4_mx_block16 pool (rows of d / 2 bytes of E2M1 codes, element 2i
 * in byte i's low nibble, then one scale byte e + 127 per 16 values; see kv_fp4.py): each K
 * and V row is unpacked once per work item into float32 (exactly: a code's value times 2^e),
 * then used as decode_attention_t uses a float32 row. */
static const float FP4_VALUES[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static inline void fp4_row(const uint8_t *row, int64_t d, float *out) {
    const uint8_t *scales = row + d / 2;
    for (int64_t b = 0; b < d / 16; b++) {
        const uint32_t bits = (uint32_t)scales[b] << 23; /* 2^(byte - 127) */
        float s;
        memcpy(&s, &bits, 4);
        for (int64_t i = 0; i < 8; i++) {
            const uint8_t c = row[b * 8 + i];
            out[b * 16 + 2 * i] = FP4_VALUES[c & 15] * s;
            out[b * 16 + 2 * i + 1] = FP4_VALUES[c >> 4] * s;
        }
    }
}

void engine_cpu_decode_attention_fp4(const float *q, const uint8_t *kp, const uint8_t *vp,
                                     const int64_t *req_to_token, int64_t rt_stride,
                                     const int64_t *req_idx, const int64_t *seq_lens, float *out,
                                     int64_t batch, int64_t hq, int64_t hk, int64_t d,
                                     float scale, int64_t max_len) {
    const int64_t group = hq / hk, items = batch * hk, w = d / 2 + d / 16;
#pragma omp parallel if (items > 1 && batch * max_len >= 256)
    {
        float *sc = (float *)malloc(sizeof(float) * (size_t)(max_len > 0 ? max_len : 1) *
                                    (size_t)group);
        float *row = (float *)malloc(sizeof(float) * (size_t)d);
#pragma omp for schedule(static, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!sc || !row) continue;
            const int64_t b = it / hk, kh = it % hk, len = seq_lens[b];
            const int64_t *slots = req_to_token + req_idx[b] * rt_stride;
            const float *qg = q + (b * hq + kh * group) * d;
            float *og = out + (b * hq + kh * group) * d;
            for (int64_t l = 0; l < len; l++) {
                fp4_row(kp + (slots[l] * hk + kh) * w, d, row);
                for (int64_t j = 0; j < group; j++)
                    sc[j * len + l] = dot(qg + j * d, row, d) * scale;
            }
            float inv[group];
            for (int64_t j = 0; j < group; j++) inv[j] = 1.0f / exp_sum(sc + j * len, len);
            memset(og, 0, sizeof(float) * (size_t)(d * group));
            for (int64_t l = 0; l < len; l++) {
                fp4_row(vp + (slots[l] * hk + kh) * w, d, row);
                for (int64_t j = 0; j < group; j++) {
                    const __m256 p8 = _mm256_set1_ps(sc[j * len + l]);
                    float *o = og + j * d;
                    int64_t i = 0;
                    for (; i + 8 <= d; i += 8)
                        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(p8, _mm256_loadu_ps(row + i),
                                                                _mm256_loadu_ps(o + i)));
                    for (; i < d; i++) o[i] += sc[j * len + l] * row[i];
                }
            }
            for (int64_t j = 0; j < group; j++)
                for (int64_t i = 0; i < d; i++) og[j * d + i] *= inv[j];
        }
        free(sc);
        free(row);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* A whole decode forward through the decoder layers in one call (the CPU counterpart of a
 * captured CUDA graph): the same kernels as the per-operation path, in the same order, so the
 * result is bit-identical to it; only the Python between them is gone.
 *
 * plan: PLAN_FIELDS int64 per layer (pointers as integers): the two norm weights, the q/k norm
 * weights (0: none), then for qkv, o, gate_up and down a matmul (function, type, weight) and
 * its float32 bias (0: none), then the layer's K and V pools [slots, hk, d] (storage type
 * kv_type). A matmul function computes y [m, n] (rows ldy apart) = x [m, k] @ W^T from its
 * packed weight (the quantization method's kernel); the bias is added to its result, one
 * addition per output as the per-operation path adds it. */
typedef int (*matmul_fn)(int qtype, const uint8_t *w, int64_t n, int64_t k, const float *x,
                         int64_t m, float *y, int64_t ldy);

enum { P_IN_NORM, P_POST_NORM, P_Q_NORM, P_K_NORM, P_QKV, P_O = P_QKV + 4, P_GU = P_O + 4,
       P_DOWN = P_GU + 4, P_KPOOL = P_DOWN + 4, P_VPOOL, PLAN_FIELDS };

static int call_mm(const int64_t *f, int64_t n, int64_t k, const float *x, int64_t m,
                   float *y) {
    const int rc = ((matmul_fn)(intptr_t)f[0])((int)f[1], (const uint8_t *)(intptr_t)f[2], n,
                                               k, x, m, y, n);
    const float *bias = (const float *)(intptr_t)f[3];
    if (rc == 0 && bias)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) y[i * n + j] += bias[j];
    return rc;
}

#define PTR(T, v) ((T)(intptr_t)(v))

/* h [B, hidden]: the embeddings in, the last layer's output plus the residual out. With a
 * head (its product's 4 fields as a layer's, the final norm's weight, the vocabulary), the rows
 * rows[0..n_rows) of that output are normed and multiplied into logits [n_rows, vocab] too.
 * Returns 0, a matmul's nonzero code, or -2 without scratch memory. */
int engine_cpu_decode_layers(const int64_t *plan, int64_t layers, int64_t batch, int64_t hidden,
                             int64_t hq, int64_t hk, int64_t d, int64_t inter, float eps,
                             float scale, const float *cos_c, const float *sin_c,
                             const int64_t *pos, const int64_t *out_loc,
                             const int64_t *req_to_token, int64_t rt_stride,
                             const int64_t *req_idx, const int64_t *seq_lens, int64_t max_len,
                             int64_t kv_type, float *h, const int64_t *head,
                             const float *norm_w, const int64_t *rows, int64_t n_rows,
                             int64_t vocab, float *logits) {
    const int64_t qkv_n = (hq + 2 * hk) * d, B = batch;
    const size_t floats = (size_t)(B * (3 * hidden + qkv_n + 2 * hq * d + 3 * inter));
    float *buf = (float *)malloc(sizeof(float) * floats);
    if (!buf) return -2;
    float *res = buf, *normed = res + B * hidden, *x = normed + B * hidden;
    float *qkv = x + B * hidden, *q = qkv + B * qkv_n, *att = q + B * hq * d;
    float *gu = att + B * hq * d, *act = gu + B * 2 * inter;
    int rc = 0;
    for (int64_t l = 0; l < layers && rc == 0; l++) {
        const int64_t *p = plan + l * PLAN_FIELDS;
        void *kp = PTR(void *, p[P_KPOOL]), *vp = PTR(void *, p[P_VPOOL]);
        /* input norm: the first layer's residual is the embedding itself */
        if (l == 0) {
            memcpy(res, h, sizeof(float) * (size_t)(B * hidden));
            engine_cpu_add_rms_norm(h, hidden, NULL, 0, NULL, PTR(const float *, p[P_IN_NORM]),
                                    normed, B, hidden, eps);
        } else {
            engine_cpu_add_rms_norm(x, hidden, res, hidden, res,
                                    PTR(const float *, p[P_IN_NORM]), normed, B, hidden, eps);
        }
        if ((rc = call_mm(p + P_QKV, qkv_n, hidden, normed, B, qkv))) break;
        engine_cpu_qk_norm_rope(qkv, qkv_n, B, hq, hk, d, pos, cos_c, sin_c,
                                PTR(const float *, p[P_Q_NORM]), PTR(const float *, p[P_K_NORM]),
                                eps);
        for (int64_t b = 0; b < B; b++) { /* K and V into the pool; q gathered contiguous */
            const float *row = qkv + b * qkv_n;
            kv_store(kp, out_loc[b] * hk * d, row + hq * d, hk * d, (int)kv_type);
            kv_store(vp, out_loc[b] * hk * d, row + (hq + hk) * d, hk * d, (int)kv_type);
            memcpy(q + b * hq * d, row, sizeof(float) * (size_t)(hq * d));
        }
        engine_cpu_decode_attention(q, kp, vp, req_to_token, rt_stride, req_idx, seq_lens, att,
                                    B, hq, hk, d, scale, max_len, kv_type, 1.0f);
        if ((rc = call_mm(p + P_O, hidden, hq * d, att, B, x))) break;
        engine_cpu_add_rms_norm(x, hidden, res, hidden, res, PTR(const float *, p[P_POST_NORM]),
                                normed, B, hidden, eps);
        if ((rc = call_mm(p + P_GU, 2 * inter, hidden, normed, B, gu))) break;
        engine_cpu_silu_and_mul(gu, 2 * inter, act, inter, B, inter);
        if ((rc = call_mm(p + P_DOWN, hidden, inter, act, B, x))) break;
    }
    if (rc == 0)
        for (int64_t i = 0; i < B * hidden; i++) h[i] = x[i] + res[i];
    if (rc == 0 && head) {  /* the final norm of the rows asked for (n_rows <= B), the head */
        for (int64_t r = 0; r < n_rows; r++)
            memcpy(x + r * hidden, h + rows[r] * hidden, sizeof(float) * (size_t)hidden);
        engine_cpu_add_rms_norm(x, hidden, NULL, 0, NULL, norm_w, normed, n_rows, hidden, eps);
        rc = call_mm(head, vocab, hidden, normed, n_rows, logits);
    }
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* fp8 activation fake quantization (what an fp8 W8A8 kernel hands its matmul, in float32):
 * per row (or per group of `group` columns when group > 0), scale = max(amax, 1e-12) / fmax
 * (dynamic; or the one static scale when static_scale > 0), v = x / scale clamped to
 * [-fmax, fmax], rounded to the fp8 format's grid (round to nearest even; `mbits` mantissa
 * bits, smallest normal 2^emin, subnormals below it), out = v * scale. The same float32
 * operations in the same order as the torch ops it replaces, so the result is bit-identical. */
static inline float fp8_round(float v, int mbits, int emin) {
    const float a = fabsf(v);
    if (a == 0.0f) return v;
    int e;
    frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1): the binade's exponent is e - 1 */
    int q = e - 1 - mbits;
    if (e - 1 < emin) q = emin - mbits; /* subnormal spacing */
    const float quantum = ldexpf(1.0f, q);
    return rintf(v / quantum) * quantum;
}

/* fp8_round of 8 values (|v| <= fmax, so a normal float or zero): the quantum is 2^q with
 * q = max(exponent(v), emin) - mbits, read from the exponent bits; dividing by a power of two
 * and multiplying back are exact, and the rounding is to nearest even, as rintf */
static inline __m256 fp8_round8(__m256 v, int mbits, int emin) {
    const __m256i bits = _mm256_castps_si256(v);
    __m256i e = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(bits, 23),
                                                  _mm256_set1_epi32(0xff)),
                                 _mm256_set1_epi32(127));
    e = _mm256_max_epi32(e, _mm256_set1_epi32(emin));
    const __m256i q = _mm256_sub_epi32(e, _mm256_set1_epi32(mbits));
    const __m256 quantum = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(127)), 23));
    const __m256 inverse = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(127), q), 23));
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(v, inverse),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_mul_ps(r, quantum);
}

void engine_cpu_fake_quant_fp8(const float *x, float *out, int64_t rows, int64_t cols,
                               int64_t group, float static_scale, float fmax, int64_t mbits,
                               int64_t emin) {
    const int64_t g = group > 0 ? group : cols;
    const __m256 hi = _mm256_set1_ps(fmax), lo = _mm256_set1_ps(-fmax);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
#pragma omp parallel for schedule(static) if (rows >= PAR_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *o = out + r * cols;
        for (int64_t c0 = 0; c0 < cols; c0 += g) {
            const int64_t c1 = c0 + g < cols ? c0 + g : cols;
            float scale = static_scale;
            if (!(static_scale > 0.0f)) {
                __m256 m8 = _mm256_setzero_ps();
                int64_t c = c0;
                for (; c + 8 <= c1; c += 8)  /* a NaN is skipped, as below */
                    m8 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xr + c), absmask), m8);
                float lanes[8], amax = 0.0f;
                _mm256_storeu_ps(lanes, m8);
                for (int j = 0; j < 8; j++) amax = lanes[j] > amax ? lanes[j] : amax;
                for (; c < c1; c++) {
                    const float a = fabsf(xr[c]);
                    amax = a > amax ? a : amax;
                }
                scale = (amax > 1e-12f ? amax : 1e-12f) / fmax;
            }
            const __m256 s8 = _mm256_set1_ps(scale);
            int64_t c = c0;
            for (; c + 8 <= c1; c += 8) {  /* (min/max keep a NaN: it is their second operand) */
                __m256 v = _mm256_div_ps(_mm256_loadu_ps(xr + c), s8);
                v = _mm256_max_ps(lo, _mm256_min_ps(hi, v));
                _mm256_storeu_ps(o + c, _mm256_mul_ps(fp8_round8(v, (int)mbits, (int)emin), s8));
            }
            for (; c < c1; c++) {
                float v = xr[c] / scale;
                v = v < -fmax ? -fmax : (v > fmax ? fmax : v);
                o[c] = fp8_round(v, (int)mbits, (int)emin) * scale;
            }
        }
    }
}

/* NVFP4 fake quantization of rows (activations: a global scale per row): gs = max(amax / 2688,
 * 1e-12) (2688 = 448 * 6), per block of 16 an e4m3 scale bs = fp8(block amax / 6 / gs) * gs, and
 * each element the nearest E2M1 value of x / bs (steps of 0.5 below 2, 1 below 4, 2 up to the
 * saturation at 6; ties to even) times bs. The float32 operations and their order are
 * engine.runtime.quant_formats.fake_quant_nvfp4's, so the result is bit-identical. */
static inline float e2m1_round(float a) {
    const float v = a < 2.0f ? rintf(a * 2.0f) * 0.5f
                  : (a < 4.0f ? rintf(a) : rintf(a * 0.5f) * 2.0f);
    return v > 6.0f ? 6.0f : v;
}

void engine_cpu_fake_quant_nvfp4_rows(const float *x, float *out, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows >= PAR_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *o = out + r * cols;
        float amax = 0.0f;
        for (int64_t c = 0; c < cols; c++) {
            const float a = fabsf(xr[c]);
            amax = a > amax ? a : amax;
        }
        float gs = amax / 2688.0f;
        gs = gs > 1e-12f ? gs : 1e-12f;
        for (int64_t c0 = 0; c0 < cols; c0 += 16) {
            float bmax = 0.0f;
            for (int64_t c = c0; c < c0 + 16; c++) {
                const float a = fabsf(xr[c]);
                bmax = a > bmax ? a : bmax;
            }
            const float bs = fp8_round(bmax / 6.0f / gs, 3, -6) * gs;
            const float safe = bs > 0.0f ? bs : 1.0f;
            for (int64_t c = c0; c < c0 + 16; c++) {
                const float v = xr[c] / safe;
                o[c] = copysignf(e2m1_round(fabsf(v)), v) * bs;
            }
        }
    }
}

/* out = (fake-quantized x) @ w^T (+ bias): engine_cpu_fake_quant_fp8 of the m contiguous rows
 * of x, then engine_cpu_gemv_f32, in one call (an fp8 format's activation path for a few
 * rows; bit-identical to the two calls). */
void engine_cpu_fq_gemv_f32(const float *w, int64_t n, int64_t k, const float *x, int64_t m,
                            const float *bias, float *out, int64_t group, float static_scale,
                            float fmax, int64_t mbits, int64_t emin) {
    float stack[4096];
    float *xq = m * k <= 4096 ? stack : (float *)malloc((size_t)(m * k) * sizeof(float));
    engine_cpu_fake_quant_fp8(x, xq, m, k, group, static_scale, fmax, mbits, emin);
    engine_cpu_gemv_f32(w, n, k, xq, k, m, bias, out, n);
    if (xq != stack) free(xq);
}

/* ---------------------------------------------------------------- 4- and 8-bit affine weights
 *
 * W[r, c] = q[r, c] * s[r, g] + b[r, g] with g = c / group (group a multiple of 32), unsigned
 * codes q: 8-bit, one byte a column; 4-bit, 32-column blocks of 16 bytes, byte j holding
 * column j (low nibble) and column j + 16 (high nibble). s and b are float32 [n, k / group].
 * The product of a row of x is sum_g s[r, g] * (x_g . q_g) + sum_g b[r, g] * sum(x_g): the
 * codes are exact in float32, so this is the dequantized weight's product up to the order of
 * additions, which is fixed per row (four chains of eight lanes per group, the groups' sums
 * in order), whatever the number of rows in the call. */

/* the 32 codes of columns col .. col + 31 of a row of ``bits``-bit codes, as floats */
static inline __attribute__((always_inline)) void codes32(const uint8_t *q, int64_t col,
                                                          const int bits, __m256 v[4]) {
    if (bits == 8) {
        for (int t = 0; t < 4; t++)
            v[t] = _mm256_cvtepi32_ps(
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + col + 8 * t))));
        return;
    }
    const __m128i raw = _mm_loadu_si128((const __m128i *)(q + col / 2));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    v[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    v[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

/* The weight row ``q`` with its scales s and biases b (k / group each) against ``rows`` (1 or
 * 2) rows of x (row stride sx) whose group sums are xs (row stride ng): the outputs into
 * out[0], out[so]. Each row has four chains of eight lanes per group, whatever the other row. */
static inline __attribute__((always_inline)) void affine_row(
    const uint8_t *q, const int bits, const float *s, const float *b, int64_t group,
    const float *x, int64_t sx, const float *xs, int64_t ng, const int rows, float *out,
    int64_t so) {
    const int64_t per = group / 32;
    __m256 y[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0; g < ng; g++) {
        __m256 c[2][4];
        for (int j = 0; j < rows; j++)
            for (int t = 0; t < 4; t++) c[j][t] = _mm256_setzero_ps();
        for (int64_t blk = 0; blk < per; blk++) {
            const int64_t col = (g * per + blk) * 32;
            __m256 v[4];
            codes32(q, col, bits, v);
            for (int j = 0; j < rows; j++) {
                const float *xj = x + j * sx + col;
                for (int t = 0; t < 4; t++)
                    c[j][t] = _mm256_fmadd_ps(v[t], _mm256_loadu_ps(xj + 8 * t), c[j][t]);
            }
        }
        const __m256 sg = _mm256_set1_ps(s[g]);
        for (int j = 0; j < rows; j++)
            y[j] = _mm256_fmadd_ps(sg, _mm256_add_ps(_mm256_add_ps(c[j][0], c[j][1]),
                                                     _mm256_add_ps(c[j][2], c[j][3])), y[j]);
    }
    for (int j = 0; j < rows; j++) {
        float bias_sum = 0.0f;
        for (int64_t g = 0; g < ng; g++) bias_sum += b[g] * xs[j * ng + g];
        out[j * so] = hsum8(y[j]) + bias_sum;
    }
}

/* weight row r against the m rows of x, two at a time */
static inline __attribute__((always_inline)) void affine_rows(
    const uint8_t *q, const int bits, const float *s, const float *b, int64_t r, int64_t k,
    int64_t group, const float *x, int64_t sx, const float *xs, int64_t m, float *out,
    int64_t so) {
    const int64_t ng = k / group;
    const uint8_t *qr = q + r * (k * bits / 8);
    const float *sr = s + r * ng, *br = b + r * ng;
    int64_t i = 0;
    for (; i + 2 <= m; i += 2)
        affine_row(qr, bits, sr, br, group, x + i * sx, sx, xs + i * ng, ng, 2,
                   out + i * so + r, so);
    if (i < m)
        affine_row(qr, bits, sr, br, group, x + i * sx, sx, xs + i * ng, ng, 1,
                   out + i * so + r, so);
}

/* out[i, r] = x[i, :] . W[r, :] (+ bias[r]) for the m rows of x [m, k] (row stride sx) and the
 * n rows of the ``bits``-bit (4 or 8) affine weight above; out row stride so. Each weight row
 * is read once for all m rows (two at a time); outputs split across threads for a large
 * weight. Returns 0, or -2 without scratch memory. */
int engine_cpu_affine_f32(const uint8_t *q, int64_t bits, const float *s, const float *b,
                          int64_t n, int64_t k, int64_t group, const float *x, int64_t sx,
                          int64_t m, const float *bias, float *out, int64_t so) {
    const int64_t ng = k / group;
    float stack[1024];
    float *xs = m * ng <= 1024 ? stack : (float *)malloc((size_t)(m * ng) * sizeof(float));
    if (!xs) return -2;
    for (int64_t i = 0; i < m; i++)
        for (int64_t g = 0; g < ng; g++) {
            const float *xg = x + i * sx + g * group;
            __m256 a = _mm256_setzero_ps();
            for (int64_t c = 0; c < group; c += 8) a = _mm256_add_ps(a, _mm256_loadu_ps(xg + c));
            xs[i * ng + g] = hsum8(a);
        }
#pragma omp parallel for schedule(static) if (n * k >= PAR_GEMV_FLOATS)
    for (int64_t r = 0; r < n; r++) {
        if (bits == 8)
            affine_rows(q, 8, s, b, r, k, group, x, sx, xs, m, out, so);
        else
            affine_rows(q, 4, s, b, r, k, group, x, sx, xs, m, out, so);
        if (bias)
            for (int64_t j = 0; j < m; j++) out[j * so + r] += bias[r];
    }
    if (xs != stack) free(xs);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Decode-plan matmuls (the matmul_fn signature above) for float32 models. */

/* A dense weight w [n, k] of storage type `type` (float32, half, bfloat16):
 * engine_cpu_gemv_f32 / _half, as the per-operation path multiplies a few rows. */
int engine_cpu_dense_mm(int type, const uint8_t *w, int64_t n, int64_t k, const float *x,
                        int64_t m, float *y, int64_t ldy) {
    if (type == KV_F32)
        engine_cpu_gemv_f32((const float *)w, n, k, x, k, m, NULL, y, ldy);
    else
        engine_cpu_gemv_half(w, type, n, k, x, k, m, NULL, y, ldy);
    return 0;
}

/* A weight-only layer's packed affine form. desc (int64): the number of parts, the rows up to
 * which the codes are multiplied, the dense float32 copy [n, k] that more rows multiply (0:
 * none), then per part (its outputs side by side in y): width, codes, bits, scale, bias, group,
 * column permutation (int64 [k], 0: none; the rows' columns are gathered through it first).
 * Returns 0, -2 without scratch memory, -3 for more rows than the form serves. */
int engine_cpu_affine_mm(int type, const uint8_t *desc, int64_t n, int64_t k, const float *x,
                         int64_t m, float *y, int64_t ldy) {
    (void)type;
    const int64_t *d = (const int64_t *)desc;
    if (m > d[1]) {
        if (!d[2]) return -3;
        engine_cpu_gemv_f32(PTR(const float *, d[2]), n, k, x, k, m, NULL, y, ldy);
        return 0;
    }
    float *gathered = NULL;
    int rc = 0;
    for (int64_t p = 0, col = 0; p < d[0] && rc == 0; p++) {
        const int64_t *f = d + 3 + 7 * p;
        const float *xs = x;
        if (f[6]) {
            const int64_t *perm = PTR(const int64_t *, f[6]);
            if (!gathered && !(gathered = (float *)malloc(sizeof(float) * (size_t)(m * k))))
                return -2;
            for (int64_t i = 0; i < m; i++)
                for (int64_t c = 0; c < k; c++) gathered[i * k + c] = x[i * k + perm[c]];
            xs = gathered;
        }
        rc = engine_cpu_affine_f32(PTR(const uint8_t *, f[1]), f[2], PTR(const float *, f[3]),
                                   PTR(const float *, f[4]), f[0], k, f[5], xs, k, m, NULL,
                                   y + col, ldy);
        col += f[0];
    }
    free(gathered);
    return rc;
}
