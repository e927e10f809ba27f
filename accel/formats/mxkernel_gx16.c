/* GGUF blocks interleaved 16 output rows at a time, times int8 activations: each block's dot product summed in
 * integers, then one float32 step per block, as llama.cpp's repacked CPU layouts do.
 *
 * Layout (accel/formats/ggml_x16.py writes it), every GGUF layout of the kernel (fast 4..10, mxkernel.h): the N
 * weight rows in groups of 16 (the last group padded with zero rows), each group's blocks in order. Block b of group g
 * holds the 16 rows' block b:
 *   codes, Q8_0, I8_F32: 8 chunks of 64 bytes, chunk j byte 4i + e = code 4j + e of row i (int8 as stored);
 *          the nibble types: 4 chunks of 64 bytes, chunk j byte 4i + e = code 4j + e (low nibble) | code 16 + 4j + e
 *          (high nibble) of row i; the 5-bit types then 8 little-endian 64-bit masks, mask r bit 4i + e = the fifth
 *          bit of code 4r + e of row i (the codes register r holds);
 *   scales: the 16 rows' d, then their m (float16: Q8_0, Q4_0 without m, Q4_1; float32: the repacked types;
 *          I8_F32: d0, m0, d1, m1 of codes 0..15 and 16..31, 16 floats each).
 * The planes hold exactly the bytes of the stored blocks (codes, halves and floats as they are, rearranged), so they
 * are as large as the stored planes for N a multiple of 16.
 *
 * Activations: int8 codes q and scales dx per block of 32 (mxk_quantize_q8), their integer sums sq (I8_F32: of
 * codes 0..15 and 16..31) and u = dx * (float)sq. Per output row n and x row s, over blocks b in order:
 *
 *   P_b = sum_{e < 32} q[e] w[e]                     (int32, exact; w the block's integers, mxkernel.h)
 *   acc = acc + (float)P_b * (d_b * dx_b)             (float32: a product, a product, then the sum)
 *   off = off + m_b * u_b                             (the types with an offset)
 *   I8_F32: P0, P1 the sums over codes 0..15 and 16..31,
 *   acc = acc + ((float)P0 * (d0 * dx) + (float)P1 * (d1 * dx)),  off = off + (m0 * u0 + m1 * u1)
 *   y = acc (Q8_0, Q4_0), acc + off (the others)
 *
 * (no floating-point contraction in this file). |P_b| <= 32 * 128 * 127 < 2^24, so (float)P_b is exact, and the
 * integer part may be computed in any order: AVX-512 VNNI (16 rows a register, vpdpbusd on unsigned codes w + bias
 * with -bias * sq as the starting sum: 128 for the int8 types, 8 for Q4_0, 16 for Q5S_F32), AVX2 (8 rows a
 * register: vpmaddubsw on the unsigned codes, four registers' pair sums added in int16 before one vpmaddwd, or on
 * |w| and sign(w) * q for the int8 types, a vpmaddwd per register; one x row of a nibble type against both halves
 * of a group in one pass)
 * and the portable loop agree bit for bit with accel.formats.ggml_x16.reference_q8_x16, whatever the rows per call
 * and the threads. Each weight block is decoded once for up to 4 x rows (MXK_X_TILE).
 */
#pragma GCC optimize("fp-contract=off")
#include <string.h>

#include "mxkernel.h"

/* bytes of one block of a 16-row group: codes, scales */
static inline int64_t x16_code_bytes(int fast) { return 16 * (int64_t)block_code_bytes(fast); }
static inline int64_t x16_scale_bytes(int fast) { return 16 * (int64_t)block_scale_bytes(fast); }
/* 1 for the int8 code types (signed codes: the sign moves onto q on AVX2, + 128 on VNNI) */
static inline int x16_int8(int fast) { return fast == FAST_Q8_0 || fast == FAST_I8_F32; }
/* what VNNI adds to a code to make it unsigned (and subtracts as bias * sum(q)) */
static inline int x16_bias(int fast) { return x16_int8(fast) ? 128 : code_offset(fast); }
/* the byte offset of scale row f (0: d, 1: m; I8_F32 2: d1, 3: m1) of a group's block, and a lane's size */
static inline int x16_unit(int fast) { return f32_scales(fast) ? 4 : 2; }
static inline int64_t x16_scale_row(int fast, int f) { return 16 * (int64_t)x16_unit(fast) * f; }

/* ------------------------------------------------------------------------------------------------- portable */

/* scale row f of lane i at sc (a group's block), exactly */
static inline float x16_scale(int fast, const uint8_t *sc, int f, int i) {
    const uint8_t *p = sc + x16_scale_row(fast, f) + x16_unit(fast) * i;
    if (!f32_scales(fast)) return half_at(p);
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* code e of row i in a group's block c: the signed weight integer */
static inline int32_t x16_int(int fast, const uint8_t *c, int i, int e) {
    if (x16_int8(fast)) return (int8_t)c[64 * (e / 4) + 4 * i + e % 4];
    const int k = e % 16;
    int v = (c[64 * (k / 4) + 4 * i + k % 4] >> (4 * (e >= 16))) & 15;
    if (q5_codes(fast)) {
        uint64_t mask;
        memcpy(&mask, c + 256 + 8 * (e / 4), 8);
        v |= (int)((mask >> (4 * i + e % 4)) & 1) << 4;
    }
    return v - code_offset(fast);
}

static void x16_portable(const job_t *j, int64_t g0, int64_t g1) {
    const int fast = j->fast, halves = fast == FAST_I8_F32 ? 2 : 1;
    const int64_t nb = j->nblocks, cb = x16_code_bytes(fast), sb = x16_scale_bytes(fast);
    for (int64_t g = g0; g < g1; g++) {
        const int live = j->width - 16 * g < 16 ? (int)(j->width - 16 * g) : 16;
        for (int64_t s = 0; s < j->s; s++)
            for (int i = 0; i < live; i++) {
                float acc = 0.0f, off = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const uint8_t *c = j->codes + (g * nb + b) * cb, *sc = j->scales + (g * nb + b) * sb;
                    const int8_t *q = j->xq + (s * nb + b) * 32;
                    const float dx = j->xd[s * nb + b];
                    int32_t p[2] = {0, 0};
                    for (int e = 0; e < 32; e++) p[e * halves / 32] += (int32_t)q[e] * x16_int(fast, c, i, e);
                    if (halves == 2) {
                        const float d0 = x16_scale(fast, sc, 0, i) * dx, d1 = x16_scale(fast, sc, 2, i) * dx;
                        const float prod0 = (float)p[0] * d0, prod1 = (float)p[1] * d1;
                        acc = acc + (prod0 + prod1);
                        const float *u = j->xu + 2 * (s * nb + b);
                        const float o0 = x16_scale(fast, sc, 1, i) * u[0], o1 = x16_scale(fast, sc, 3, i) * u[1];
                        off = off + (o0 + o1);
                        continue;
                    }
                    const float cd = x16_scale(fast, sc, 0, i) * dx, prod = (float)p[0] * cd;
                    acc = acc + prod;
                    if (has_offset(fast)) {
                        const float o = x16_scale(fast, sc, 1, i) * j->xu[s * nb + b];
                        off = off + o;
                    }
                }
                j->y[s * j->width + 16 * g + i] = has_offset(fast) ? acc + off : acc;
            }
    }
}

/* ------------------------------------------------------------------------------------------------- x86 */

#if MXK_X86
#define X16_AVX2 __attribute__((target("avx2,fma,f16c")))
#define X16_V512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

/* blocks the codes are prefetched ahead of the one decoded (the prefetcher does not follow a group's stride alone) */
#define X16_PREFETCH_BLOCKS 4

/* 8 lanes of scale row f (lanes 8h .. 8h + 7) of a group's block at sc, as float32 */
X16_AVX2 static inline __m256 x16_scales8(const int fast, const uint8_t *sc, int f, int h) {
    const uint8_t *p = sc + x16_scale_row(fast, f) + 8 * x16_unit(fast) * h;
    if (f32_scales(fast)) return _mm256_loadu_ps((const float *)p);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* one block of one x row on 8 output rows (lanes 8h .. 8h + 7): acc += float(p - bias * xs) * (d * dx), and for the
 * types with an offset off += m * xu (m: scale row 1 of the block at sc) */
X16_AVX2 static inline __attribute__((always_inline)) void x16_step8(const int fast, __m256i p, int bias, int32_t xs,
                                                                     __m256 d, __m256 dx, const uint8_t *sc, int h,
                                                                     float xu, __m256 *acc, __m256 *off) {
    if (bias) p = _mm256_sub_epi32(p, _mm256_set1_epi32(bias * xs));
    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(d, dx)));
    if (has_offset(fast)) *off = _mm256_add_ps(*off, _mm256_mul_ps(x16_scales8(fast, sc, 1, h), _mm256_set1_ps(xu)));
}

/* stores acc (+ off for the types with an offset) at y: lanes 8h .. 8h + 7 of group g, those below its live rows */
X16_AVX2 static inline __attribute__((always_inline)) void x16_store8(const job_t *j, int fast, int64_t g, int h,
                                                                      __m256 acc, __m256 off, float *y) {
    const int live = (int)(j->width - 16 * g - 8 * h);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(live), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(y, mask, has_offset(fast) ? _mm256_add_ps(acc, off) : acc);
}

/* the 16 lanes of scale row f of a group's block at sc, as float32 */
X16_V512 static inline __m512 x16_scales16(const int fast, const uint8_t *sc, int f) {
    const uint8_t *p = sc + x16_scale_row(fast, f);
    if (f32_scales(fast)) return _mm512_loadu_ps((const float *)p);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* acc + the int32 lanes of a register of codes times x (aw unsigned, x signed): vpmaddubsw + vpmaddwd on AVX2 */
X16_AVX2 static inline __m256i x16_acc_avx2(__m256i acc, __m256i aw, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, x), _mm256_set1_epi16(1)));
}

/* NAME(aw, w, q, sgn, p1): the integer dot products of one x row with a block's 8 registers, accumulated by ACC:
 * returns the sum over registers 0..3 (codes 0..15), *p1 over 4..7; sgn: move the signs of w onto x (the int8 types);
 * defined for AVX2 and for AVX-VNNI (vpdpbusd: the same int32 lanes) */
#define X16_DOT_FN(TARGET, NAME, ACC)                                                                                \
    TARGET static inline __m256i NAME(const __m256i aw[8], const __m256i w[8], const int8_t *q, int sgn,             \
                                      __m256i *p1) {                                                                 \
        __m256i p0 = _mm256_setzero_si256();                                                                         \
        *p1 = _mm256_setzero_si256();                                                                                \
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {                                                        \
            int32_t word;                                                                                            \
            memcpy(&word, q + 4 * k, 4);                                                                             \
            __m256i x = _mm256_set1_epi32(word);                                                                     \
            if (sgn) x = _mm256_sign_epi8(x, w[k]);                                                                  \
            if (k < 4) p0 = ACC(p0, aw[k], x); else *p1 = ACC(*p1, aw[k], x);                                        \
        }                                                                                                            \
        return p0;                                                                                                   \
    }
X16_DOT_FN(X16_AVX2, x16_dot_avx2_each, x16_acc_avx2)

/* the AVX2 dot products of the nibble types (sgn 0): codes aw <= 31 and |x| <= 128, so a vpmaddubsw pair sum is at
 * most 2 * 31 * 128 = 7936 in magnitude and four of them (registers 0..3, or 4..7) add up in int16 without overflow
 * (31744 < 2^15) before one vpmaddwd: the same int32 lanes as x16_dot_avx2_each, a quarter fewer instructions. The
 * int8 types (sgn 1: |w| up to 128, pair sums up to 32512) take a vpmaddwd per register. */
/* the AVX2 nibble types' steps: a register's vpmaddubsw pair sums added in int16 (STEP), made int32 lanes (DONE) */
#define X16_STEP_AVX2(acc, a, x) _mm256_add_epi16(acc, _mm256_maddubs_epi16(a, x))
#define X16_DONE_AVX2(acc) _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
X16_AVX2 static inline __m256i x16_dot_avx2(const __m256i aw[8], const __m256i w[8], const int8_t *q, int sgn,
                                            __m256i *p1) {
    if (sgn) return x16_dot_avx2_each(aw, w, q, sgn, p1);
    __m256i half[2];
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        __m256i t = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int k = 4 * h; k < 4 * h + 4; k++) {
            int32_t word;
            memcpy(&word, q + 4 * k, 4);
            t = X16_STEP_AVX2(t, aw[k], _mm256_set1_epi32(word));
        }
        half[h] = X16_DONE_AVX2(t);
    }
    *p1 = half[1];
    return half[0];
}

/* NAME(j, g, h, s0, fast, R): x rows s0 .. s0 + R - 1 of group g, lanes 8h .. 8h + 7 (h = 0, 1): 8 rows a 256-bit
 * register; defined for AVX2 and for AVX-VNNI, which differ only in DOT */
#define X16_HALF_FN(TARGET, NAME, DOT)                                                                               \
    TARGET static inline __attribute__((always_inline)) void NAME(const job_t *j, int64_t g, int h, int64_t s0,      \
                                                            const int fast, const int R) {                           \
        const int64_t nb = j->nblocks, cb = x16_code_bytes(fast), sb = x16_scale_bytes(fast);                        \
        const uint8_t *codes = j->codes + g * nb * cb, *scales = j->scales + g * nb * sb;                            \
        const int sgn = x16_int8(fast), i8 = fast == FAST_I8_F32, bias = sgn ? 0 : code_offset(fast);                \
        const __m256i nib = _mm256_set1_epi8(0x0F);                                                                  \
        __m256 acc[MXK_X_TILE], off[MXK_X_TILE];                                                                     \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = off[r] = _mm256_setzero_ps();                   \
        for (int64_t b = 0; b < nb; b++) {                                                                           \
            const uint8_t *c = codes + b * cb + 32 * h, *sc = scales + b * sb;                                       \
            __m256i w[8], aw[8];                                                                                     \
            if (sgn) {                                                                                               \
                _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {                                                \
                    w[k] = _mm256_loadu_si256((const __m256i *)(c + 64 * k));                                        \
                    aw[k] = _mm256_sign_epi8(w[k], w[k]);                                                            \
                }                                                                                                    \
            } else {                                                                                                 \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {                                                \
                    const __m256i t = _mm256_loadu_si256((const __m256i *)(c + 64 * k));                             \
                    aw[k] = _mm256_and_si256(t, nib);                                                                \
                    aw[k + 4] = _mm256_and_si256(_mm256_srli_epi16(t, 4), nib);                                      \
                }                                                                                                    \
                if (q5_codes(fast))                                                                                  \
                    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)                                              \
                        aw[k] = _mm256_or_si256(aw[k], fifth_bits(codes + b * cb + 256 + 8 * k + 4 * h));            \
            }                                                                                                        \
            const __m256 d = x16_scales8(fast, sc, 0, h);                                                            \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                    \
                const int64_t at = (s0 + r) * nb + b;                                                                \
                const __m256 dx = _mm256_set1_ps(j->xd[at]);                                                         \
                __m256i p1, p0 = DOT(aw, sgn ? w : aw, j->xq + 32 * at, sgn, &p1);                                   \
                if (i8) {                                                                                            \
                    const __m256 d1 = x16_scales8(fast, sc, 2, h);                                                   \
                    const __m256 prod0 = _mm256_mul_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(d, dx));                \
                    const __m256 prod1 = _mm256_mul_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(d1, dx));               \
                    acc[r] = _mm256_add_ps(acc[r], _mm256_add_ps(prod0, prod1));                                     \
                    const __m256 o0 = _mm256_mul_ps(x16_scales8(fast, sc, 1, h), _mm256_set1_ps(j->xu[2 * at]));     \
                    const __m256 o1 = _mm256_mul_ps(x16_scales8(fast, sc, 3, h), _mm256_set1_ps(j->xu[2 * at + 1])); \
                    off[r] = _mm256_add_ps(off[r], _mm256_add_ps(o0, o1));                                           \
                    continue;                                                                                        \
                }                                                                                                    \
                const float xu = has_offset(fast) ? j->xu[at] : 0.0f;                                                \
                x16_step8(fast, _mm256_add_epi32(p0, p1), bias, j->xs[at], d, dx, sc, h, xu, &acc[r], &off[r]);      \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                                          \
            x16_store8(j, fast, g, h, acc[r], off[r], j->y + (s0 + r) * j->width + 16 * g + 8 * h);                  \
    }
X16_HALF_FN(X16_AVX2, x16_half_avx2, x16_dot_avx2)

/* NAME(j, g, s0, fast): one x row against both halves of group g in one pass, the nibble types: each of the row's
 * code words broadcast once for the group's 16 rows instead of once a half; per half the same integer sums, float
 * steps and store as the halves' function (the same bits). STEP(acc, a, x) adds a register's products (AVX2: the
 * vpmaddubsw pair sums in int16; AVX-VNNI: vpdpbusd in int32), DONE(acc) makes them int32 lanes (AVX2: vpmaddwd).
 * The group has more than 8 live rows. */
#define X16_BOTH_FN(TARGET, NAME, STEP, DONE)                                                                        \
    TARGET static inline __attribute__((always_inline)) void NAME(const job_t *j, int64_t g, int64_t s0,             \
                                                                  const int fast) {                                  \
        const int64_t nb = j->nblocks, cb = x16_code_bytes(fast), sb = x16_scale_bytes(fast);                        \
        const uint8_t *codes = j->codes + g * nb * cb, *scales = j->scales + g * nb * sb;                            \
        const int bias = code_offset(fast);                                                                          \
        const __m256i nib = _mm256_set1_epi8(0x0F);                                                                  \
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, off[2] = {acc[0], acc[0]};                       \
        for (int64_t b = 0; b < nb; b++) {                                                                           \
            const uint8_t *c = codes + b * cb, *sc = scales + b * sb;                                                \
            const int64_t at = s0 * nb + b;                                                                          \
            const int8_t *q = j->xq + 32 * at;                                                                       \
            __m256i lo[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, hi[2] = {lo[0], lo[0]};                \
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) { /* codes 4k.. (low nibbles), 16 + 4k.. (high) */ \
                int32_t wl, wh;                                                                                      \
                memcpy(&wl, q + 4 * k, 4);                                                                           \
                memcpy(&wh, q + 16 + 4 * k, 4);                                                                      \
                const __m256i xl = _mm256_set1_epi32(wl), xh = _mm256_set1_epi32(wh);                                \
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                                                \
                    const __m256i t = _mm256_loadu_si256((const __m256i *)(c + 64 * k + 32 * h));                   \
                    __m256i a = _mm256_and_si256(t, nib), e = _mm256_and_si256(_mm256_srli_epi16(t, 4), nib);       \
                    if (q5_codes(fast)) {                                                                            \
                        a = _mm256_or_si256(a, fifth_bits(c + 256 + 8 * k + 4 * h));                                 \
                        e = _mm256_or_si256(e, fifth_bits(c + 256 + 8 * (k + 4) + 4 * h));                           \
                    }                                                                                                \
                    lo[h] = STEP(lo[h], a, xl);                                                                      \
                    hi[h] = STEP(hi[h], e, xh);                                                                      \
                }                                                                                                    \
            }                                                                                                        \
            const __m256 dx = _mm256_set1_ps(j->xd[at]);                                                             \
            const float xu = has_offset(fast) ? j->xu[at] : 0.0f;                                                    \
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                                                    \
                const __m256i p = _mm256_add_epi32(DONE(lo[h]), DONE(hi[h]));                                        \
                x16_step8(fast, p, bias, j->xs[at], x16_scales8(fast, sc, 0, h), dx, sc, h, xu, &acc[h], &off[h]);   \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)                                                          \
            x16_store8(j, fast, g, h, acc[h], off[h], j->y + s0 * j->width + 16 * g + 8 * h);                        \
    }
X16_BOTH_FN(X16_AVX2, x16_both_avx2, X16_STEP_AVX2, X16_DONE_AVX2)

/* a group's two halves for x rows s0 .. s0 + R - 1 by HALF, or one x row of a nibble type against a full group in
 * one pass by BOTH */
#define X16_GROUP(HALF, BOTH, g, s0, F, R)                                                                           \
    do {                                                                                                             \
        if ((R) == 1 && !x16_int8(F) && j->width - 16 * (g) > 8)                                                     \
            BOTH(j, g, s0, F);                                                                                       \
        else                                                                                                         \
            X16_BOTH_HALVES(HALF, g, s0, F, R);                                                                      \
    } while (0)

#if MXK_AVXVNNI
#define X16_ACC_AVXVNNI(acc, aw, x) _mm256_dpbusd_avx_epi32(acc, aw, x)
X16_DOT_FN(MXK_AVXVNNI_FN, x16_dot_avxvnni, X16_ACC_AVXVNNI)
X16_HALF_FN(MXK_AVXVNNI_FN, x16_half_avxvnni, x16_dot_avxvnni)
#define X16_DONE_AVXVNNI(acc) (acc)
X16_BOTH_FN(MXK_AVXVNNI_FN, x16_both_avxvnni, X16_ACC_AVXVNNI, X16_DONE_AVXVNNI)
#endif

/* the integer dot products of one x row with a block's 8 unsigned registers (vpdpbusd), started at start0 (codes
 * 0..15) and start1 (codes 16..31); returns the first, *p1 the second */
X16_V512 static inline __m512i x16_dot512(const __m512i w[8], const int8_t *q, __m512i start0, __m512i start1,
                                          __m512i *p1) {
    __m512i a = start0, c = _mm512_setzero_si512(), e = start1, f = _mm512_setzero_si512();
    int32_t word[8];
    memcpy(word, q, 32);
    a = _mm512_dpbusd_epi32(a, w[0], _mm512_set1_epi32(word[0]));
    c = _mm512_dpbusd_epi32(c, w[1], _mm512_set1_epi32(word[1]));
    a = _mm512_dpbusd_epi32(a, w[2], _mm512_set1_epi32(word[2]));
    c = _mm512_dpbusd_epi32(c, w[3], _mm512_set1_epi32(word[3]));
    e = _mm512_dpbusd_epi32(e, w[4], _mm512_set1_epi32(word[4]));
    f = _mm512_dpbusd_epi32(f, w[5], _mm512_set1_epi32(word[5]));
    e = _mm512_dpbusd_epi32(e, w[6], _mm512_set1_epi32(word[6]));
    f = _mm512_dpbusd_epi32(f, w[7], _mm512_set1_epi32(word[7]));
    *p1 = _mm512_add_epi32(e, f);
    return _mm512_add_epi32(a, c);
}

/* x rows s0 .. s0 + R - 1 of group g: 16 rows a 512-bit register, vpdpbusd */
X16_V512 static inline __attribute__((always_inline)) void x16_tile512(const job_t *j, int64_t g, int64_t s0,
                                                                       const int fast, const int R) {
    const int64_t nb = j->nblocks, cb = x16_code_bytes(fast), sb = x16_scale_bytes(fast);
    const uint8_t *codes = j->codes + g * nb * cb, *scales = j->scales + g * nb * sb;
    const __m512i nib = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80), sixteen = _mm512_set1_epi8(16);
    const int bias = x16_bias(fast), i8 = fast == FAST_I8_F32;
    __m512 acc[MXK_X_TILE], off[MXK_X_TILE];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = off[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = codes + b * cb, *sc = scales + b * sb;
        for (int64_t line = 0; line < cb; line += 64)
            _mm_prefetch((const char *)(c + X16_PREFETCH_BLOCKS * cb + line), _MM_HINT_T0);
        __m512i w[8];
        if (x16_int8(fast)) {
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
                w[k] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(c + 64 * k)), flip);
        } else {
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m512i t = _mm512_loadu_si512((const void *)(c + 64 * k));
                w[k] = _mm512_and_si512(t, nib);
                w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(t, 4), nib);
            }
            if (q5_codes(fast))
                _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                    uint64_t fifth;
                    memcpy(&fifth, c + 256 + 8 * k, 8);
                    w[k] = _mm512_mask_add_epi8(w[k], (__mmask64)fifth, w[k], sixteen);
                }
        }
        const __m512 d = x16_scales16(fast, sc, 0);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const int64_t at = (s0 + r) * nb + b;
            const __m512 dx = _mm512_set1_ps(j->xd[at]);
            __m512i p1;
            if (i8) {
                const __m512i p0 = x16_dot512(w, j->xq + 32 * at, _mm512_set1_epi32(-bias * j->xs[2 * at]),
                                              _mm512_set1_epi32(-bias * j->xs[2 * at + 1]), &p1);
                const __m512 prod0 = _mm512_mul_ps(_mm512_cvtepi32_ps(p0), _mm512_mul_ps(d, dx));
                const __m512 d1 = x16_scales16(fast, sc, 2);
                const __m512 prod1 = _mm512_mul_ps(_mm512_cvtepi32_ps(p1), _mm512_mul_ps(d1, dx));
                acc[r] = _mm512_add_ps(acc[r], _mm512_add_ps(prod0, prod1));
                const __m512 o0 = _mm512_mul_ps(x16_scales16(fast, sc, 1), _mm512_set1_ps(j->xu[2 * at]));
                const __m512 o1 = _mm512_mul_ps(x16_scales16(fast, sc, 3), _mm512_set1_ps(j->xu[2 * at + 1]));
                off[r] = _mm512_add_ps(off[r], _mm512_add_ps(o0, o1));
                continue;
            }
            const __m512i p0 =
                x16_dot512(w, j->xq + 32 * at, _mm512_set1_epi32(-bias * j->xs[at]), _mm512_setzero_si512(), &p1);
            const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(p0, p1));
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(f, _mm512_mul_ps(d, dx)));
            if (has_offset(fast)) {
                const __m512 m = x16_scales16(fast, sc, 1);
                off[r] = _mm512_add_ps(off[r], _mm512_mul_ps(m, _mm512_set1_ps(j->xu[at])));
            }
        }
    }
    const int live = (int)(j->width - 16 * g);
    const __mmask16 mask = live >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << live) - 1);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        const __m512 y = has_offset(fast) ? _mm512_add_ps(acc[r], off[r]) : acc[r];
        _mm512_mask_storeu_ps(j->y + (s0 + r) * j->width + 16 * g, mask, y);
    }
}

/* the tile of group g (a CALL of MXK_X_TILES), `fast` a constant at each inlined call */
#define X16_CALL(TILE, g, s0, R)                                                                                     \
    do {                                                                                                             \
        switch (j->fast) {                                                                                           \
        case FAST_Q8_0: TILE(g, s0, FAST_Q8_0, R); break;                                                            \
        case FAST_Q4_0: TILE(g, s0, FAST_Q4_0, R); break;                                                            \
        case FAST_Q4_1: TILE(g, s0, FAST_Q4_1, R); break;                                                            \
        case FAST_Q4_F32: TILE(g, s0, FAST_Q4_F32, R); break;                                                        \
        case FAST_I8_F32: TILE(g, s0, FAST_I8_F32, R); break;                                                        \
        case FAST_Q5S_F32: TILE(g, s0, FAST_Q5S_F32, R); break;                                                      \
        default: TILE(g, s0, FAST_Q5_F32, R); break;                                                                 \
        }                                                                                                            \
    } while (0)
/* a group's two halves of 8 rows (the second where the group has more than 8 live rows), by HALF */
#define X16_BOTH_HALVES(HALF, g, s0, F, R)                                                                           \
    do {                                                                                                             \
        HALF(j, g, 0, s0, F, R);                                                                                     \
        if (j->width - 16 * (g) > 8) HALF(j, g, 1, s0, F, R);                                                        \
    } while (0)
#define X16_HALVES(g, s0, F, R) X16_GROUP(x16_half_avx2, x16_both_avx2, g, s0, F, R)
#define X16_AVX2_TILE(g, s0, R) X16_CALL(X16_HALVES, g, s0, R)
#define X16_VHALVES(g, s0, F, R) X16_GROUP(x16_half_avxvnni, x16_both_avxvnni, g, s0, F, R)
#define X16_AVXVNNI_TILE(g, s0, R) X16_CALL(X16_VHALVES, g, s0, R)
#define X16_512(g, s0, F, R) x16_tile512(j, g, s0, F, R)
#define X16_V512_TILE(g, s0, R) X16_CALL(X16_512, g, s0, R)
X16_AVX2 static void x16_avx2(const job_t *j, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++) MXK_X_TILES(X16_AVX2_TILE, j, g);
}
X16_V512 static void x16_v512(const job_t *j, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++) MXK_X_TILES(X16_V512_TILE, j, g);
}
#if MXK_AVXVNNI
MXK_AVXVNNI_FN static void x16_avxvnni(const job_t *j, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++) MXK_X_TILES(X16_AVXVNNI_TILE, j, g);
}
#else
static void x16_avxvnni(const job_t *j, int64_t g0, int64_t g1) { x16_avx2(j, g0, g1); }
#endif
#else
static void x16_avx2(const job_t *j, int64_t g0, int64_t g1) { x16_portable(j, g0, g1); }
static void x16_avxvnni(const job_t *j, int64_t g0, int64_t g1) { x16_portable(j, g0, g1); }
static void x16_v512(const job_t *j, int64_t g0, int64_t g1) { x16_portable(j, g0, g1); }
#endif

/* groups [g0, g1) of an interleaved job: AVX-512 VNNI where mxk_q8_path allows it (2, 3), AVX2 (1; with AVX-VNNI
 * where mxk_avxvnni says so), else portable */
void linear_gx16(const job_t *j, int64_t g0, int64_t g1, int path) {
    if (path >= 2)
        x16_v512(j, g0, g1);
    else if (path == 1 && mxk_avxvnni())
        x16_avxvnni(j, g0, g1);
    else if (path == 1)
        x16_avx2(j, g0, g1);
    else
        x16_portable(j, g0, g1);
}
