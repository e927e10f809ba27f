/* The AVX2 + FMA path (block 32; MXFP6 E2M3, MXFP4 E2M1, MXINT8): a block's codes unpacked in a register to the
 * integers value * 2^shift, converted to float32 and scaled exactly. GGUF Q8_0, Q4_0, Q4_1 (fast 4, 5, 6): the codes'
 * integers (q, q - 8, q) times the block's float16 d converted exactly (F16C, once a block), plus Q4_1's m; the
 * repacked types (fast 7..10) read their float32 d and m as they are; the 5-bit ones add each code's fifth bit.
 * See mxkernel.h. */
#include <string.h>

#include "mxkernel.h"

#if MXK_X86
#define AVX2 __attribute__((target("avx2,fma,f16c"))) /* F16C: every AVX2 CPU has it (checked) */

/* the block's 32 int8 values times one scale -> 4 x 8 exact float32 weights */
AVX2 static inline void to_floats(__m256i v, float scale, __m256 w[4]) {
    __m256 sc = _mm256_set1_ps(scale);
    __m128i a = _mm256_castsi256_si128(v), b = _mm256_extracti128_si256(v, 1);
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), sc);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))), sc);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), sc);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), sc);
}

/* the 32 4-bit codes of a GGUF Q4 block (16 bytes: byte i holds code i low, code i + 16 high) as bytes, in order */
AVX2 static inline __m256i gguf_nibbles(const uint8_t *p) {
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F)), hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* MX block b's 32 exact float32 weights; s: its E8M0 scale code, read via scale_tab (GGUF blocks: row_dot_gguf) */
AVX2 static inline __attribute__((always_inline)) void block_weights(const int fast, const uint8_t *row,
                                                                     const float *scale_tab, int64_t b,
                                                                     const uint8_t *s, __m256 w[4]) {
    __m256i v;
    if (fast == FAST_E2M3)
        v = e2m3_ints(unpack_fp6(row + 24 * b));
    else if (fast == FAST_E2M1)
        v = e2m1_ints(row + 16 * b);
    else /* MXINT8: the int8 codes themselves */
        v = _mm256_loadu_si256((const __m256i *)(row + 32 * b));
    to_floats(v, scale_tab[s[0]], w);
}

/* acc[i] += w[i] * x[8 i .. 8 i + 8): one block's 32 products into an x row's 4 accumulators */
AVX2 static inline __attribute__((always_inline)) void fma_block(const __m256 w[4], const float *x, __m256 acc[4]) {
    acc[0] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x), acc[0]);
    acc[1] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), acc[1]);
    acc[2] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), acc[2]);
    acc[3] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), acc[3]);
}

AVX2 static inline float hsum(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 t = _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));
    u = _mm_add_ss(u, _mm_movehdup_ps(u));
    return _mm_cvtss_f32(u);
}

/* a GGUF block's 32 float32 weights from its codes' integers q0..q3 (codes 0..7, 8..15, 16..23, 24..31 as floats) and
 * its scale values dm as float32, read as memory broadcasts: d * q (exact); Q4_1, Q4_F32 fma(q, d, m) (d * q + m
 * rounded once, as numpy's (d * q) + m); I8_F32 fma(q, d0, m0) for weights 0..15, fma(q, d1, m1) for 16..31. dh: the
 * scale of codes 16..31 where they come times 16 (d / 16; else d) */
AVX2 static inline __attribute__((always_inline)) void gguf_scale(const int fast, __m256 q0, __m256 q1, __m256 q2,
                                                                  __m256 q3, const float *dm, __m256 dh, __m256 w[4]) {
    const __m256 d = _mm256_set1_ps(dm[0]);
    if (has_offset(fast)) {
        const int second = fast == FAST_I8_F32 ? 2 : 0; /* weights 16..31: their own d and m */
        const __m256 m = _mm256_set1_ps(dm[1]), m1 = _mm256_set1_ps(dm[second + 1]);
        const __m256 d1 = fast == FAST_I8_F32 ? _mm256_set1_ps(dm[2]) : dh;
        w[0] = _mm256_fmadd_ps(q0, d, m);
        w[1] = _mm256_fmadd_ps(q1, d, m);
        w[2] = _mm256_fmadd_ps(q2, d1, m1);
        w[3] = _mm256_fmadd_ps(q3, d1, m1);
    } else {
        w[0] = _mm256_mul_ps(q0, d);
        w[1] = _mm256_mul_ps(q1, d);
        w[2] = _mm256_mul_ps(q2, dh);
        w[3] = _mm256_mul_ps(q3, dh);
    }
}

/* a GGUF block's 32 exact float32 weights from its integers v (int8 lanes): gguf_scale of v widened in registers */
AVX2 static inline __attribute__((always_inline)) void gguf_floats(const int fast, __m256i v, const float *dm,
                                                                   __m256 w[4]) {
    __m128i a = _mm256_castsi256_si128(v), c = _mm256_extracti128_si256(v, 1);
    __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a));
    __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8)));
    __m256 q2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
    __m256 q3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8)));
    gguf_scale(fast, q0, q1, q2, q3, dm, _mm256_set1_ps(dm[0]), w);
}

/* blocks whose scale values one GGUF row converts at once (a stack buffer of GGUF_CHUNK * 4 floats) */
#define GGUF_CHUNK 64

/* the scale values of blocks c0 .. c1 of a row (sc: the row's scale plane) as float32 into dm: float16 planes
 * converted by F16C (8 at a time), float32 planes copied */
AVX2 static inline void chunk_scales(const int fast, const uint8_t *sc, int64_t c0, int64_t c1, float *dm) {
    const int sbytes = block_scale_bytes(fast);
    const int64_t nh = (c1 - c0) * block_floats(fast);
    if (f32_scales(fast)) {
        memcpy(dm, sc + sbytes * c0, (size_t)nh * sizeof(float));
        return;
    }
    int64_t i = 0;
    for (; i + 8 <= nh; i += 8)
        _mm256_storeu_ps(dm + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + sbytes * c0 + 2 * i))));
    for (; i < nh; i++) {
        uint16_t h;
        memcpy(&h, sc + sbytes * c0 + 2 * i, 2);
        dm[i] = _cvtsh_ss(h);
    }
}

/* whether gguf_block_direct takes a block's codes 16..31 times 16, scaled by d / 16 (Q4_0, Q4_1: float16 d) */
static inline int d16_scaled(int fast) { return nibble_codes(fast) && !f32_scales(fast) && !q5_codes(fast); }

/* a GGUF block's 32 exact float32 weights straight from its code bytes, for the types whose codes need no fifth bit:
 * each 8 codes widened to 32-bit lanes by one vpmovzxbd/vpmovsxbd from memory (2 shuffle-port uops a nibble block,
 * 4 an int8 block, against 8 when the nibbles are split in a register first). A nibble block's bytes 0..7 and 8..15
 * widened: & 0x0F gives codes 0..7 and 8..15, & 0xF0 codes 16..23 and 24..31 times 16, scaled by d16 = d / 16
 * (float16 types: exact, d * 2^-4 is a normal float32 for every float16 d; (16 q) * (d / 16) = q * d exactly, so the
 * same rounding as fma(q, d, m) and d * q, infinities and NaN alike); the float32-scale Q4_F32 shifts by 4 instead.
 * Q4_0's codes minus 8 (16 q - 128 for the high half) in integers first. The same weights as gguf_floats, bit for bit. */
AVX2 static inline __attribute__((always_inline)) void gguf_block_direct(const int fast, const uint8_t *blk,
                                                                        const float *dm, const float *d16,
                                                                        __m256 w[4]) {
    __m256 q0, q1, q2, q3;
    if (!nibble_codes(fast)) { /* int8 codes: Q8_0, I8_F32 */
        q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)blk)));
        q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 8))));
        q2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 16))));
        q3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 24))));
    } else {
        const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)blk));
        const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 8)));
        const __m256i lo = _mm256_set1_epi32(0x0F), hi = _mm256_set1_epi32(0xF0);
        __m256i v0 = _mm256_and_si256(b0, lo), v1 = _mm256_and_si256(b1, lo);
        __m256i v2 = _mm256_and_si256(b0, hi), v3 = _mm256_and_si256(b1, hi);
        if (!d16_scaled(fast)) { /* Q4_F32: d / 16 could lose bits of a float32 d; shift the codes down instead */
            v2 = _mm256_srli_epi32(b0, 4);
            v3 = _mm256_srli_epi32(b1, 4);
        }
        if (code_offset(fast)) { /* Q4_0: q - 8, and 16 q - 128 where the codes are times 16 */
            v0 = _mm256_sub_epi32(v0, _mm256_set1_epi32(8));
            v1 = _mm256_sub_epi32(v1, _mm256_set1_epi32(8));
            v2 = _mm256_sub_epi32(v2, _mm256_set1_epi32(128));
            v3 = _mm256_sub_epi32(v3, _mm256_set1_epi32(128));
        }
        q0 = _mm256_cvtepi32_ps(v0);
        q1 = _mm256_cvtepi32_ps(v1);
        q2 = _mm256_cvtepi32_ps(v2);
        q3 = _mm256_cvtepi32_ps(v3);
    }
    const __m256 dh = _mm256_set1_ps(d16_scaled(fast) ? *d16 : dm[0]); /* codes 16..31 */
    gguf_scale(fast, q0, q1, q2, q3, dm, dh, w);
}

/* GGUF: one W row against x rows s0 and s0 + 1 (two when pair), as row_dot; a chunk's scale values converted into
 * float32 first (and a float16 nibble type's d / 16), so each block broadcasts its d (and m) from memory */
AVX2 static inline __attribute__((always_inline)) void row_dot_gguf(const job_t *j, int64_t n, int64_t s0,
                                                                    const int fast, const int pair) {
    const int bytes = block_code_bytes(fast), sbytes = block_scale_bytes(fast), floats = block_floats(fast);
    const uint8_t *row = j->codes + n * j->nblocks * bytes;
    const uint8_t *sc = j->scales + n * j->nblocks * sbytes;
    const float *x0 = j->x + s0 * j->xstride, *x1 = pair ? x0 + j->xstride : x0;
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 bb[4] = {a[0], a[0], a[0], a[0]};
    float dm[GGUF_CHUNK * 4], d16[GGUF_CHUNK];
    for (int64_t c0 = 0; c0 < j->nblocks; c0 += GGUF_CHUNK) {
        int64_t c1 = c0 + GGUF_CHUNK < j->nblocks ? c0 + GGUF_CHUNK : j->nblocks;
        chunk_scales(fast, sc, c0, c1, dm);
        if (d16_scaled(fast))
            for (int64_t b = 0; b < c1 - c0; b++) d16[b] = dm[b * floats] * 0.0625f;
        for (int64_t b = c0; b < c1; b++) {
            __m256 w[4];
            _mm_prefetch((const char *)(row + bytes * b) + MXK_PREFETCH_BYTES, _MM_HINT_T0);
            const uint8_t *blk = row + bytes * b;
            if (q5_codes(fast)) { /* the fifth bits: the nibbles split in a register, the bits or-ed in */
                __m256i v = _mm256_or_si256(gguf_nibbles(blk), fifth_bits(blk + 16));
                if (code_offset(fast)) v = _mm256_sub_epi8(v, _mm256_set1_epi8((char)code_offset(fast)));
                gguf_floats(fast, v, dm + (b - c0) * floats, w);
            } else {
                gguf_block_direct(fast, blk, dm + (b - c0) * floats, d16 + (b - c0), w);
            }
            fma_block(w, x0 + 32 * b, a);
            if (pair) fma_block(w, x1 + 32 * b, bb);
        }
    }
    j->y[s0 * j->n + n] = hsum(a[0], a[1], a[2], a[3]);
    if (pair) j->y[(s0 + 1) * j->n + n] = hsum(bb[0], bb[1], bb[2], bb[3]);
}

/* one W row against x rows s0 and s0 + 1 (two when pair): each x row keeps its own 4 accumulators; `fast` and
 * `pair` are constants at every call site (one branch-free loop each) */
AVX2 static inline __attribute__((always_inline)) void row_dot(const job_t *j, const float *scale_tab, int64_t n,
                                                               int64_t s0, const int fast, const int pair) {
    if (is_gguf(fast)) {
        row_dot_gguf(j, n, s0, fast, pair);
        return;
    }
    const int bytes = block_code_bytes(fast), sbytes = block_scale_bytes(fast);
    const uint8_t *row = j->codes + n * j->nblocks * bytes;
    const uint8_t *sc = j->scales + n * j->nblocks * sbytes;
    const float *x0 = j->x + s0 * j->xstride, *x1 = pair ? x0 + j->xstride : x0;
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 bb[4] = {a[0], a[0], a[0], a[0]};
    for (int64_t b = 0; b < j->nblocks; b++) {
        __m256 w[4];
        _mm_prefetch((const char *)(row + bytes * b) + MXK_PREFETCH_BYTES, _MM_HINT_T0);
        block_weights(fast, row, scale_tab, b, sc + sbytes * b, w);
        fma_block(w, x0 + 32 * b, a);
        if (pair) fma_block(w, x1 + 32 * b, bb);
    }
    j->y[s0 * j->n + n] = hsum(a[0], a[1], a[2], a[3]);
    if (pair) j->y[(s0 + 1) * j->n + n] = hsum(bb[0], bb[1], bb[2], bb[3]);
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
AVX2_ROWS(4)
AVX2_ROWS(5)
AVX2_ROWS(6)
AVX2_ROWS(7)
AVX2_ROWS(8)
AVX2_ROWS(9)
AVX2_ROWS(10)

AVX2 void linear_avx2(const job_t *j, int64_t n0, int64_t n1) {
    const float *tab = is_gguf(j->fast) ? NULL : SCALES[j->fast]; /* GGUF blocks carry their own scales */
    switch (j->fast) {
    case FAST_E2M3: rows_avx2_1(j, tab, n0, n1); break;
    case FAST_E2M1: rows_avx2_2(j, tab, n0, n1); break;
    case FAST_Q8_0: rows_avx2_4(j, tab, n0, n1); break;
    case FAST_Q4_0: rows_avx2_5(j, tab, n0, n1); break;
    case FAST_Q4_1: rows_avx2_6(j, tab, n0, n1); break;
    case FAST_Q4_F32: rows_avx2_7(j, tab, n0, n1); break;
    case FAST_I8_F32: rows_avx2_8(j, tab, n0, n1); break;
    case FAST_Q5S_F32: rows_avx2_9(j, tab, n0, n1); break;
    case FAST_Q5_F32: rows_avx2_10(j, tab, n0, n1); break;
    default: rows_avx2_3(j, tab, n0, n1); break;
    }
}

int have_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    }
    return cached;
}
#else
int have_avx2(void) { return 0; }
void linear_avx2(const job_t *j, int64_t n0, int64_t n1) { linear_portable(j, n0, n1); }
#endif
