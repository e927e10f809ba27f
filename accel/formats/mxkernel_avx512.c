/* The AVX-512F path of GGUF blocks (Q8_0, Q4_0, Q4_1, fast 4, 5, 6; the repacked Q4_F32, I8_F32, Q5S_F32,
 * Q5_F32, fast 7..10): a block's 32 weights decoded exactly to two 16-lane float32 vectors (the integers q, q - 8,
 * q - 16 or q converted, a 5-bit type's fifth bits added by mask first, times the block's d; Q4_1, Q4_F32, Q5S_F32,
 * Q5_F32: fma(q, d, m), I8_F32: fma(q, d0, m0) and fma(q, d1, m1), which round d * q + m once since
 * d * q is exact; a row's float16 halves converted 16 at a time into a float32 buffer first, float32 scales copied,
 * so each block reads its d and m as memory broadcasts), then multiplied into up to 8 x rows
 * at once (a
 * verify call of K + 1 <= 8 tokens decodes each block once). Per x row two accumulators (weights 0..15 and 16..31 of
 * every block) take the same FMA sequence whatever the number of rows beside it. Only AVX-512F (+ F16C, FMA) is
 * needed: CPUs with AVX-512 but without VBMI run it too. See mxkernel.h. */
#include <string.h>

#include "mxkernel.h"

#if MXK_X86
#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

/* block b's 32 exact float32 weights: w0 (weights 0..15), w1 (16..31); dm: the block's d (and Q4_1's m) as float32,
 * read as memory broadcasts (no shuffle-port work) */
AVX512 static inline __attribute__((always_inline)) void gguf_block512(const int fast, const uint8_t *codes,
                                                                       const float *dm, __m512 *w0, __m512 *w1) {
    __m512i q0, q1;
    if (!nibble_codes(fast)) { /* int8 codes: Q8_0, I8_F32 */
        q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)codes));
        q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(codes + 16)));
    } else {
        __m128i b = _mm_loadu_si128((const __m128i *)codes);
        q0 = _mm512_cvtepu8_epi32(_mm_and_si128(b, _mm_set1_epi8(0x0F)));
        q1 = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F)));
        if (q5_codes(fast)) { /* bit i of the 4 bytes after the nibbles: code i's fifth bit */
            uint32_t m;
            memcpy(&m, codes + 16, 4);
            q0 = _mm512_mask_add_epi32(q0, (__mmask16)(m & 0xFFFFu), q0, _mm512_set1_epi32(16));
            q1 = _mm512_mask_add_epi32(q1, (__mmask16)(m >> 16), q1, _mm512_set1_epi32(16));
        }
        if (code_offset(fast)) {
            q0 = _mm512_sub_epi32(q0, _mm512_set1_epi32(code_offset(fast)));
            q1 = _mm512_sub_epi32(q1, _mm512_set1_epi32(code_offset(fast)));
        }
    }
    __m512 d = _mm512_set1_ps(dm[0]);
    if (has_offset(fast)) { /* fma(q, d, m) rounds d * q + m once, d * q being exact */
        const int second = fast == FAST_I8_F32 ? 2 : 0; /* weights 16..31: their own d and m */
        *w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q0), d, _mm512_set1_ps(dm[1]));
        *w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q1), _mm512_set1_ps(dm[second]), _mm512_set1_ps(dm[second + 1]));
    } else {
        *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d);
        *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d);
    }
}

/* blocks a row's scales are converted for at once (a stack buffer of GGUF_CHUNK * 4 floats) */
#define GGUF_CHUNK 64

/* the scale values of nb blocks at s (block_floats(fast) each) -> float32 dm, exactly: float16 halves by F16C,
 * float32 values copied */
AVX512 static inline void scales_to_floats(const int fast, const uint8_t *s, int64_t nb, float *dm) {
    const int64_t n = nb * block_floats(fast);
    if (f32_scales(fast)) {
        memcpy(dm, s, (size_t)n * sizeof(float));
        return;
    }
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dm + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 2 * i))));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dm[i] = _cvtsh_ss(h);
    }
}

/* one W row against the nx (1 to 8) x rows from s0; `fast` and `nx` are constants at every call site */
AVX512 static inline __attribute__((always_inline)) void row_dot_512(const job_t *j, int64_t n, int64_t s0,
                                                                     const int fast, const int nx) {
    const int bytes = block_code_bytes(fast), sbytes = block_scale_bytes(fast), floats = block_floats(fast);
    const int64_t nblocks = j->nblocks;
    const uint8_t *row = j->codes + n * nblocks * bytes, *sc = j->scales + n * nblocks * sbytes;
    const float *xr[8];
    __m512 lo[8], hi[8];
    float dm[GGUF_CHUNK * 4];
#pragma GCC unroll 8
    for (int r = 0; r < nx; r++) {
        xr[r] = j->x + (s0 + r) * j->xstride;
        lo[r] = hi[r] = _mm512_setzero_ps();
    }
    for (int64_t b0 = 0; b0 < nblocks; b0 += GGUF_CHUNK) {
        int64_t b1 = b0 + GGUF_CHUNK < nblocks ? b0 + GGUF_CHUNK : nblocks;
        scales_to_floats(fast, sc + sbytes * b0, b1 - b0, dm);
        for (int64_t b = b0; b < b1; b++) {
            _mm_prefetch((const char *)(row + bytes * b) + MXK_PREFETCH_BYTES, _MM_HINT_T0);
            __m512 w0, w1;
            gguf_block512(fast, row + bytes * b, dm + (b - b0) * floats, &w0, &w1);
#pragma GCC unroll 8
            for (int r = 0; r < nx; r++) {
                lo[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr[r] + 32 * b), lo[r]);
                hi[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr[r] + 32 * b + 16), hi[r]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nx; r++) j->y[(s0 + r) * j->n + n] = _mm512_reduce_add_ps(_mm512_add_ps(lo[r], hi[r]));
}

#define ROWS_512(FAST)                                                                                               \
    AVX512 static void rows_512_##FAST(const job_t *j, int64_t n0, int64_t n1) {                                      \
        for (int64_t n = n0; n < n1; n++) {                                                                           \
            for (int64_t s = 0; s < j->s; s += 8) {                                                                   \
                switch (j->s - s < 8 ? (int)(j->s - s) : 8) {                                                          \
                case 1: row_dot_512(j, n, s, FAST, 1); break;                                                         \
                case 2: row_dot_512(j, n, s, FAST, 2); break;                                                         \
                case 3: row_dot_512(j, n, s, FAST, 3); break;                                                         \
                case 4: row_dot_512(j, n, s, FAST, 4); break;                                                         \
                case 5: row_dot_512(j, n, s, FAST, 5); break;                                                         \
                case 6: row_dot_512(j, n, s, FAST, 6); break;                                                         \
                case 7: row_dot_512(j, n, s, FAST, 7); break;                                                         \
                default: row_dot_512(j, n, s, FAST, 8); break;                                                        \
                }                                                                                                     \
            }                                                                                                         \
        }                                                                                                             \
    }
ROWS_512(4)
ROWS_512(5)
ROWS_512(6)
ROWS_512(7)
ROWS_512(8)
ROWS_512(9)
ROWS_512(10)

void linear_gguf_avx512(const job_t *j, int64_t n0, int64_t n1) {
    if (j->fast == FAST_Q8_0)
        rows_512_4(j, n0, n1);
    else if (j->fast == FAST_Q4_0)
        rows_512_5(j, n0, n1);
    else if (j->fast == FAST_Q4_1)
        rows_512_6(j, n0, n1);
    else if (j->fast == FAST_Q4_F32)
        rows_512_7(j, n0, n1);
    else if (j->fast == FAST_I8_F32)
        rows_512_8(j, n0, n1);
    else if (j->fast == FAST_Q5S_F32)
        rows_512_9(j, n0, n1);
    else if (j->fast == FAST_Q5_F32)
        rows_512_10(j, n0, n1);
    else
        linear_avx2(j, n0, n1);
}

int have_avx512f(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = have_avx2() && __builtin_cpu_supports("avx512f");
    }
    return cached;
}
#else
int have_avx512f(void) { return 0; }
void linear_gguf_avx512(const job_t *j, int64_t n0, int64_t n1) { linear_portable(j, n0, n1); }
#endif
