/* Fused MX decode kernels: y = x @ W^T read straight from packed MX codes and E8M0 block scales.
 *
 * Built on first use by accel/formats/mxkernel_build.py with the system C compiler (cc -O2 -shared -fPIC) and loaded
 * with ctypes; accel falls back to numpy when that is not possible. Plain C99 + pthreads; the AVX2 paths are compiled
 * with a function target attribute and chosen at run time, so one build runs on any x86-64 (and the portable path
 * on any CPU). Never built with -ffast-math (it would flush subnormals process-wide and break exactness).
 *
 * Weight layout (accel.formats.MXTensor of shape [N, K] blocked along K, docs/formats.md): row n holds nblocks blocks
 * of block_size codes, the codes of the whole padded [N, nblocks * block_size] array bit-packed LSB first in C order
 * (FP6: 4 codes in 3 bytes; FP4: 2 codes a byte, first in the low nibble; 8-bit: a byte a code);
 * scales[n * nblocks + b] is the E8M0 code of block b (value 2^(s - 127), 0xFF = NaN).
 *
 * Two paths compute each weight exactly (the same float32 value as accel.formats' decode, up to the sign of a zero):
 * - portable (any format, any block size): value = lut[code] * 2^(s - 127) in float32, lut = fmt.code_values();
 * - AVX2 + FMA (block 32; MXFP6 E2M3, MXFP4 E2M1, MXINT8): the codes of a block are unpacked in a register and mapped
 *   to the integers value * 2^shift (E2M3: x8 in [-60, 60]; E2M1: x2 in [-12, 12]; INT8: x64 = the code itself) by a
 *   byte shuffle, converted to float and multiplied by 2^(s - 127 - shift): an exact product.
 * Each x row is then reduced with the same sequence of float32 FMAs whatever the number of rows in the call and the
 * number of threads (4 partial sums of 8 lanes, summed at the end), so a token's logits do not depend on how many
 * tokens are scored with it. Rows of W are split over up to 16 threads of a pool kept between calls.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MXK_X86 1
#else
#define MXK_X86 0
#endif

#define MXK_VERSION 2
#define MXK_MAX_THREADS 16

enum { FAST_NONE = 0, FAST_E2M3 = 1, FAST_E2M1 = 2, FAST_INT8 = 3 };

typedef struct {
    const uint8_t *codes, *scales;
    const float *lut; /* 256 floats: value of each code (portable path) */
    const float *x;   /* [S, xstride] float32, columns K..xstride-1 zero */
    float *y;         /* [S, N] */
    int64_t n, k, nblocks, s, xstride;
    int bits, block, fast;
} job_t;

int mxk_version(void) { return MXK_VERSION; }

static float pow2f(int e) { return ldexpf(1.0f, e); }

static float scale_value(uint8_t s, int shift) { return s == 0xFF ? NAN : pow2f((int)s - 127 - shift); }

/* SCALES[fast][s] = 2^(s - 127 - shift of the fast path's integers), NaN for 0xFF; filled when the library loads */
static float SCALES[4][256];

__attribute__((constructor)) static void init_scales(void) {
    static const int shift[4] = {0, 3, 1, 6};
    for (int f = 0; f < 4; f++)
        for (int s = 0; s < 256; s++) SCALES[f][s] = scale_value((uint8_t)s, shift[f]);
}

static inline unsigned code_at(const uint8_t *p, int64_t i, int bits) {
    if (bits == 8) return p[i];
    if (bits == 4) return (p[i >> 1] >> ((i & 1) * 4)) & 15u;
    int64_t bit = 6 * i, byte = bit >> 3;
    int sh = (int)(bit & 7);
    unsigned v = p[byte];
    if (sh > 2) v |= (unsigned)p[byte + 1] << 8;
    return (v >> sh) & 63u;
}

/* ------------------------------------------------------------------------------------------------- portable */

static void decode_rows_portable(const job_t *j, int64_t r0, int64_t r1, float *out) {
    int64_t width = j->nblocks * j->block;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t b = 0; b < j->nblocks; b++) {
            float sc = scale_value(j->scales[r * j->nblocks + b], 0);
            int64_t base = r * width + b * j->block;
            for (int e = 0; e < j->block; e++) out[base + e] = j->lut[code_at(j->codes, base + e, j->bits)] * sc;
        }
    }
}

static void linear_portable(const job_t *j, int64_t n0, int64_t n1) {
    int64_t width = j->nblocks * j->block;
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t s = 0; s < j->s; s++) {
            const float *x = j->x + s * j->xstride;
            float acc = 0.0f;
            for (int64_t b = 0; b < j->nblocks; b++) {
                float sc = scale_value(j->scales[n * j->nblocks + b], 0);
                int64_t base = n * width + b * j->block;
                int64_t stop = j->k - b * j->block < j->block ? j->k - b * j->block : j->block;
                for (int64_t e = 0; e < stop; e++) acc += (j->lut[code_at(j->codes, base + e, j->bits)] * sc) * x[b * j->block + e];
            }
            j->y[s * j->n + n] = acc;
        }
    }
}

/* ------------------------------------------------------------------------------------------------- AVX2 */
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

AVX2 static void linear_avx2(const job_t *j, int64_t n0, int64_t n1) {
    const float *tab = SCALES[j->fast];
    if (j->fast == FAST_E2M3)
        rows_avx2_1(j, tab, n0, n1);
    else if (j->fast == FAST_E2M1)
        rows_avx2_2(j, tab, n0, n1);
    else
        rows_avx2_3(j, tab, n0, n1);
}

/* ------------------------------------------------------------------------------------------ AVX-512 VBMI */
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

/* block b of one W row against one x row: the 32 integer * x products summed (float32), times the block's scale */
#define VBMI_BLOCK(acc, w0, w1, xrow, b, scale)                                                                      \
    acc = _mm512_fmadd_ps(                                                                                          \
        _mm512_fmadd_ps(w1, _mm512_loadu_ps((xrow) + 32 * (b) + 16), _mm512_mul_ps(w0, _mm512_loadu_ps((xrow) + 32 * (b)))), \
        scale, acc)

/* one W row against x rows s0 (and s0 + 1 when pair): per block p = sum of the 32 integer * x products (float32),
 * then acc += p * 2^(s - 127 - shift); even and odd blocks go to two accumulators per x row. `fast` and `pair` are
 * constants at every call site, so each combination compiles to its own branch-free loop. */
VBMI static inline __attribute__((always_inline)) void row_dot_vbmi(const job_t *j, const float *scale_tab, int64_t n,
                                                                    int64_t s0, const int fast, const int pair) {
    const int bytes = fast == FAST_E2M3 ? 24 : fast == FAST_E2M1 ? 16 : 32;
    const int64_t nblocks = j->nblocks;
    const uint8_t *row = j->codes + n * nblocks * bytes;
    const uint8_t *sc = j->scales + n * nblocks;
    const float *x0 = j->x + s0 * j->xstride, *x1 = x0 + j->xstride;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    int64_t b = 0;
    for (; b + 1 < nblocks; b += 2) {
        __m256i v = block_ints_vbmi(fast, row + bytes * b), u = block_ints_vbmi(fast, row + bytes * (b + 1));
        __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v)));
        __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1)));
        __m512 w2 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(u)));
        __m512 w3 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(u, 1)));
        __m512 s_even = _mm512_set1_ps(scale_tab[sc[b]]), s_odd = _mm512_set1_ps(scale_tab[sc[b + 1]]);
        VBMI_BLOCK(a0, w0, w1, x0, b, s_even);
        VBMI_BLOCK(a1, w2, w3, x0, b + 1, s_odd);
        if (pair) {
            VBMI_BLOCK(b0, w0, w1, x1, b, s_even);
            VBMI_BLOCK(b1, w2, w3, x1, b + 1, s_odd);
        }
    }
    if (b < nblocks) { /* an odd last block: the even accumulator, as in the pairs above */
        __m256i v = block_ints_vbmi(fast, row + bytes * b);
        __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v)));
        __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1)));
        __m512 s_even = _mm512_set1_ps(scale_tab[sc[b]]);
        VBMI_BLOCK(a0, w0, w1, x0, b, s_even);
        if (pair) VBMI_BLOCK(b0, w0, w1, x1, b, s_even);
    }
    j->y[s0 * j->n + n] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    if (pair) j->y[(s0 + 1) * j->n + n] = _mm512_reduce_add_ps(_mm512_add_ps(b0, b1));
}

#define VBMI_ROWS(FAST)                                                                                              \
    VBMI static void rows_vbmi_##FAST(const job_t *j, const float *tab, int64_t n0, int64_t n1) {                    \
        for (int64_t n = n0; n < n1; n++) {                                                                           \
            int64_t s = 0;                                                                                            \
            for (; s + 1 < j->s; s += 2) row_dot_vbmi(j, tab, n, s, FAST, 1);                                         \
            if (s < j->s) row_dot_vbmi(j, tab, n, s, FAST, 0);                                                        \
        }                                                                                                             \
    }
VBMI_ROWS(1)
VBMI_ROWS(2)
VBMI_ROWS(3)

VBMI static void linear_vbmi(const job_t *j, int64_t n0, int64_t n1) {
    const float *tab = SCALES[j->fast];
    if (j->fast == FAST_E2M3)
        rows_vbmi_1(j, tab, n0, n1);
    else if (j->fast == FAST_E2M1)
        rows_vbmi_2(j, tab, n0, n1);
    else
        rows_vbmi_3(j, tab, n0, n1);
}

static int have_vbmi(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
                 __builtin_cpu_supports("fma");
    }
    return cached;
}

static int have_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
}
#else
static int have_avx2(void) { return 0; }
static int have_vbmi(void) { return 0; }
static void linear_avx2(const job_t *j, int64_t n0, int64_t n1) { linear_portable(j, n0, n1); }
static void linear_vbmi(const job_t *j, int64_t n0, int64_t n1) { linear_portable(j, n0, n1); }
#endif

static int max_isa = 2; /* mxk_set_isa: the highest path allowed (tests and benchmarks compare the paths) */

/* 0: portable loop; 1: AVX2 + FMA; 2: AVX-512 VBMI (256-bit byte permutes) */
static int use_fast(const job_t *j) {
    if (j->fast == FAST_NONE || j->block != 32 || max_isa < 1 || !have_avx2()) return 0;
    return max_isa >= 2 && have_vbmi() ? 2 : 1;
}

/* the highest path to use from now on: 2 (default: the best the CPU has), 1 (AVX2 at most), 0 (portable only) */
void mxk_set_isa(int level) { max_isa = level; }

/* ------------------------------------------------------------------------------------------------- threads */

typedef struct {
    const job_t *job;
    int64_t n0, n1;
    float *decode_out; /* NULL: linear */
} part_t;

static void *run_part(void *arg) {
    part_t *p = (part_t *)arg;
    if (p->decode_out)
        decode_rows_portable(p->job, p->n0, p->n1, p->decode_out);
    else if (use_fast(p->job) == 2)
        linear_vbmi(p->job, p->n0, p->n1);
    else if (use_fast(p->job) == 1)
        linear_avx2(p->job, p->n0, p->n1);
    else
        linear_portable(p->job, p->n0, p->n1);
    return NULL;
}

/* A small pool of worker threads, started on first need and kept: worker w runs part w + 1 of each call while the
 * caller runs part 0. Idle workers sleep on a condition variable (no spinning: the machine may be shared). Calls are
 * serialised (ctypes releases the GIL, so two Python threads may call at once). After fork() the child starts over. */
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER, pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static part_t pool_parts[MXK_MAX_THREADS];
static int pool_workers = 0, pool_nparts = 0, pool_pending = 0, atfork_done = 0;
static long pool_generation = 0;

/* arg: the worker's index (low 8 bits) and the generation current when it was created (the calls before it) */
static void *worker_main(void *arg) {
    int w = (int)((intptr_t)arg & 0xFF);
    long seen = (long)((intptr_t)arg >> 8);
    pthread_mutex_lock(&pool_mu);
    for (;;) {
        while (pool_generation == seen) pthread_cond_wait(&work_cv, &pool_mu);
        seen = pool_generation;
        if (w + 1 < pool_nparts) {
            part_t part = pool_parts[w + 1];
            pthread_mutex_unlock(&pool_mu);
            run_part(&part);
            pthread_mutex_lock(&pool_mu);
            if (--pool_pending == 0) pthread_cond_signal(&done_cv);
        }
    }
    return NULL;
}

static void pool_after_fork(void) {
    pool_workers = pool_nparts = pool_pending = 0;
    pool_generation = 0;
    pthread_mutex_init(&call_mu, NULL);
    pthread_mutex_init(&pool_mu, NULL);
    pthread_cond_init(&work_cv, NULL);
    pthread_cond_init(&done_cv, NULL);
}

/* start workers up to `want`; returns how many exist (fewer if the system refuses threads) */
static int pool_grow(int want) {
    if (!atfork_done) atfork_done = pthread_atfork(NULL, NULL, pool_after_fork) == 0;
    while (pool_workers < want) {
        pthread_t tid;
        pthread_mutex_lock(&pool_mu); /* the generation changes only under call_mu, which the caller holds */
        intptr_t arg = ((intptr_t)pool_generation << 8) | pool_workers;
        pthread_mutex_unlock(&pool_mu);
        if (pthread_create(&tid, NULL, worker_main, (void *)arg) != 0) break;
        pthread_detach(tid);
        pool_workers++;
    }
    return pool_workers;
}

/* split rows [0, n) over up to `threads` parts (the caller's thread runs the first one) */
static int run_parts(const job_t *j, int threads, float *decode_out) {
    if (threads < 1) threads = 1;
    if (threads > MXK_MAX_THREADS) threads = MXK_MAX_THREADS;
    if (threads > j->n) threads = (int)(j->n > 0 ? j->n : 1);
    pthread_mutex_lock(&call_mu);
    if (threads > 1 && pool_grow(threads - 1) < threads - 1) threads = pool_workers + 1; /* the system refused */
    for (int t = 0; t < threads; t++) {
        pool_parts[t].job = j;
        pool_parts[t].n0 = j->n * t / threads;
        pool_parts[t].n1 = j->n * (t + 1) / threads;
        pool_parts[t].decode_out = decode_out;
    }
    if (threads > 1) {
        pthread_mutex_lock(&pool_mu);
        pool_nparts = threads;
        pool_pending = threads - 1;
        pool_generation++;
        pthread_cond_broadcast(&work_cv);
        pthread_mutex_unlock(&pool_mu);
    }
    part_t first = pool_parts[0];
    run_part(&first);
    if (threads > 1) {
        pthread_mutex_lock(&pool_mu);
        while (pool_pending > 0) pthread_cond_wait(&done_cv, &pool_mu);
        pthread_mutex_unlock(&pool_mu);
    }
    pthread_mutex_unlock(&call_mu);
    return 0;
}

/* ------------------------------------------------------------------------------------------------- API */

/* 1 if the AVX2 path serves format `fast` (1 E2M3, 2 E2M1, 3 INT8) at block size `block` on this CPU */
int mxk_fast_path(int fast, int block) {
    job_t j;
    memset(&j, 0, sizeof j);
    j.fast = fast;
    j.block = block;
    return use_fast(&j);
}

/* out[n, nblocks * block] = every weight of the padded array (float32, bit-exact to accel.formats' decode) */
int mxk_decode(const uint8_t *codes, const uint8_t *scales, const float *lut, int bits, int block, int64_t n,
               int64_t nblocks, float *out, int threads) {
    job_t j = {codes, scales, lut, NULL, NULL, n, nblocks * block, nblocks, 0, 0, bits, block, FAST_NONE};
    return run_parts(&j, threads, out);
}

/* y[S, N] = x[S, K] @ W^T; x rows are xstride >= nblocks * block floats apart, columns K.. zero */
int mxk_linear(const uint8_t *codes, const uint8_t *scales, const float *lut, int bits, int block, int fast,
               int64_t n, int64_t k, int64_t nblocks, const float *x, int64_t s, int64_t xstride, float *y,
               int threads) {
    job_t j = {codes, scales, lut, x, y, n, k, nblocks, s, xstride, bits, block, fast};
    return run_parts(&j, threads, NULL);
}
