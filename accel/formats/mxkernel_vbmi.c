/* The AVX-512 VBMI path (byte permutes; same formats and block size as AVX2): two blocks' codes to integers with
 * one 512-bit vpermb / vpmultishiftqb / vpermb (an odd last block: the 256-bit form), 16-lane products summed per
 * block and scaled once. See mxkernel.h. */
#include "mxkernel.h"

#if MXK_X86
#define VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma")))

/* block b of one W row against one x row: the 32 integer * x products summed (float32), times the block's scale */
#define VBMI_BLOCK(acc, w0, w1, xrow, b, scale)                                                                      \
    acc = _mm512_fmadd_ps(                                                                                          \
        _mm512_fmadd_ps(w1, _mm512_loadu_ps((xrow) + 32 * (b) + 16), _mm512_mul_ps(w0, _mm512_loadu_ps((xrow) + 32 * (b)))), \
        scale, acc)

/* one W row against the nx (1 to 8) x rows from s0: per block p = sum of the 32 integer * x products (float32),
 * then acc += p * 2^(s - 127 - shift); even and odd blocks go to two accumulators per x row. Each x row gets the same
 * operations whatever nx, so its result does not depend on the rows beside it. `fast` and `nx` are constants at every
 * call site, so each combination compiles to its own branch-free loop (the per-row arrays stay in registers). */
VBMI static inline __attribute__((always_inline)) void row_dot_vbmi(const job_t *j, const float *scale_tab, int64_t n,
                                                                    int64_t s0, const int fast, const int nx) {
    const int bytes = fast == FAST_E2M3 ? 24 : fast == FAST_E2M1 ? 16 : 32;
    const int64_t nblocks = j->nblocks;
    const uint8_t *row = j->codes + n * nblocks * bytes;
    const uint8_t *sc = j->scales + n * nblocks;
    const float *xr[8];
    __m512 even[8], odd[8];
#pragma GCC unroll 8
    for (int r = 0; r < nx; r++) {
        xr[r] = j->x + (s0 + r) * j->xstride;
        even[r] = odd[r] = _mm512_setzero_ps();
    }
    int64_t b = 0;
    for (; b + 1 < nblocks; b += 2) {
        _mm_prefetch((const char *)(row + bytes * b) + MXK_PREFETCH_BYTES, _MM_HINT_T0);
        __m512i v = pair_ints_vbmi(fast, row + bytes * b);
        __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_castsi512_si128(v)));
        __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 1)));
        __m512 w2 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 2)));
        __m512 w3 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 3)));
        __m512 s_even = _mm512_set1_ps(scale_tab[sc[b]]), s_odd = _mm512_set1_ps(scale_tab[sc[b + 1]]);
#pragma GCC unroll 8
        for (int r = 0; r < nx; r++) {
            VBMI_BLOCK(even[r], w0, w1, xr[r], b, s_even);
            VBMI_BLOCK(odd[r], w2, w3, xr[r], b + 1, s_odd);
        }
    }
    if (b < nblocks) { /* an odd last block: the even accumulator, as in the pairs above */
        __m256i v = block_ints_vbmi(fast, row + bytes * b);
        __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v)));
        __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1)));
        __m512 s_even = _mm512_set1_ps(scale_tab[sc[b]]);
#pragma GCC unroll 8
        for (int r = 0; r < nx; r++) VBMI_BLOCK(even[r], w0, w1, xr[r], b, s_even);
    }
#pragma GCC unroll 8
    for (int r = 0; r < nx; r++) j->y[(s0 + r) * j->n + n] = _mm512_reduce_add_ps(_mm512_add_ps(even[r], odd[r]));
}

/* each W row decoded once for up to 8 x rows (a verify call of K + 1 <= 8 tokens: one pass) */
#define VBMI_ROWS(FAST)                                                                                              \
    VBMI static void rows_vbmi_##FAST(const job_t *j, const float *tab, int64_t n0, int64_t n1) {                    \
        for (int64_t n = n0; n < n1; n++) {                                                                           \
            for (int64_t s = 0; s < j->s; s += 8) {                                                                   \
                switch (j->s - s < 8 ? (int)(j->s - s) : 8) {                                                          \
                case 1: row_dot_vbmi(j, tab, n, s, FAST, 1); break;                                                   \
                case 2: row_dot_vbmi(j, tab, n, s, FAST, 2); break;                                                   \
                case 3: row_dot_vbmi(j, tab, n, s, FAST, 3); break;                                                   \
                case 4: row_dot_vbmi(j, tab, n, s, FAST, 4); break;                                                   \
                case 5: row_dot_vbmi(j, tab, n, s, FAST, 5); break;                                                   \
                case 6: row_dot_vbmi(j, tab, n, s, FAST, 6); break;                                                   \
                case 7: row_dot_vbmi(j, tab, n, s, FAST, 7); break;                                                   \
                default: row_dot_vbmi(j, tab, n, s, FAST, 8); break;                                                  \
                }                                                                                                     \
            }                                                                                                         \
        }                                                                                                             \
    }
VBMI_ROWS(1)
VBMI_ROWS(2)
VBMI_ROWS(3)

VBMI void linear_vbmi(const job_t *j, int64_t n0, int64_t n1) {
    if (is_gguf(j->fast)) { /* GGUF blocks have their own AVX-512F path (mxkernel_avx512.c) */
        linear_gguf_avx512(j, n0, n1);
        return;
    }
    const float *tab = SCALES[j->fast];
    if (j->fast == FAST_E2M3)
        rows_vbmi_1(j, tab, n0, n1);
    else if (j->fast == FAST_E2M1)
        rows_vbmi_2(j, tab, n0, n1);
    else
        rows_vbmi_3(j, tab, n0, n1);
}

int have_vbmi(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
                 __builtin_cpu_supports("fma");
    }
    return cached;
}
#else
int have_vbmi(void) { return 0; }
void linear_vbmi(const job_t *j, int64_t n0, int64_t n1) { linear_portable(j, n0, n1); }
#endif
