/* The AVX2 + FMA path (block 32; MXFP6 E2M3, MXFP4 E2M1, MXINT8): a block's codes unpacked in a register to the
 * integers value * 2^shift, converted to float32 and scaled exactly. See mxkernel.h. */
#include "mxkernel.h"

#if MXK_X86
#define AVX2 __attribute__((target("avx2,fma")))

/* the 32 codes of an FP6 block (24 bytes) as 32 bytes, code i in byte i */
AVX2 static inline __m256i unpack_fp6(const uint8_t *p) {
    __m128i lo = _mm_loadu_si128((const __m128i *)p);       /* bytes 0..15: groups 0..3 at 0..11 */
    __m128i hi = _mm_loadu_si128((const __m128i *)(p + 8)); /* bytes 8..23: groups 4..7 at 4..15 */
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    const __m256i spread = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1, /* lane 0 */
                                            4, 5, 6, -1, 7, 8, 9, -1, 10, 11, 12, -1, 13, 14, 15, -1);
    v = _mm256_shuffle_epi8(v, spread); /* each dword: one 3-byte group = 4 codes of 6 bits */
    __m256i c = _mm256_and_si256(v, _mm256_set1_epi32(0x3F));
    c = _mm256_or_si256(c, _mm256_and_si256(_mm256_slli_epi32(v, 2), _mm256_set1_epi32(0x3F00)));
    c = _mm256_or_si256(c, _mm256_and_si256(_mm256_slli_epi32(v, 4), _mm256_set1_epi32(0x3F0000)));
    return _mm256_or_si256(c, _mm256_and_si256(_mm256_slli_epi32(v, 6), _mm256_set1_epi32(0x3F000000)));
}

/* E2M3 codes (bytes 0..63) -> value * 8 as int8: magnitude s.ee.mmm: e = 0, 1 give the low 4 bits themselves;
 * e = 2, 3 a table; then the sign (bit 5) */
AVX2 static inline __m256i e2m3_ints(__m256i c) {
    const __m256i high = _mm256_setr_epi8(16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60, 16, 18, 20,
                                          22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60);
    __m256i lo4 = _mm256_and_si256(c, _mm256_set1_epi8(0x0F));
    __m256i e1 = _mm256_cmpeq_epi8(_mm256_and_si256(c, _mm256_set1_epi8(0x10)), _mm256_set1_epi8(0x10));
    __m256i mag = _mm256_blendv_epi8(lo4, _mm256_shuffle_epi8(high, lo4), e1);
    return _mm256_sign_epi8(mag, _mm256_slli_epi16(c, 2)); /* bit 5 -> bit 7: negative; c == 0 gives mag 0 anyway */
}

/* the 32 codes of an FP4 block (16 bytes) -> value * 2 as int8, in code order */
AVX2 static inline __m256i e2m1_ints(const uint8_t *p) {
    const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    __m128i first = _mm_unpacklo_epi8(lo, hi), second = _mm_unpackhi_epi8(lo, hi);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_shuffle_epi8(table, first)),
                                   _mm_shuffle_epi8(table, second), 1);
}

/* the block's 32 int8 values times one scale -> 4 x 8 exact float32 weights */
AVX2 static inline void to_floats(__m256i v, float scale, __m256 w[4]) {
    __m256 sc = _mm256_set1_ps(scale);
    __m128i a = _mm256_castsi256_si128(v), b = _mm256_extracti128_si256(v, 1);
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), sc);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))), sc);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), sc);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), sc);
}

AVX2 static inline __attribute__((always_inline)) void block_weights(const int fast, const uint8_t *row,
                                                                     const float *scale_tab, int64_t b, uint8_t s,
                                                                     __m256 w[4]) {
    __m256i v;
    if (fast == FAST_E2M3)
        v = e2m3_ints(unpack_fp6(row + 24 * b));
    else if (fast == FAST_E2M1)
        v = e2m1_ints(row + 16 * b);
    else
        v = _mm256_loadu_si256((const __m256i *)(row + 32 * b));
    to_floats(v, scale_tab[s], w);
}

AVX2 static inline float hsum(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 t = _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));
    u = _mm_add_ss(u, _mm_movehdup_ps(u));
    return _mm_cvtss_f32(u);
}

/* one W row against x rows s0 and s0 + 1 (two when pair): each x row keeps its own 4 accumulators; `fast` and
 * `pair` are constants at every call site (one branch-free loop each) */
AVX2 static inline __attribute__((always_inline)) void row_dot(const job_t *j, const float *scale_tab, int64_t n,
                                                               int64_t s0, const int fast, const int pair) {
    const int bytes = fast == FAST_E2M3 ? 24 : fast == FAST_E2M1 ? 16 : 32;
    const uint8_t *row = j->codes + n * j->nblocks * bytes;
    const uint8_t *sc = j->scales + n * j->nblocks;
    const float *x0 = j->x + s0 * j->xstride, *x1 = pair ? x0 + j->xstride : x0;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t b = 0; b < j->nblocks; b++) {
        __m256 w[4];
        _mm_prefetch((const char *)(row + bytes * b) + MXK_PREFETCH_BYTES, _MM_HINT_T0);
        block_weights(fast, row, scale_tab, b, sc[b], w);
        const float *p = x0 + 32 * b;
        a0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(p), a0);
        a1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(p + 8), a1);
        a2 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(p + 16), a2);
        a3 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(p + 24), a3);
        if (pair) {
            const float *q = x1 + 32 * b;
            b0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(q), b0);
            b1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(q + 8), b1);
            b2 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(q + 16), b2);
            b3 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(q + 24), b3);
        }
    }
    j->y[s0 * j->n + n] = hsum(a0, a1, a2, a3);
    if (pair) j->y[(s0 + 1) * j->n + n] = hsum(b0, b1, b2, b3);
}

#define AVX2_ROWS(FAST)                                                                                              \
    AVX2 static void rows_avx2_##FAST(const job_t *j, const float *tab, int64_t n0, int64_t n1) {                    \
        for (int64_t n = n0; n < n1; n++) {                                                                           \
            int64_t s = 0;                                                                                            \
            for (; s + 1 < j->s; s += 2) row_dot(j, tab, n, s, FAST, 1);                                              \
            if (s < j->s) row_dot(j, tab, n, s, FAST, 0);                                                             \
        }                                                                                                             \
    }
AVX2_ROWS(1)
AVX2_ROWS(2)
AVX2_ROWS(3)

AVX2 void linear_avx2(const job_t *j, int64_t n0, int64_t n1) {
    const float *tab = SCALES[j->fast];
    if (j->fast == FAST_E2M3)
        rows_avx2_1(j, tab, n0, n1);
    else if (j->fast == FAST_E2M1)
        rows_avx2_2(j, tab, n0, n1);
    else
        rows_avx2_3(j, tab, n0, n1);
}

int have_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
}
#else
int have_avx2(void) { return 0; }
void linear_avx2(const job_t *j, int64_t n0, int64_t n1) { linear_portable(j, n0, n1); }
#endif
