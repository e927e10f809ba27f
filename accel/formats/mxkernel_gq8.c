/* GGUF blocks times int8 activations: integer dot products per block, as llama.cpp computes its quantized types.
 *
 * Weights (every GGUF layout, fast 4..10; mxkernel.h): a block's 32 integers w (Q8_0, I8_F32: the int8 codes; Q4_0:
 * nibble - 8; Q4_1, Q4_F32: the nibble; Q5S_F32, Q5_F32: nibble + 16 * fifth bit, minus 16 for Q5S_F32), its scale d
 * and (Q4_1 and the float32-scale layouts) offset m, each weight d * w (+ m).
 * Activations: quantized per block of 32 to int8 by mxk_quantize_q8 (mxkernel_q8.c: q, scale dx), and for the types
 * with an offset u = dx * (float)sum(q) (float32 product; the sum is an exact integer). Then per W row and x row:
 *
 *   p_{b,l} = sum_{e = 4l .. 4l+3} q[e] w[e]                  (int32, exact; l = 0..7, the 8 lanes of a block)
 *   c_b = d_b * dx_b                                           (float32 product)
 *   acc[b % 4][l] = acc[b % 4][l] + (float)p_{b,l} * c_b       (a product, then a sum; no FMA)
 *   off[b % 8] = off[b % 8] + m_b * u_b                        (offset types only)
 *   t = (acc[0] + acc[1]) + (acc[2] + acc[3]);  y = H(t)  (+ H(off) for the offset types)
 *   H(l) = ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))
 *
 * I8_F32 holds a d and an m per 16 weights: lanes 0..3 use c = d_0 * dx, lanes 4..7 c = d_1 * dx, and the offset term
 * is m_0 * u_0 + m_1 * u_1 (products, then the sum) over the two halves' sums u_h = dx * (float)sum(q of half h).
 *
 * since sum_e x_e (d w_e + m) = d dx sum(q w) + m dx sum(q) for the quantized x. Every path computes exactly this
 * sequence (no floating-point contraction in this file), so the portable loop, AVX2 (vpmaddubsw on |w| and
 * sign(w) * q: pair sums <= 2 * 128 * 127, within int16) and AVX-512 VNNI agree bit
 * for bit with each other and with accel.formats.mxkernel_q8.reference_q8_ggml, whatever the rows per call and the
 * threads. The AVX2 path decodes each block once for up to 4 x rows (a verify call's rows), reads 8 blocks' scales as
 * one vector (F16C converts float16 halves exactly) and keeps a tile's accumulators in registers. The AVX-512 VNNI
 * path puts two blocks in a 512-bit register (vpdpbusd on |w| and sign(w) * q; acc0 | acc1 and acc2 | acc3 share a
 * register, the same lanes); I8_F32, with two scales a block, runs the AVX2 tile with vpdpbusd there.
 */
#pragma GCC optimize("fp-contract=off")
#include <string.h>

#include "mxkernel.h"

/* 1 for the block types whose integers may be negative (the dot products then move the sign onto q) */
static inline int signed_ints(int fast) { return fast != FAST_Q4_1 && fast != FAST_Q4_F32 && fast != FAST_Q5_F32; }

/* block b's scale d and offset m (0 where the type has none), exactly (I8_F32: those of weights 0..15) */
static inline void gq8_scales(int fast, const uint8_t *sc, int64_t b, float *d, float *m) {
    if (fast == FAST_I8_F32) {
        memcpy(d, sc + 16 * b, 4);
        memcpy(m, sc + 16 * b + 4, 4);
    } else if (f32_scales(fast)) {
        memcpy(d, sc + 8 * b, 4);
        memcpy(m, sc + 8 * b + 4, 4);
    } else if (fast == FAST_Q4_1) {
        *d = half_at(sc + 4 * b);
        *m = half_at(sc + 4 * b + 2);
    } else {
        *d = half_at(sc + 2 * b);
        *m = 0.0f;
    }
}

/* u[r, b, h] = d[r, b] * (float)sum(q[r, b, 32 / halves * h ..]) for S rows of nblocks blocks: halves 1 (the
 * block's sum) or 2 (the sums of codes 0..15 and 16..31, for I8_F32's two offsets); sq (NULL: not wanted) gets the
 * integer sums themselves, in the same order (mxkernel_gx16.c) */
void mxk_q8_block_sums(const int8_t *q, const float *d, int64_t rows, int64_t nblocks, int halves, float *u,
                       int32_t *sq) {
    const int len = 32 / halves;
    for (int64_t i = 0; i < rows * nblocks; i++)
        for (int h = 0; h < halves; h++) {
            int32_t sum = 0;
            for (int e = 0; e < len; e++) sum += q[32 * i + len * h + e];
            u[halves * i + h] = d[i] * (float)sum;
            if (sq) sq[halves * i + h] = sum;
        }
}

/* ------------------------------------------------------------------------------------------------- portable */

static void gq8_ints(int fast, const uint8_t *blk, int32_t w[32]) {
    for (int e = 0; e < 32; e++) {
        if (!nibble_codes(fast)) { /* Q8_0, I8_F32 */
            w[e] = (int8_t)blk[e];
            continue;
        }
        w[e] = e < 16 ? blk[e] & 15 : blk[e - 16] >> 4;
        if (q5_codes(fast)) w[e] |= ((blk[16 + e / 8] >> (e % 8)) & 1) << 4;
        w[e] -= code_offset(fast);
    }
}

static float lanes8(const float l[8]) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

static void gq8_portable(const job_t *j, int64_t n0, int64_t n1) {
    const int fast = j->fast, bytes = block_code_bytes(fast), sbytes = block_scale_bytes(fast);
    const int64_t nb = j->nblocks;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = j->codes + n * nb * bytes, *sc = j->scales + n * nb * sbytes;
        for (int64_t s = 0; s < j->s; s++) {
            float acc[4][8] = {{0}}, off[8] = {0}, t[8];
            for (int64_t b = 0; b < nb; b++) {
                int32_t w[32];
                float d, m, d1 = 0.0f, m1 = 0.0f;
                gq8_ints(fast, row + bytes * b, w);
                gq8_scales(fast, sc, b, &d, &m);
                if (fast == FAST_I8_F32) { /* weights 16..31: their own d and m */
                    memcpy(&d1, sc + 16 * b + 8, 4);
                    memcpy(&m1, sc + 16 * b + 12, 4);
                }
                const int8_t *q = j->xq + (s * nb + b) * 32;
                const float dx = j->xd[s * nb + b], c0 = d * dx, c1 = fast == FAST_I8_F32 ? d1 * dx : c0;
                for (int l = 0; l < 8; l++) {
                    int32_t p = 0;
                    for (int e = 4 * l; e < 4 * l + 4; e++) p += (int32_t)q[e] * w[e];
                    float prod = (float)p * (l < 4 ? c0 : c1);
                    acc[b % 4][l] = acc[b % 4][l] + prod;
                }
                if (fast == FAST_I8_F32) {
                    const float *u = j->xu + 2 * (s * nb + b);
                    float o0 = m * u[0], o1 = m1 * u[1];
                    off[b % 8] = off[b % 8] + (o0 + o1);
                } else if (has_offset(fast)) {
                    float o = m * j->xu[s * nb + b];
                    off[b % 8] = off[b % 8] + o;
                }
            }
            for (int l = 0; l < 8; l++) t[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
            float y = lanes8(t);
            if (has_offset(fast)) y = y + lanes8(off);
            j->y[s * j->n + n] = y;
        }
    }
}

/* ------------------------------------------------------------------------------------------------- x86 */

#if MXK_X86
#define GQ8_AVX2 __attribute__((target("avx2,fma,f16c")))
#define GQ8_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

/* the 32-bit words [0, words) at p (words <= 8; zeros past them): a masked load, nothing past them is read */
GQ8_AVX2 static inline __m256i load_words(const uint8_t *p, int words) {
    if (words >= 8) return _mm256_loadu_si256((const __m256i *)p);
    __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(words), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_epi32((const int *)p, mask);
}

/* the scales of blocks b .. b + cnt - 1 (1 <= cnt <= 8; not I8_F32, whose scales the tiles read per block) ->
 * d[8], m[8] (zeros past cnt), exactly: masked loads of the scale bytes (zero bytes past cnt's blocks, which convert
 * to zeros), then the same conversions for every cnt */
GQ8_AVX2 static inline void group_scales(const int fast, const uint8_t *sc, int64_t b, int cnt, float d[8],
                                         float m[8]) {
    if (f32_scales(fast)) { /* 8 float32 (d, m) pairs: even floats, then odd ones */
        const uint8_t *p = sc + 8 * b;
        __m256 a = _mm256_castsi256_ps(load_words(p, 2 * cnt));
        __m256 c = _mm256_castsi256_ps(load_words(p + 32, 2 * cnt - 8));
        __m256 dd = _mm256_shuffle_ps(a, c, _MM_SHUFFLE(2, 0, 2, 0)), mm = _mm256_shuffle_ps(a, c, _MM_SHUFFLE(3, 1, 3, 1));
        _mm256_storeu_ps(d, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(dd), 0xD8)));
        _mm256_storeu_ps(m, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(mm), 0xD8)));
        return;
    }
    if (fast == FAST_Q4_1) { /* 8 (d, m) pairs of halves: gather the d's, then the m's, 4 per 128-bit lane */
        const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8,
                                              9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
        __m256i h = _mm256_shuffle_epi8(load_words(sc + 4 * b, cnt), pick);
        h = _mm256_permute4x64_epi64(h, 0xD8); /* d0..3 d4..7 | m0..3 m4..7 */
        _mm256_storeu_ps(d, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
        _mm256_storeu_ps(m, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
        return;
    }
    /* one half per block: the whole words, then an odd count's last half on its own (nothing past it is read) */
    const uint8_t *p = sc + 2 * b;
    __m128i h = _mm256_castsi256_si128(load_words(p, cnt / 2));
    if (cnt & 1) {
        uint16_t last;
        memcpy(&last, p + 2 * (cnt - 1), 2);
        __m128i at = _mm_cmpeq_epi16(_mm_set1_epi16((short)(cnt - 1)), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
        h = _mm_or_si128(h, _mm_and_si128(at, _mm_set1_epi16((short)last)));
    }
    _mm256_storeu_ps(d, _mm256_cvtph_ps(h));
    memset(m, 0, 8 * sizeof(float));
}

/* the 8 floats at v, zeros past cnt (a masked load: nothing past cnt is read) */
GQ8_AVX2 static inline __m256 load8(const float *v, int cnt) {
    if (cnt == 8) return _mm256_loadu_ps(v);
    __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(v, mask);
}

GQ8_AVX2 static inline float hsum8(__m256 l) { /* H(l) */
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

/* block b's 32 integers as int8, in weight order */
GQ8_AVX2 static inline __m256i block_ints256(const int fast, const uint8_t *p) {
    if (!nibble_codes(fast)) return _mm256_loadu_si256((const __m256i *)p); /* Q8_0, I8_F32 */
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x0F)), hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
    __m256i w = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    if (q5_codes(fast)) w = _mm256_or_si256(w, fifth_bits(p + 16));
    return code_offset(fast) ? _mm256_sub_epi8(w, _mm256_set1_epi8((char)code_offset(fast))) : w;
}

/* block g + k + I into acc[r][I] of each of the R rows (gq8_rows_avx2's locals) */
#define GQ8_BLOCK256(I, DOT)                                                                                            \
    do {                                                                                                             \
        const int64_t b = g + k + (I);                                                                               \
        __m256i w = block_ints256(fast, row + bytes * b);                                                            \
        __m256i aw = sgn ? _mm256_sign_epi8(w, w) : w;                                                               \
        __m256 dv = _mm256_setzero_ps(); /* I8_F32: d0 in lanes 0..3, d1 in lanes 4..7 */                            \
        float m0 = 0.0f, m1 = 0.0f;                                                                                  \
        if (fast == FAST_I8_F32) {                                                                                   \
            const float *dm = (const float *)(sc + 16 * b);                                                          \
            dv = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(dm)),                                  \
                                          _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));                                \
            memcpy(&m0, dm + 1, 4);                                                                                  \
            memcpy(&m1, dm + 3, 4);                                                                                  \
        }                                                                                                            \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                      \
            const int64_t at = (s0 + r) * nb + b;                                                                    \
            __m256i x = _mm256_loadu_si256((const __m256i *)(j->xq + at * 32));                                     \
            __m256i sx = sgn ? _mm256_sign_epi8(x, w) : x;                                                           \
            __m256i p = DOT(aw, sx);                                                                                 \
            __m256 cv = fast == FAST_I8_F32 ? _mm256_mul_ps(dv, _mm256_set1_ps(j->xd[at]))                           \
                                            : _mm256_set1_ps(c[r][k + (I)]);                                         \
            acc[r][I] = _mm256_add_ps(acc[r][I], _mm256_mul_ps(_mm256_cvtepi32_ps(p), cv));                          \
            if (fast == FAST_I8_F32) {                                                                               \
                float o0 = m0 * j->xu[2 * at], o1 = m1 * j->xu[2 * at + 1];                                          \
                offs[r][k + (I)] = offs[r][k + (I)] + (o0 + o1);                                                     \
            }                                                                                                        \
        }                                                                                                            \
    } while (0)

/* NAME(j, n, s0, fast, R): W row n against x rows s0 .. s0 + R - 1; blocks one at a time, each decoded once for the
 * R rows; defined for AVX2, AVX-VNNI and AVX-512 VNNI (256-bit), which differ only in DOT */
#define GQ8_ROWS_FN(TARGET, NAME, DOT)                                                                               \
    TARGET static inline __attribute__((always_inline)) void NAME(const job_t *j, int64_t n, int64_t s0,             \
                                                                  const int fast, const int R) {                     \
        const int bytes = block_code_bytes(fast), sbytes = block_scale_bytes(fast), sgn = signed_ints(fast);         \
        const int64_t nb = j->nblocks;                                                                               \
        const uint8_t *row = j->codes + n * nb * bytes, *sc = j->scales + n * nb * sbytes;                           \
        __m256 acc[MXK_X_TILE][4], off[MXK_X_TILE];                                                                  \
        float offs[MXK_X_TILE][8] = {{0}}; /* I8_F32's offsets, lane b % 8 (the others': off, 8 blocks at a time) */ \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                        \
            off[r] = _mm256_setzero_ps();                                                                            \
            _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++) acc[r][a] = _mm256_setzero_ps();                     \
        }                                                                                                            \
        for (int64_t g = 0; g < nb; g += 8) {                                                                        \
            const int cnt = nb - g < 8 ? (int)(nb - g) : 8;                                                          \
            float d[8], m[8], c[MXK_X_TILE][8];                                                                      \
            if (fast != FAST_I8_F32) {                                                                               \
                group_scales(fast, sc, g, cnt, d, m);                                                                \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                \
                    const int64_t at = (s0 + r) * nb + g;                                                            \
                    _mm256_storeu_ps(c[r], _mm256_mul_ps(_mm256_loadu_ps(d), load8(j->xd + at, cnt)));               \
                    if (has_offset(fast))                                                                            \
                        off[r] = _mm256_add_ps(off[r], _mm256_mul_ps(_mm256_loadu_ps(m), load8(j->xu + at, cnt)));   \
                }                                                                                                    \
            }                                                                                                        \
            for (int k = 0; k < cnt; k += 4) { /* block g + k + i updates acc[.][i]: g is a multiple of 8 */         \
                _mm_prefetch((const char *)(row + bytes * (g + k)) + MXK_PREFETCH_BYTES, _MM_HINT_T0);               \
                GQ8_BLOCK256(0, DOT);                                                                                \
                if (k + 1 < cnt) GQ8_BLOCK256(1, DOT);                                                               \
                if (k + 2 < cnt) GQ8_BLOCK256(2, DOT);                                                               \
                if (k + 3 < cnt) GQ8_BLOCK256(3, DOT);                                                               \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                        \
            __m256 t = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]));      \
            float y = hsum8(t);                                                                                      \
            if (fast == FAST_I8_F32)                                                                                 \
                y = y + hsum8(_mm256_loadu_ps(offs[r]));                                                             \
            else if (has_offset(fast))                                                                               \
                y = y + hsum8(off[r]);                                                                               \
            j->y[(s0 + r) * j->n + n] = y;                                                                           \
        }                                                                                                            \
    }

GQ8_ROWS_FN(GQ8_AVX2, gq8_rows_avx2, dot_u8s8_avx2) /* mxkernel.h */
GQ8_ROWS_FN(GQ8_VNNI, gq8_rows_vnni, dot_u8s8_vnni)

/* every output of W rows [n0, n1): x rows in tiles (MXK_X_TILES), `fast` and the tile size constants at each
 * inlined call of ROWS (the AVX2, AVX-VNNI or VNNI tile) */
#define GQ8_TILE_CALL(ROWS, n, s0, R)                                                                                \
    do {                                                                                                             \
        switch (j->fast) {                                                                                           \
        case FAST_Q8_0: ROWS(j, n, s0, FAST_Q8_0, R); break;                                                         \
        case FAST_Q4_0: ROWS(j, n, s0, FAST_Q4_0, R); break;                                                         \
        case FAST_Q4_1: ROWS(j, n, s0, FAST_Q4_1, R); break;                                                         \
        case FAST_Q4_F32: ROWS(j, n, s0, FAST_Q4_F32, R); break;                                                     \
        case FAST_I8_F32: ROWS(j, n, s0, FAST_I8_F32, R); break;                                                     \
        case FAST_Q5S_F32: ROWS(j, n, s0, FAST_Q5S_F32, R); break;                                                   \
        default: ROWS(j, n, s0, FAST_Q5_F32, R); break;                                                              \
        }                                                                                                            \
    } while (0)
#define GQ8_AVX2_TILE(n, s0, R) GQ8_TILE_CALL(gq8_rows_avx2, n, s0, R)
#define GQ8_VNNI_TILE(n, s0, R) GQ8_TILE_CALL(gq8_rows_vnni, n, s0, R)
GQ8_AVX2 static void gq8_avx2(const job_t *j, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) MXK_X_TILES(GQ8_AVX2_TILE, j, n);
}
GQ8_VNNI static void gq8_vnni(const job_t *j, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) MXK_X_TILES(GQ8_VNNI_TILE, j, n);
}
#if MXK_AVXVNNI
GQ8_ROWS_FN(MXK_AVXVNNI_FN, gq8_rows_avxvnni, dot_u8s8_avxvnni)
#define GQ8_AVXVNNI_TILE(n, s0, R) GQ8_TILE_CALL(gq8_rows_avxvnni, n, s0, R)
MXK_AVXVNNI_FN static void gq8_avxvnni(const job_t *j, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) MXK_X_TILES(GQ8_AVXVNNI_TILE, j, n);
}
#else
static void gq8_avxvnni(const job_t *j, int64_t n0, int64_t n1) { gq8_avx2(j, n0, n1); }
#endif

/* ------------------------------------------------------------------------------------------------- AVX-512 VNNI */

#define GQ8_V512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

/* blocks b and b + 1's 64 integers as int8 (block b in bytes 0..31, weight order; not I8_F32): the two blocks'
 * nibble bytes in 128-bit lanes 0, 1 and 2, 3 (broadcast loads), the high nibbles in lanes 1 and 3, the fifth bits
 * of the 5-bit types added as 16 where set (one mask bit per byte), the code offset subtracted */
GQ8_V512 static inline __m512i pair_ints512(const int fast, const uint8_t *p, const int bytes) {
    if (!nibble_codes(fast)) return _mm512_loadu_si512((const void *)p); /* Q8_0: 64 contiguous code bytes */
    __m512i t = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)), 0xFF00,
                                            _mm_loadu_si128((const __m128i *)(p + bytes)));
    t = _mm512_and_si512(_mm512_mask_srli_epi16(t, 0xFF00FF00u, t, 4), _mm512_set1_epi8(0x0F));
    if (q5_codes(fast)) {
        uint32_t h0, h1;
        memcpy(&h0, p + 16, 4);
        memcpy(&h1, p + bytes + 16, 4);
        t = _mm512_mask_add_epi8(t, (__mmask64)h0 | (__mmask64)h1 << 32, t, _mm512_set1_epi8(16));
    }
    return code_offset(fast) ? _mm512_sub_epi8(t, _mm512_set1_epi8((char)code_offset(fast))) : t;
}

/* blocks g + K, g + K + 1 (K even) into acc[r][A] of each of the R rows (A = K % 4 / 2: acc0 | acc1 or acc2 |
 * acc3), the per-block arithmetic of the 256-bit tile: q . w = |w| . (sign(w) q) (x negated where w < 0), times
 * c_b = d_b * dx_b taken from the group's vector of c */
#define GQ8_PAIR512(A, K)                                                                                            \
    do {                                                                                                             \
        const int64_t b = g + (K);                                                                                   \
        const __m512i w = pair_ints512(fast, row + bytes * b, bytes), aw = sgn ? _mm512_abs_epi8(w) : w;             \
        const __mmask64 neg = sgn ? _mm512_movepi8_mask(w) : 0;                                                      \
        const __m512i idx = _mm512_set_epi32((K) + 1, (K) + 1, (K) + 1, (K) + 1, (K) + 1, (K) + 1, (K) + 1, (K) + 1, \
                                             (K), (K), (K), (K), (K), (K), (K), (K));                                \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                      \
            const __m512i x = _mm512_loadu_si512((const void *)(j->xq + 32 * ((s0 + r) * nb + b)));                \
            const __m512i sx = sgn ? _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x) : x;                   \
            const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, sx));               \
            const __m512 cv = _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(cvec[r]));                          \
            acc[r][A] = _mm512_add_ps(acc[r][A], _mm512_mul_ps(f, cv));                                             \
        }                                                                                                            \
    } while (0)

/* block g + K alone (a row's last, K even) into the low half of acc[r][A] (the high half untouched) */
#define GQ8_SINGLE512(A, K)                                                                                          \
    do {                                                                                                             \
        const int64_t b = g + (K);                                                                                   \
        const __m256i w = block_ints256(fast, row + bytes * b), aw = sgn ? _mm256_sign_epi8(w, w) : w;               \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                      \
            const __m256i x = _mm256_loadu_si256((const __m256i *)(j->xq + 32 * ((s0 + r) * nb + b)));             \
            const __m256i sx = sgn ? _mm256_sign_epi8(x, w) : x;                                                     \
            const __m256 f = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx));               \
            const __m256 prod = _mm256_mul_ps(f, _mm256_permutevar8x32_ps(cvec[r], _mm256_set1_epi32(K)));           \
            acc[r][A] = _mm512_mask_add_ps(acc[r][A], 0x00FF, acc[r][A], _mm512_castps256_ps512(prod));             \
        }                                                                                                            \
    } while (0)

/* W row n against x rows s0 .. s0 + R - 1, two blocks a register (every type but I8_F32, whose two scales a block
 * the 256-bit tile keeps): the numbers of gq8_rows_avx2 bit for bit */
GQ8_V512 static inline __attribute__((always_inline)) void gq8_tile512(const job_t *j, int64_t n, int64_t s0,
                                                                       const int fast, const int R) {
    const int bytes = block_code_bytes(fast), sbytes = block_scale_bytes(fast), sgn = signed_ints(fast);
    const int64_t nb = j->nblocks;
    const uint8_t *row = j->codes + n * nb * bytes, *sc = j->scales + n * nb * sbytes;
    __m512 acc[MXK_X_TILE][2];
    __m256 off[MXK_X_TILE], cvec[MXK_X_TILE];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        off[r] = _mm256_setzero_ps();
    }
    for (int64_t g = 0; g < nb; g += 8) {
        const int cnt = nb - g < 8 ? (int)(nb - g) : 8;
        float d[8], m[8];
        group_scales(fast, sc, g, cnt, d, m);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const int64_t at = (s0 + r) * nb + g;
            cvec[r] = _mm256_mul_ps(_mm256_loadu_ps(d), load8(j->xd + at, cnt));
            if (has_offset(fast))
                off[r] = _mm256_add_ps(off[r], _mm256_mul_ps(_mm256_loadu_ps(m), load8(j->xu + at, cnt)));
        }
        _mm_prefetch((const char *)(row + bytes * g) + MXK_PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(row + bytes * (g + 4)) + MXK_PREFETCH_BYTES, _MM_HINT_T0);
        if (cnt > 1) GQ8_PAIR512(0, 0); else GQ8_SINGLE512(0, 0);
        if (cnt > 3) GQ8_PAIR512(1, 2); else if (cnt > 2) GQ8_SINGLE512(1, 2);
        if (cnt > 5) GQ8_PAIR512(0, 4); else if (cnt > 4) GQ8_SINGLE512(0, 4);
        if (cnt > 7) GQ8_PAIR512(1, 6); else if (cnt > 6) GQ8_SINGLE512(1, 6);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        float y = hsum8(pair_acc_sum(acc[r][0], acc[r][1]));
        if (has_offset(fast)) y = y + hsum8(off[r]);
        j->y[(s0 + r) * j->n + n] = y;
    }
}
#define GQ8_V512_TILE(n, s0, R) GQ8_TILE_CALL(gq8_tile512, n, s0, R)
GQ8_V512 static void gq8_v512(const job_t *j, int64_t n0, int64_t n1) {
    if (j->fast == FAST_I8_F32) {
        gq8_vnni(j, n0, n1);
        return;
    }
    for (int64_t n = n0; n < n1; n++) MXK_X_TILES(GQ8_V512_TILE, j, n);
}
#else
static void gq8_avx2(const job_t *j, int64_t n0, int64_t n1) { gq8_portable(j, n0, n1); }
static void gq8_avxvnni(const job_t *j, int64_t n0, int64_t n1) { gq8_portable(j, n0, n1); }
static void gq8_v512(const job_t *j, int64_t n0, int64_t n1) { gq8_portable(j, n0, n1); }
#endif

/* the int8-activation path of GGUF blocks: AVX-512 VNNI where mxk_q8_path allows it (2, 3), AVX2 (1; with AVX-VNNI
 * where mxk_avxvnni says so), else portable */
void linear_gq8(const job_t *j, int64_t n0, int64_t n1, int path) {
    if (path >= 2)
        gq8_v512(j, n0, n1);
    else if (path == 1 && mxk_avxvnni())
        gq8_avxvnni(j, n0, n1);
    else if (path == 1)
        gq8_avx2(j, n0, n1);
    else
        gq8_portable(j, n0, n1);
}
