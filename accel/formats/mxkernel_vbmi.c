/* The AVX-512 VBMI path (byte permutes; same formats and block size as AVX2): two blocks' codes to integers with
 * one 512-bit vpermb / vpmultishiftqb / vpermb (an odd last block: the 256-bit form), 16-lane products summed per
 * block and scaled once. See mxkernel.h. */
#include "mxkernel.h"

#if MXK_X86
#define VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma")))

/* the 32 codes of a block -> value * 2^shift as int8 (256-bit VBMI ops): a masked load of the block's bytes, vpermb
 * puts the bytes of 8 codes in each qword, vpmultishiftqb moves code j of a qword to its byte j, and a byte table
 * (vpermt2b: 64 entries for 6-bit codes; vpermb with the 16 entries twice for 4-bit codes) gives the integer */
VBMI static inline __m256i block_ints_vbmi(int fast, const uint8_t *p) {
    if (fast == FAST_E2M3) {
        const __m256i spread = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 5, 5, 6, 7, 8, 9, 10, 11, 11, 11, 12, 13, 14, 15, 16,
                                                17, 17, 17, 18, 19, 20, 21, 22, 23, 23, 23);
        const __m256i shifts = _mm256_set1_epi64x(0x2A241E18120C0600LL); /* 0, 6, 12, ..., 42 */
        const __m256i pos = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22,
                                             24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60);
        const __m256i neg = _mm256_sub_epi8(_mm256_setzero_si256(), pos);
        __m256i v = _mm256_maskz_loadu_epi8(0xFFFFFFu, p);
        v = _mm256_multishift_epi64_epi8(shifts, _mm256_permutexvar_epi8(spread, v));
        return _mm256_permutex2var_epi8(pos, v, neg); /* index bits 0..5: bit 5 (the sign) picks the negatives */
    }
    if (fast == FAST_E2M1) {
        const __m256i spread = _mm256_setr_epi8(0, 1, 2, 3, 3, 3, 3, 3, 4, 5, 6, 7, 7, 7, 7, 7, 8, 9, 10, 11, 11, 11,
                                                11, 11, 12, 13, 14, 15, 15, 15, 15, 15);
        const __m256i shifts = _mm256_set1_epi64x(0x1C1814100C080400LL); /* 0, 4, ..., 28 */
        const __m256i table = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4,
                                               6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12); /* bit 4 ignored */
        __m256i v = _mm256_maskz_loadu_epi8(0xFFFFu, p);
        v = _mm256_multishift_epi64_epi8(shifts, _mm256_permutexvar_epi8(spread, v));
        return _mm256_permutexvar_epi8(v, table);
    }
    return _mm256_loadu_si256((const __m256i *)p);
}

/* the 64 codes of blocks b and b + 1 -> value * 2^shift as int8 (512-bit VBMI ops; block b in bytes 0..31): as
 * block_ints_vbmi, with one 512-bit permute, shift and table lookup for both blocks. vpermb over 64 bytes reads 6
 * index bits, so the table of 6-bit codes is one register (positives, then negatives: bit 5 is the sign), and the
 * 16 values of 4-bit codes are repeated four times (bits 4 and 5 of the index are the next code's, ignored). */
VBMI static inline __m512i pair_ints_vbmi(int fast, const uint8_t *p) {
    if (fast == FAST_E2M3) { /* qword q of the result: the 6 bytes of codes 8q .. 8q + 7 */
        const __m512i spread = _mm512_set_epi8(47, 47, 47, 46, 45, 44, 43, 42, 41, 41, 41, 40, 39, 38, 37, 36, 35, 35,
                                               35, 34, 33, 32, 31, 30, 29, 29, 29, 28, 27, 26, 25, 24, 23, 23, 23, 22,
                                               21, 20, 19, 18, 17, 17, 17, 16, 15, 14, 13, 12, 11, 11, 11, 10, 9, 8, 7,
                                               6, 5, 5, 5, 4, 3, 2, 1, 0);
        const __m512i shifts = _mm512_set1_epi64(0x2A241E18120C0600LL);
        const __m512i table = _mm512_set_epi8(-60, -56, -52, -48, -44, -40, -36, -32, -30, -28, -26, -24, -22, -20,
                                              -18, -16, -15, -14, -13, -12, -11, -10, -9, -8, -7, -6, -5, -4, -3, -2,
                                              -1, 0, 60, 56, 52, 48, 44, 40, 36, 32, 30, 28, 26, 24, 22, 20, 18, 16,
                                              15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        __m512i v = _mm512_maskz_loadu_epi8(0xFFFFFFFFFFFFULL, p);
        v = _mm512_multishift_epi64_epi8(shifts, _mm512_permutexvar_epi8(spread, v));
        return _mm512_permutexvar_epi8(v, table);
    }
    if (fast == FAST_E2M1) { /* qword q of the result: the 4 bytes of codes 8q .. 8q + 7 */
        const __m512i spread = _mm512_set_epi8(31, 31, 31, 31, 31, 30, 29, 28, 27, 27, 27, 27, 27, 26, 25, 24, 23, 23,
                                               23, 23, 23, 22, 21, 20, 19, 19, 19, 19, 19, 18, 17, 16, 15, 15, 15, 15,
                                               15, 14, 13, 12, 11, 11, 11, 11, 11, 10, 9, 8, 7, 7, 7, 7, 7, 6, 5, 4, 3,
                                               3, 3, 3, 3, 2, 1, 0);
        const __m512i shifts = _mm512_set1_epi64(0x1C1814100C080400LL);
        const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8,
                                                                   -12));
        __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
        v = _mm512_multishift_epi64_epi8(shifts, _mm512_permutexvar_epi8(spread, v));
        return _mm512_permutexvar_epi8(v, table);
    }
    return _mm512_loadu_si512((const void *)p);
}

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
