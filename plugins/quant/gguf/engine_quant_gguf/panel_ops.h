/* Instructions shared by the panel kernels of kernels.c (Q4_0/Q4_1/Q8_0) and kquants.c (the
 * K-quants): a dot-product step with the activation codes as the broadcast memory operand.
 * Include after <immintrin.h> and <string.h>; defined where the CPU has AVX512-VNNI. */
#ifndef ENGINE_GGUF_PANEL_OPS_H
#define ENGINE_GGUF_PANEL_OPS_H
#if defined(__AVX512F__) && defined(__AVX512VNNI__)

/* acc + the products of u's unsigned bytes with the 4 signed bytes at p (the same 4 in every
 * lane): one dpbusd with p as its broadcast memory operand (a separate broadcast would double
 * the inner loops' instructions); dpwssd_4: 16-bit pairs, the 2 signed 16-bit values at p. */
static inline __attribute__((always_inline)) __m512i dpbusd_4(__m512i acc, __m512i u,
                                                              const void *p) {
#if defined(__GNUC__)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
    return acc;
#else
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(v));
#endif
}

static inline __attribute__((always_inline)) __m512i dpwssd_4(__m512i acc, __m512i a,
                                                              const void *p) {
#if defined(__GNUC__)
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*(const int32_t *)p));
    return acc;
#else
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_dpwssd_epi32(acc, a, _mm512_set1_epi32(v));
#endif
}

#endif
#endif
