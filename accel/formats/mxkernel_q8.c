/* MX weights times int8 activations: integer dot products per block (MXFP6 E2M3, MXFP4 E2M1; block 32).
 *
 * The weights of a block are the integers value * 2^shift (E2M3: x8 in [-60, 60]; E2M1: x2 in [-12, 12]) times the
 * block's scale 2^(s - 127 - shift), exactly (mxkernel.h). The activations are quantized per block of 32 as
 * llama.cpp's Q8_0 does: d = amax / 127, q = rint(x * (127 / amax)) in [-127, 127] (float32 arithmetic, round half
 * to even; amax = 0 gives d = 0 and q = 0; a subnormal amax makes 127 / amax infinite: q = 0 where x = 0, else
 * +-127; a NaN or infinite amax gives d = NaN; portable loop and AVX2 alike). Then per weight row and x row:
 *
 *   p_{b,l} = sum_{e = 4l .. 4l+3} q[e] w[e]                 (int32, exact; l = 0..7, the 8 lanes of a block)
 *   acc[b % 4][l] = acc[b % 4][l] + (float)p_{b,l} * (ws_b * d_b)   (float32: a product, then a sum; no FMA)
 *   t = (acc[0] + acc[1]) + (acc[2] + acc[3])                    (lane by lane)
 *   y = ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7))
 *
 * ws_b * d_b is exact (ws_b is a power of two) unless it leaves float32's normal range. Every path computes exactly
 * this sequence (the file is compiled without floating-point contraction), so the portable loop, AVX2 (vpmaddubsw on
 * |w| and sign(w) * q: pair sums <= 2 * 127 * 60, far from int16 saturation; each block decoded once for up to 4 x
 * rows, the same int32 lanes per row), AVX-512 VNNI (vpdpbusd) and VNNI with VBMI's byte-permute unpacking
 * (pair_ints_vbmi, mxkernel.h: two blocks a 512-bit register, for one x row and, decoded once, for a tile of up to 4)
 * agree bit for bit with each other and with accel.formats.mxkernel_q8.reference_q8, whatever the rows per call and
 * the threads.
 */
#pragma GCC optimize("fp-contract=off")
#include <string.h>

#include "mxkernel.h"

/* ------------------------------------------------------------------------------------------------- activations */

static void quantize_portable(const float *x, int64_t s, int64_t xstride, int64_t nblocks, int8_t *q, float *d) {
    for (int64_t r = 0; r < s; r++)
        for (int64_t b = 0; b < nblocks; b++) {
            const float *xb = x + r * xstride + 32 * b;
            int8_t *qb = q + (r * nblocks + b) * 32;
            float amax = 0.0f;
            for (int e = 0; e < 32; e++) {
                float a = fabsf(xb[e]);
                amax = (a > amax || a != a) ? a : amax; /* NaN wins */
            }
            if (!(amax <= 3.402823466e38f)) { /* NaN or Inf: the block's outputs are NaN */
                memset(qb, 0, 32);
                d[r * nblocks + b] = NAN;
                continue;
            }
            d[r * nblocks + b] = amax / 127.0f;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (int e = 0; e < 32; e++) {
                float v = rintf(xb[e] * inv);
                qb[e] = (int8_t)(v != v ? 0 : v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v); /* 0 * inf: 0 */
            }
        }
}

#if MXK_X86
/* the same numbers 8 at a time: amax by vmaxps (any NaN or infinity is caught by a compare first), x * inv and
 * vroundps to nearest even (rintf in the default rounding mode), clamped, packed to bytes */
__attribute__((target("avx2,fma"))) static void quantize_avx2(const float *x, int64_t s, int64_t xstride,
                                                              int64_t nblocks, int8_t *q, float *d) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), big = _mm256_set1_ps(3.402823466e38f);
    const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (int64_t r = 0; r < s; r++)
        for (int64_t b = 0; b < nblocks; b++) {
            const float *xb = x + r * xstride + 32 * b;
            int8_t *qb = q + (r * nblocks + b) * 32;
            __m256 v[4], m = _mm256_setzero_ps();
            int bad = 0;
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                __m256 a = _mm256_and_ps(v[i], absmask);
                bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_NLE_UQ)); /* NaN or > FLT_MAX */
                m = _mm256_max_ps(m, a);
            }
            if (bad) {
                memset(qb, 0, 32);
                d[r * nblocks + b] = NAN;
                continue;
            }
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
            d[r * nblocks + b] = amax / 127.0f;
            const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            __m256i c[4];
            for (int i = 0; i < 4; i++) {
                __m256 t = _mm256_round_ps(_mm256_mul_ps(v[i], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                __m256 clamped = _mm256_min_ps(_mm256_max_ps(t, lo), hi); /* a NaN t gives lo: zeroed next */
                c[i] = _mm256_cvtps_epi32(_mm256_and_ps(clamped, _mm256_cmp_ps(t, t, _CMP_ORD_Q)));
            }
            /* packs work per 128-bit lane: dwords 0..3 of c0, c1, c2, c3 | 4..7 of each; the permute restores order */
            __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
            w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)qb, w);
        }
}
#endif

void mxk_quantize_q8(const float *x, int64_t s, int64_t xstride, int64_t nblocks, int8_t *q, float *d) {
#if MXK_X86
    if (mxk_isa_cap() >= 1 && have_avx2()) {
        quantize_avx2(x, s, xstride, nblocks, q, d);
        return;
    }
#endif
    quantize_portable(x, s, xstride, nblocks, q, d);
}

/* ------------------------------------------------------------------------------------------------- portable */

/* the block's 32 weight integers value * 2^shift */
static void block_ints(int fast, const uint8_t *row, int64_t b, int8_t w[32]) {
    static const int8_t e2m3[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                    16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60};
    static const int8_t e2m1[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    for (int e = 0; e < 32; e++) {
        if (fast == FAST_E2M3) {
            unsigned c = code_at(row, 32 * b + e, 6);
            w[e] = (int8_t)((c & 32u) ? -e2m3[c & 31u] : e2m3[c & 31u]);
        } else {
            unsigned c = code_at(row, 32 * b + e, 4);
            w[e] = (int8_t)((c & 8u) ? -e2m1[c & 7u] : e2m1[c & 7u]);
        }
    }
}

static float lanes_sum(const float l[8]) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

static void q8_portable(const job_t *j, int64_t n0, int64_t n1) {
    const int bytes = j->fast == FAST_E2M3 ? 24 : 16;
    const float *tab = SCALES[j->fast];
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = j->codes + n * j->nblocks * bytes;
        const uint8_t *sc = j->scales + n * j->nblocks;
        for (int64_t s = 0; s < j->s; s++) {
            float acc[4][8] = {{0}}, t[8];
            for (int64_t b = 0; b < j->nblocks; b++) {
                int8_t w[32];
                block_ints(j->fast, row, b, w);
                const int8_t *q = j->xq + (s * j->nblocks + b) * 32;
                float scale = tab[sc[b]] * j->xd[s * j->nblocks + b];
                for (int l = 0; l < 8; l++) {
                    int32_t p = 0;
                    for (int e = 4 * l; e < 4 * l + 4; e++) p += (int32_t)q[e] * w[e];
                    float prod = (float)p * scale;
                    acc[b % 4][l] = acc[b % 4][l] + prod;
                }
            }
            for (int l = 0; l < 8; l++) t[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
            j->y[s * j->n + n] = lanes_sum(t);
        }
    }
}

/* ------------------------------------------------------------------------------------------------- AVX2, VNNI */

#if MXK_X86
#define Q8_AVX2 __attribute__((target("avx2,fma")))
#define Q8_VNNI __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")))
#define Q8_VBMI __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512vbmi,avx512vnni")))

Q8_AVX2 static inline float q8_hsum(__m256 l) { /* ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

/* block b's weights for the AVX2 tile: their magnitudes |w| (vpmaddubsw's unsigned operand) and a byte whose sign is
 * w's (zero only where w is), to move the sign onto each x row's codes */
Q8_AVX2 static inline void q8_weights_abs(const int fast, const uint8_t *row, int64_t b, __m256i *aw, __m256i *sg) {
    if (fast == FAST_E2M3) {
        const __m256i c = unpack_fp6(row + 24 * b);
        *aw = e2m3_magnitudes(c);
        *sg = e2m3_signs(c); /* zero only where the code is 0, whose magnitude is 0 */
    } else {
        const __m256i w = e2m1_ints(row + 16 * b);
        *aw = _mm256_sign_epi8(w, w);
        *sg = w;
    }
}

/* block B (B % 4 == I) into acc[r][I] of each of the R rows: q . w = |w| . (sign(w) q), the same int32 lanes */
#define Q8_TILE_BLOCK(I, B, DOT)                                                                                     \
    do {                                                                                                             \
        __m256i aw, sg;                                                                                              \
        q8_weights_abs(fast, row, (B), &aw, &sg);                                                                    \
        const float ws = tab[sc[(B)]];                                                                               \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                      \
            const int64_t at = (s0 + r) * nb + (B);                                                                  \
            __m256i x = _mm256_loadu_si256((const __m256i *)(j->xq + 32 * at));                                     \
            __m256i p = DOT(aw, _mm256_sign_epi8(x, sg));                                                            \
            acc[r][I] = _mm256_add_ps(acc[r][I], _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(ws * j->xd[at]))); \
        }                                                                                                            \
    } while (0)

/* NAME(j, n, s0, fast, R): W row n against x rows s0 .. s0 + R - 1, each block decoded once for the R rows (a verify
 * call's rows); defined for AVX2, AVX-VNNI and AVX-512 VNNI, which differ only in DOT */
#define Q8_ROWS_FN(TARGET, NAME, DOT)                                                                                \
    TARGET static inline __attribute__((always_inline)) void NAME(const job_t *j, int64_t n, int64_t s0,             \
                                                                  const int fast, const int R) {                     \
        const int bytes = fast == FAST_E2M3 ? 24 : 16;                                                               \
        const int64_t nb = j->nblocks;                                                                               \
        const uint8_t *row = j->codes + n * nb * bytes, *sc = j->scales + n * nb;                                    \
        const float *tab = SCALES[fast];                                                                             \
        __m256 acc[MXK_X_TILE][4];                                                                                   \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                      \
            _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++) acc[r][a] = _mm256_setzero_ps();                   \
        }                                                                                                            \
        int64_t b = 0;                                                                                               \
        for (; b + 4 <= nb; b += 4) {                                                                                \
            _mm_prefetch((const char *)(row + bytes * b) + MXK_PREFETCH_BYTES, _MM_HINT_T0);                         \
            Q8_TILE_BLOCK(0, b, DOT);                                                                                \
            Q8_TILE_BLOCK(1, b + 1, DOT);                                                                            \
            Q8_TILE_BLOCK(2, b + 2, DOT);                                                                            \
            Q8_TILE_BLOCK(3, b + 3, DOT);                                                                            \
        }                                                                                                            \
        if (b < nb) Q8_TILE_BLOCK(0, b, DOT);                                                                        \
        if (b + 1 < nb) Q8_TILE_BLOCK(1, b + 1, DOT);                                                                \
        if (b + 2 < nb) Q8_TILE_BLOCK(2, b + 2, DOT);                                                                \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                      \
            __m256 t = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]));      \
            j->y[(s0 + r) * j->n + n] = q8_hsum(t);                                                                  \
        }                                                                                                            \
    }
Q8_ROWS_FN(Q8_AVX2, q8_rows_avx2, dot_u8s8_avx2) /* mxkernel.h */
Q8_ROWS_FN(Q8_VNNI, q8_rows_vnni, dot_u8s8_vnni)

/* the AVX2, AVX-VNNI and VNNI paths over W rows [n0, n1): x rows in tiles (MXK_X_TILES), `fast` and the tile size
 * constants at each inlined call */
#define Q8_TILE_CALL(ROWS, n, s0, R)                                                                                 \
    do {                                                                                                             \
        if (j->fast == FAST_E2M3)                                                                                    \
            ROWS(j, n, s0, FAST_E2M3, R);                                                                            \
        else                                                                                                         \
            ROWS(j, n, s0, FAST_E2M1, R);                                                                            \
    } while (0)
#define Q8_AVX2_TILE(n, s0, R) Q8_TILE_CALL(q8_rows_avx2, n, s0, R)
#define Q8_VNNI_TILE(n, s0, R) Q8_TILE_CALL(q8_rows_vnni, n, s0, R)
Q8_AVX2 static void q8_avx2(const job_t *j, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) MXK_X_TILES(Q8_AVX2_TILE, j, n);
}
Q8_VNNI static void q8_vnni(const job_t *j, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) MXK_X_TILES(Q8_VNNI_TILE, j, n);
}
#if MXK_AVXVNNI
Q8_ROWS_FN(MXK_AVXVNNI_FN, q8_rows_avxvnni, dot_u8s8_avxvnni)
#define Q8_AVXVNNI_TILE(n, s0, R) Q8_TILE_CALL(q8_rows_avxvnni, n, s0, R)
MXK_AVXVNNI_FN static void q8_avxvnni(const job_t *j, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) MXK_X_TILES(Q8_AVXVNNI_TILE, j, n);
}
#else
static void q8_avxvnni(const job_t *j, int64_t n0, int64_t n1) { q8_avx2(j, n0, n1); }
#endif

/* VNNI with VBMI's unpacking, two blocks per 512-bit register: blocks b, b + 1 (b % 4 == 0) update acc0 | acc1 and
 * b + 2, b + 3 update acc2 | acc3, the same per-block arithmetic as the other paths. AVX-512 has no byte sign
 * instruction: sign(q) * w is w negated where q < 0 (where q == 0 the product is 0 either way). */
#define Q8_PAIR(ACC, B)                                                                                              \
    do {                                                                                                             \
        __m512i w = pair_ints_vbmi(fast, row + bytes * (B));                                                         \
        __m512i x = _mm512_loadu_si512((const void *)(q + 32 * (B)));                                                \
        __m512i sw = _mm512_mask_sub_epi8(w, _mm512_movepi8_mask(x), _mm512_setzero_si512(), w);                     \
        __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), sw));         \
        __m512d lo = _mm512_castps_pd(_mm512_set1_ps(tab[sc[(B)]] * xd[(B)]));                                       \
        __m512 scv = _mm512_castpd_ps(                                                                               \
            _mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_set1_ps(tab[sc[(B) + 1]] * xd[(B) + 1])), 1));            \
        ACC = _mm512_add_ps(ACC, _mm512_mul_ps(f, scv));                                                             \
    } while (0)

/* one block into the low half of ACC (the high half gets + 0.0: unchanged) */
#define Q8_SINGLE(ACC, B)                                                                                            \
    do {                                                                                                             \
        __m256i w = block_ints_vbmi(fast, row + bytes * (B));                                                        \
        __m256i x = _mm256_loadu_si256((const __m256i *)(q + 32 * (B)));                                            \
        __m256i ax = _mm256_sign_epi8(x, x), sw = _mm256_sign_epi8(w, x);                                            \
        __m256 f = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sw));                          \
        __m256 prod = _mm256_mul_ps(f, _mm256_set1_ps(tab[sc[(B)]] * xd[(B)]));                                      \
        ACC = _mm512_add_ps(ACC, _mm512_zextps256_ps512(prod));                                                      \
    } while (0)

Q8_VBMI static inline __attribute__((always_inline)) void q8_row_vbmi(const job_t *j, int64_t n, int64_t s,
                                                                      const int fast) {
    const int bytes = fast == FAST_E2M3 ? 24 : 16;
    const uint8_t *row = j->codes + n * j->nblocks * bytes, *sc = j->scales + n * j->nblocks;
    const int8_t *q = j->xq + s * j->nblocks * 32;
    const float *xd = j->xd + s * j->nblocks, *tab = SCALES[fast];
    __m512 a01 = _mm512_setzero_ps(), a23 = a01;
    int64_t b = 0;
    for (; b + 4 <= j->nblocks; b += 4) {
        _mm_prefetch((const char *)(row + bytes * b) + MXK_PREFETCH_BYTES, _MM_HINT_T0);
        Q8_PAIR(a01, b);
        Q8_PAIR(a23, b + 2);
    }
    if (b + 2 <= j->nblocks) {
        Q8_PAIR(a01, b);
        if (b + 2 < j->nblocks) Q8_SINGLE(a23, b + 2);
    } else if (b < j->nblocks) {
        Q8_SINGLE(a01, b);
    }
    j->y[s * j->n + n] = q8_hsum(pair_acc_sum(a01, a23));
}

/* The x rows of a verify call, in tiles of R (MXK_X_TILES): blocks B, B + 1 decoded and their signs taken once for the
 * tile, then per row q . w = |w| . (sign(w) q) (x negated where w < 0; where w == 0, |w| is 0), two blocks per
 * 512-bit register as in Q8_PAIR, the scales ws_b * d_b formed lane by lane (the same products as the scalar ones) */
#define Q8_TILE_PAIR(A, B)                                                                                           \
    do {                                                                                                             \
        const __m512i w = pair_ints_vbmi(fast, row + bytes * (B)), aw = _mm512_abs_epi8(w);                          \
        const __mmask64 neg = _mm512_movepi8_mask(w);                                                                \
        const __m512d ws0 = _mm512_castps_pd(_mm512_set1_ps(tab[sc[(B)]]));                                        \
        const __m256d ws1 = _mm256_castps_pd(_mm256_set1_ps(tab[sc[(B) + 1]]));                                    \
        const __m512 wsv = _mm512_castpd_ps(_mm512_insertf64x4(ws0, ws1, 1));                                        \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                      \
            const int64_t at = (s0 + r) * nb + (B);                                                                  \
            const __m512i x = _mm512_loadu_si512((const void *)(j->xq + 32 * at));                                  \
            const __m512i sx = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);                             \
            const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, sx));               \
            const __m512 xdv = _mm512_permutexvar_ps(                                                                \
                pair_idx, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)(j->xd + at)))));        \
            acc[r][A] = _mm512_add_ps(acc[r][A], _mm512_mul_ps(f, _mm512_mul_ps(wsv, xdv)));                        \
        }                                                                                                            \
    } while (0)

/* one block B into the low half of accumulator A of each row (the high half untouched) */
#define Q8_TILE_SINGLE(A, B)                                                                                         \
    do {                                                                                                             \
        const __m256i w = block_ints_vbmi(fast, row + bytes * (B)), aw = _mm256_abs_epi8(w);                         \
        const float ws = tab[sc[(B)]];                                                                               \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                      \
            const int64_t at = (s0 + r) * nb + (B);                                                                  \
            const __m256i x = _mm256_loadu_si256((const __m256i *)(j->xq + 32 * at));                               \
            const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(x, w));             \
            const __m256 f = _mm256_cvtepi32_ps(p);                                                                  \
            const __m256 prod = _mm256_mul_ps(f, _mm256_set1_ps(ws * j->xd[at]));                                    \
            acc[r][A] = _mm512_mask_add_ps(acc[r][A], 0x00FF, acc[r][A], _mm512_castps256_ps512(prod));             \
        }                                                                                                            \
    } while (0)

/* W row n against x rows s0 .. s0 + R - 1: acc[r][0] holds acc0 | acc1, acc[r][1] acc2 | acc3 (blocks b % 4) */
Q8_VBMI static inline __attribute__((always_inline)) void q8_tile_vbmi(const job_t *j, int64_t n, int64_t s0,
                                                                       const int fast, const int R) {
    const int bytes = fast == FAST_E2M3 ? 24 : 16;
    const int64_t nb = j->nblocks;
    const uint8_t *row = j->codes + n * nb * bytes, *sc = j->scales + n * nb;
    const float *tab = SCALES[fast];
    const __m512i pair_idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc[MXK_X_TILE][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        _mm_prefetch((const char *)(row + bytes * b) + MXK_PREFETCH_BYTES, _MM_HINT_T0);
        Q8_TILE_PAIR(0, b);
        Q8_TILE_PAIR(1, b + 2);
    }
    if (b + 2 <= nb) {
        Q8_TILE_PAIR(0, b);
        if (b + 2 < nb) Q8_TILE_SINGLE(1, b + 2);
    } else if (b < nb) {
        Q8_TILE_SINGLE(0, b);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        j->y[(s0 + r) * j->n + n] = q8_hsum(pair_acc_sum(acc[r][0], acc[r][1]));
    }
}
#define Q8_VBMI_TILE(n, s0, R) Q8_TILE_CALL(q8_tile_vbmi, n, s0, R)

/* VBMI: one x row (a decode step) by the 512-bit row loop, more (a verify call) by the 512-bit tile */
Q8_VBMI static void q8_vbmi(const job_t *j, int64_t n0, int64_t n1) {
    if (j->s > 1) {
        for (int64_t n = n0; n < n1; n++) MXK_X_TILES(Q8_VBMI_TILE, j, n);
        return;
    }
    for (int64_t n = n0; n < n1; n++) {
        if (j->fast == FAST_E2M3)
            q8_row_vbmi(j, n, 0, FAST_E2M3);
        else
            q8_row_vbmi(j, n, 0, FAST_E2M1);
    }
}

int have_vnni(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = have_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
    }
    return cached;
}
#else
int have_vnni(void) { return 0; }
static void q8_avx2(const job_t *j, int64_t n0, int64_t n1) { q8_portable(j, n0, n1); }
static void q8_avxvnni(const job_t *j, int64_t n0, int64_t n1) { q8_portable(j, n0, n1); }
static void q8_vnni(const job_t *j, int64_t n0, int64_t n1) { q8_portable(j, n0, n1); }
static void q8_vbmi(const job_t *j, int64_t n0, int64_t n1) { q8_portable(j, n0, n1); }
#endif

void linear_q8(const job_t *j, int64_t n0, int64_t n1, int path) {
    if (path == 3)
        q8_vbmi(j, n0, n1);
    else if (path == 2)
        q8_vnni(j, n0, n1);
    else if (path == 1 && mxk_avxvnni())
        q8_avxvnni(j, n0, n1);
    else if (path == 1)
        q8_avx2(j, n0, n1);
    else
        q8_portable(j, n0, n1);
}
