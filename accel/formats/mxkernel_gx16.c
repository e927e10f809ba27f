/* GGUF Q8_0, Q4_0 and Q4_1 blocks interleaved 16 output rows at a time, times int8 activations: each block's dot
 * product summed in integers, then one float32 step per block, as llama.cpp's repacked CPU layouts do.
 *
 * Layout (accel/formats/ggml_x16.py writes it): the N weight rows in groups of 16 (the last group padded with zero
 * rows), each group's blocks in order. Block b of group g holds the 16 rows' block b:
 *   codes, Q8_0: 8 chunks of 64 bytes, chunk j byte 4i + e = code 4j + e of row i (int8 as stored);
 *          Q4_0, Q4_1: 4 chunks of 64 bytes, chunk j byte 4i + e = code 4j + e (low nibble) | code 16 + 4j + e
 *          (high nibble) of row i;
 *   scales: the 16 rows' float16 d (32 bytes), then for Q4_1 their float16 m (32 bytes).
 * The planes hold exactly the bytes of the stored blocks (codes and halves as they are, rearranged), so they are as
 * large as the stored planes for N a multiple of 16.
 *
 * Activations: int8 codes q and scales dx per block of 32 (mxk_quantize_q8), their integer sums sq[s, b] =
 * sum(q of block b) and u = dx * (float)sq. Per output row n and x row s:
 *
 *   P_b = sum_{e < 32} q[e] w[e]                               (int32, exact: Q4_0 w = nibble - 8, Q8_0 w = code)
 *   acc = acc + (float)P_b * (d_b * dx_b)                      (float32: a product, a product, then the sum)
 *   off = off + m_b * u_b                                      (Q4_1 only)
 *   y = acc (Q8_0, Q4_0), acc + off (Q4_1)
 *
 * over b = 0 .. nblocks - 1 in order (no floating-point contraction in this file). |P_b| <= 32 * 128 * 127 < 2^24,
 * so (float)P_b is exact, and the integer part may be computed in any order: AVX-512 VNNI (16 rows a register,
 * vpdpbusd on unsigned codes: Q4_0's nibbles with -8 * sq as the starting sum, Q8_0's codes + 128 with -128 * sq),
 * AVX2 (8 rows a register: vpmaddubsw on nibbles, or on |w| and sign(w) * q for Q8_0, pair sums within int16) and
 * the portable loop agree bit for bit with accel.formats.ggml_x16.reference_q8_x16, whatever the rows per call and
 * the threads. Each weight block is loaded once for up to 4 x rows (MXK_X_TILE).
 */
#pragma GCC optimize("fp-contract=off")
#include <string.h>

#include "mxkernel.h"

/* bytes of one block of a 16-row group: codes, scales */
static inline int64_t x16_code_bytes(int fast) { return 16 * (int64_t)block_code_bytes(fast); }
static inline int64_t x16_scale_bytes(int fast) { return 16 * (int64_t)block_scale_bytes(fast); }

/* ------------------------------------------------------------------------------------------------- portable */

/* code e of row i in block chunk c (a group's block): the signed weight integer */
static inline int32_t x16_int(int fast, const uint8_t *c, int i, int e) {
    if (fast == FAST_Q8_0) return (int8_t)c[64 * (e / 4) + 4 * i + e % 4];
    const int hi = e >= 16, k = e % 16;
    const int v = (c[64 * (k / 4) + 4 * i + k % 4] >> (4 * hi)) & 15;
    return fast == FAST_Q4_0 ? v - 8 : v;
}

static void x16_portable(const job_t *j, int64_t g0, int64_t g1) {
    const int fast = j->fast;
    const int64_t nb = j->nblocks, cb = x16_code_bytes(fast), sb = x16_scale_bytes(fast);
    for (int64_t g = g0; g < g1; g++) {
        const int live = j->width - 16 * g < 16 ? (int)(j->width - 16 * g) : 16;
        for (int64_t s = 0; s < j->s; s++)
            for (int i = 0; i < live; i++) {
                float acc = 0.0f, off = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const uint8_t *c = j->codes + (g * nb + b) * cb, *sc = j->scales + (g * nb + b) * sb;
                    const int8_t *q = j->xq + (s * nb + b) * 32;
                    int32_t p = 0;
                    for (int e = 0; e < 32; e++) p += (int32_t)q[e] * x16_int(fast, c, i, e);
                    const float cd = half_at(sc + 2 * i) * j->xd[s * nb + b], prod = (float)p * cd;
                    acc = acc + prod;
                    if (fast == FAST_Q4_1) {
                        const float o = half_at(sc + 32 + 2 * i) * j->xu[s * nb + b];
                        off = off + o;
                    }
                }
                j->y[s * j->width + 16 * g + i] = fast == FAST_Q4_1 ? acc + off : acc;
            }
    }
}

/* ------------------------------------------------------------------------------------------------- x86 */

#if MXK_X86
#define X16_AVX2 __attribute__((target("avx2,fma,f16c")))
#define X16_V512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

/* the blocks' code lines PF blocks ahead of block b (the prefetcher does not follow a group's stride alone) */
#define X16_PREFETCH_BLOCKS 4

/* x rows s0 .. s0 + R - 1 of group g, lanes 8h .. 8h + 7 (h = 0, 1): 8 rows a 256-bit register */
X16_AVX2 static inline __attribute__((always_inline)) void x16_half_avx2(const job_t *j, int64_t g, int h, int64_t s0,
                                                                         const int fast, const int R) {
    const int64_t nb = j->nblocks, cb = x16_code_bytes(fast), sb = x16_scale_bytes(fast);
    const uint8_t *codes = j->codes + g * nb * cb, *scales = j->scales + g * nb * sb;
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[MXK_X_TILE], off[MXK_X_TILE];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = off[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = codes + b * cb + 32 * h;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + b * sb + 16 * h)));
        __m256i w[8], aw[8];
        if (fast == FAST_Q8_0) {
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                w[k] = _mm256_loadu_si256((const __m256i *)(c + 64 * k));
                aw[k] = _mm256_sign_epi8(w[k], w[k]);
            }
        } else {
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m256i t = _mm256_loadu_si256((const __m256i *)(c + 64 * k));
                aw[k] = _mm256_and_si256(t, nib);
                aw[k + 4] = _mm256_and_si256(_mm256_srli_epi16(t, 4), nib);
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const int64_t at = (s0 + r) * nb + b;
            const int8_t *q = j->xq + 32 * at;
            __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                int32_t word;
                memcpy(&word, q + 4 * k, 4);
                __m256i x = _mm256_set1_epi32(word);
                if (fast == FAST_Q8_0) x = _mm256_sign_epi8(x, w[k]);
                const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[k], x), ones);
                if (k % 2) p1 = _mm256_add_epi32(p1, p); else p0 = _mm256_add_epi32(p0, p);
            }
            __m256i p = _mm256_add_epi32(p0, p1);
            if (fast == FAST_Q4_0) p = _mm256_sub_epi32(p, _mm256_set1_epi32(8 * j->xs[at]));
            const __m256 cd = _mm256_mul_ps(d, _mm256_set1_ps(j->xd[at]));
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_cvtepi32_ps(p), cd));
            if (fast == FAST_Q4_1) {
                const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + b * sb + 32 + 16 * h)));
                off[r] = _mm256_add_ps(off[r], _mm256_mul_ps(m, _mm256_set1_ps(j->xu[at])));
            }
        }
    }
    const int live = (int)(j->width - 16 * g - 8 * h);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(live), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        const __m256 y = fast == FAST_Q4_1 ? _mm256_add_ps(acc[r], off[r]) : acc[r];
        _mm256_maskstore_ps(j->y + (s0 + r) * j->width + 16 * g + 8 * h, mask, y);
    }
}

/* x rows s0 .. s0 + R - 1 of group g: 16 rows a 512-bit register, vpdpbusd */
X16_V512 static inline __attribute__((always_inline)) void x16_tile512(const job_t *j, int64_t g, int64_t s0,
                                                                       const int fast, const int R) {
    const int64_t nb = j->nblocks, cb = x16_code_bytes(fast), sb = x16_scale_bytes(fast);
    const uint8_t *codes = j->codes + g * nb * cb, *scales = j->scales + g * nb * sb;
    const __m512i nib = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    const int bias = fast == FAST_Q8_0 ? 128 : fast == FAST_Q4_0 ? 8 : 0; /* unsigned codes = w + bias */
    __m512 acc[MXK_X_TILE], off[MXK_X_TILE];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = off[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = codes + b * cb;
        for (int64_t line = 0; line < cb; line += 64)
            _mm_prefetch((const char *)(c + X16_PREFETCH_BLOCKS * cb + line), _MM_HINT_T0);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + b * sb)));
        __m512i w[8];
        if (fast == FAST_Q8_0) {
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
                w[k] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(c + 64 * k)), flip);
        } else {
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m512i t = _mm512_loadu_si512((const void *)(c + 64 * k));
                w[k] = _mm512_and_si512(t, nib);
                w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(t, 4), nib);
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const int64_t at = (s0 + r) * nb + b;
            const int8_t *q = j->xq + 32 * at;
            __m512i p0 = _mm512_set1_epi32(-bias * j->xs[at]), p1 = _mm512_setzero_si512();
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                int32_t word;
                memcpy(&word, q + 4 * k, 4);
                if (k % 2)
                    p1 = _mm512_dpbusd_epi32(p1, w[k], _mm512_set1_epi32(word));
                else
                    p0 = _mm512_dpbusd_epi32(p0, w[k], _mm512_set1_epi32(word));
            }
            const __m512 cd = _mm512_mul_ps(d, _mm512_set1_ps(j->xd[at]));
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(p0, p1)), cd));
            if (fast == FAST_Q4_1) {
                const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + b * sb + 32)));
                off[r] = _mm512_add_ps(off[r], _mm512_mul_ps(m, _mm512_set1_ps(j->xu[at])));
            }
        }
    }
    const int live = (int)(j->width - 16 * g);
    const __mmask16 mask = live >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << live) - 1);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        const __m512 y = fast == FAST_Q4_1 ? _mm512_add_ps(acc[r], off[r]) : acc[r];
        _mm512_mask_storeu_ps(j->y + (s0 + r) * j->width + 16 * g, mask, y);
    }
}

/* the tile of group g (a CALL of MXK_X_TILES), `fast` a constant at each inlined call */
#define X16_CALL(TILE, g, s0, R)                                                                                     \
    do {                                                                                                             \
        switch (j->fast) {                                                                                           \
        case FAST_Q8_0: TILE(g, s0, FAST_Q8_0, R); break;                                                            \
        case FAST_Q4_0: TILE(g, s0, FAST_Q4_0, R); break;                                                            \
        default: TILE(g, s0, FAST_Q4_1, R); break;                                                                   \
        }                                                                                                            \
    } while (0)
#define X16_HALVES(g, s0, F, R)                                                                                      \
    do {                                                                                                             \
        x16_half_avx2(j, g, 0, s0, F, R);                                                                            \
        if (j->width - 16 * (g) > 8) x16_half_avx2(j, g, 1, s0, F, R);                                               \
    } while (0)
#define X16_AVX2_TILE(g, s0, R) X16_CALL(X16_HALVES, g, s0, R)
#define X16_512(g, s0, F, R) x16_tile512(j, g, s0, F, R)
#define X16_V512_TILE(g, s0, R) X16_CALL(X16_512, g, s0, R)
X16_AVX2 static void x16_avx2(const job_t *j, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++) MXK_X_TILES(X16_AVX2_TILE, j, g);
}
X16_V512 static void x16_v512(const job_t *j, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++) MXK_X_TILES(X16_V512_TILE, j, g);
}
#else
static void x16_avx2(const job_t *j, int64_t g0, int64_t g1) { x16_portable(j, g0, g1); }
static void x16_v512(const job_t *j, int64_t g0, int64_t g1) { x16_portable(j, g0, g1); }
#endif

/* groups [g0, g1) of an interleaved job: AVX-512 VNNI where mxk_q8_path allows it (2, 3), AVX2 (1), else portable */
void linear_gx16(const job_t *j, int64_t g0, int64_t g1, int path) {
    if (path >= 2)
        x16_v512(j, g0, g1);
    else if (path == 1)
        x16_avx2(j, g0, g1);
    else
        x16_portable(j, g0, g1);
}
