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
 * GGUF blocks (llama.cpp's Q8_0, Q4_0, Q4_1 as stored: accel.formats.ggml, fast 4, 5, 6; block 32, K a multiple of
 * 32): codes [N, K / 32, 32] (Q8_0: int8) or [N, K / 32, 16] (Q4_0, Q4_1: byte i holds weight i in its low nibble,
 * weight i + 16 in its high nibble), scales [N, K / 32, 2] (float16 d, little-endian) or [N, K / 32, 4] (Q4_1: d,
 * then float16 m); no value table. Each weight is d * q (Q8_0), d * (q - 8) (Q4_0) or d * q + m (Q4_1), computed in
 * float32 from the exact float32 value of the halves (half_to_float): d * q is exact (an 11-bit significand times an
 * integer of at most 8 bits), so Q4_1's single rounding is the add's, as in numpy (an FMA of d, q and m rounds the
 * same exact sum once, so it gives the same float32). The portable path decodes them per weight, the AVX2 path per
 * block in a register (the same integers as the codes, converted to float and multiplied by d; the halves by F16C,
 * which every AVX2 CPU has and have_avx2 checks), and on AVX-512F CPUs mxkernel_avx512.c per block in two 16-lane
 * registers, each decoded block multiplied into up to 8 x rows (their own accumulators, the same FMA sequence).
 * Each x row is then reduced with the same sequence of float32 FMAs whatever the number of rows in the call and the
 * number of threads (4 partial sums of 8 lanes, summed at the end), so a token's logits do not depend on how many
 * tokens are scored with it. Repacked GGUF blocks (fast 7 Q4_F32: Q4 nibble codes, float32 d and m a block; fast 8
 * I8_F32: int8 codes, float32 d and m per 16 weights; fast 9 Q5S_F32 and 10 Q5_F32: Q4 nibbles plus a 32-bit plane of
 * fifth bits, float32 d and m a block, 9 subtracting 16 from the codes) hold K-quants (Q2_K to Q6_K) and Q5_0 /
 * Q5_1 exactly: each
 * weight is fma(q, d, m), where d * q is exact (d = the super-block's float16 scale times an integer sub-scale of at
 * most 8 bits, q at most 6 bits: <= 24 significant bits), so the one rounding is the offset's, as in the gguf
 * package's d * q - dm; a type without an offset stores m = -0.0, which leaves d * q as it is, signed zeros included.
 * Rows of W are split over up to 16 threads of a pool kept between calls.
 *
 * Files (compiled together into one library by mxkernel_build.py): this header (the job, the scale table, what the
 * files share), mxkernel.c (the API, the path dispatch, the thread pool), mxkernel_portable.c, mxkernel_avx2.c,
 * mxkernel_avx512.c (GGUF blocks) and mxkernel_vbmi.c (one per path; the x86 ones are stubs elsewhere; the
 * unpacking helpers the paths share are static inline functions at the end of this header), mxkernel_q8.c and
 * mxkernel_gq8.c (int8 activations: integer dot products per block, MX and GGUF blocks, each with its own header
 * comment), mxkernel_attn.c (attention over the KV
 * cache, its own header comment) and mxkernel_ort.c (the onnxruntime operators).
 */
#ifndef MXKERNEL_H
#define MXKERNEL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MXK_X86 1
#else
#define MXK_X86 0
#endif
/* AVX-VNNI (vpdpbusd on 256-bit registers, VEX-encoded; what Intel's client cores since Alder Lake and the Sierra
 * Forest Xeons have instead of AVX-512 VNNI): the int8-activation paths' AVX2 code uses it where the CPU has it
 * (have_avxvnni) and the compiler knows the target (GCC 11, clang 12) */
#if MXK_X86 && ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define MXK_AVXVNNI 1
#else
#define MXK_AVXVNNI 0
#endif

#define MXK_VERSION 9
#define MXK_MAX_THREADS 16
/* the x86 paths prefetch the codes this many bytes ahead of the block they decode: without it one thread streamed
 * packed codes from DRAM at ~6 GB/s on an Intel Xeon (AVX-512 VBMI) VM, with it ~10 GB/s (benchmarks/mx_kernel.py) */
#define MXK_PREFETCH_BYTES 2048
/* a job's x rows in tiles of MXK_X_TILE (a decoded weight block is multiplied into every row of a tile), then one
 * tile of the 1..3 rows left: CALL(n, s0, R) for W row n, R a constant at each call */
#define MXK_X_TILE 4
#define MXK_X_TILES(CALL, j, n)                                                                                      \
    do {                                                                                                             \
        int64_t s0_ = 0;                                                                                             \
        for (; s0_ + MXK_X_TILE <= (j)->s; s0_ += MXK_X_TILE) CALL(n, s0_, MXK_X_TILE);                              \
        switch ((j)->s - s0_) {                                                                                      \
        case 3: CALL(n, s0_, 3); break;                                                                              \
        case 2: CALL(n, s0_, 2); break;                                                                              \
        case 1: CALL(n, s0_, 1); break;                                                                              \
        default: break;                                                                                              \
        }                                                                                                            \
    } while (0)
/* shared between the library's files, not exported from it */
#define MXK_INTERNAL __attribute__((visibility("hidden")))

/* the kernel's format codes (its `fast` argument): 1..3 MX formats with SIMD paths, 4..6 GGUF block types as stored,
 * 7..10 GGUF block types repacked exactly with float32 scales (accel/formats/ggml_repack.py: Q4_K -> 7, Q6_K -> 8,
 * Q5_0 -> 9, Q5_1 and Q5_K -> 10) */
enum {
    FAST_NONE = 0,
    FAST_E2M3 = 1,
    FAST_E2M1 = 2,
    FAST_INT8 = 3,
    FAST_Q8_0 = 4,
    FAST_Q4_0 = 5,
    FAST_Q4_1 = 6,
    FAST_Q4_F32 = 7,
    FAST_I8_F32 = 8,
    FAST_Q5S_F32 = 9,
    FAST_Q5_F32 = 10
};
#define FAST_MAX FAST_Q5_F32

/* 1 for the GGUF block types (fast 4 .. 10) */
static inline int is_gguf(int fast) { return fast >= FAST_Q8_0 && fast <= FAST_MAX; }
/* 1 for the block types whose scale plane holds float32 values (fast 7..10); the others' hold float16 (or E8M0) */
static inline int f32_scales(int fast) { return fast >= FAST_Q4_F32 && fast <= FAST_MAX; }
/* 5-bit block types (fast 9, 10): Q4 nibbles (16 bytes), then 4 bytes whose bit i is code i's fifth bit */
static inline int q5_codes(int fast) { return fast == FAST_Q5S_F32 || fast == FAST_Q5_F32; }
/* nibble-coded block types: byte i holds code i (low nibble) and code i + 16 (high nibble); the 5-bit types too */
static inline int nibble_codes(int fast) {
    return fast == FAST_Q4_0 || fast == FAST_Q4_1 || fast == FAST_Q4_F32 || q5_codes(fast);
}
/* bytes of a block's codes (32 codes) and of its scales, by format code (MX: one E8M0 byte) */
static inline int block_code_bytes(int fast) {
    return fast == FAST_E2M3 ? 24 : q5_codes(fast) ? 20 : fast == FAST_E2M1 || nibble_codes(fast) ? 16 : 32;
}
/* the float scale values of a GGUF block: d (Q8_0, Q4_0), d and m (Q4_1, Q4_F32, Q5S_F32, Q5_F32), d0 m0 d1 m1
 * (I8_F32: one pair for weights 0..15, one for 16..31) */
static inline int block_floats(int fast) {
    return fast == FAST_I8_F32 ? 4 : fast == FAST_Q4_1 || f32_scales(fast) ? 2 : 1;
}
static inline int block_scale_bytes(int fast) {
    return !is_gguf(fast) ? 1 : block_floats(fast) * (f32_scales(fast) ? 4 : 2);
}
/* the code width in bits of a GGUF block type (0 for another code) */
static inline int gguf_bits(int fast) {
    return fast == FAST_Q8_0 || fast == FAST_I8_F32 ? 8 : q5_codes(fast) ? 5 : is_gguf(fast) ? 4 : 0;
}
/* what a block type subtracts from its unsigned codes before scaling: 8 (Q4_0), 16 (Q5S_F32), else 0 */
static inline int code_offset(int fast) { return fast == FAST_Q4_0 ? 8 : fast == FAST_Q5S_F32 ? 16 : 0; }
/* 1 for the block types whose weights are fma(q, d, m) (an offset m; -0.0 where the file's type has none) */
static inline int has_offset(int fast) { return fast == FAST_Q4_1 || fast >= FAST_Q4_F32; }

typedef struct {
    const uint8_t *codes, *scales;
    const float *lut; /* 256 floats: value of each code (portable path) */
    const float *x;   /* [S, xstride] float32, columns K..xstride-1 zero */
    float *y;         /* [S, N] */
    int64_t n, k, nblocks, s, xstride;
    int bits, block, fast;
    const int8_t *xq; /* int8 activations [S, nblocks, 32] (mxkernel_q8.c); NULL: float activations x */
    const float *xd;  /* their per-block scales [S, nblocks] */
    int q8_path;      /* 0 portable, 1 AVX2, 2 AVX-512 VNNI, 3 VNNI + VBMI */
    /* a job of another kind (mxkernel_attn.c): run_parts splits [0, n) and calls fn(fn_ctx, i0, i1) per part */
    void (*fn)(const void *fn_ctx, int64_t i0, int64_t i1);
    const void *fn_ctx;
    const float *xu; /* GGUF blocks with an offset (mxkernel_gq8.c): xd * the sum of each block's int8 codes [S, nblocks] */
    /* an interleaved job (mxkernel_gx16.c): n counts groups of 16 W rows, width the outputs a y row holds */
    int x16;
    int64_t width;
    const int32_t *xs; /* the sum of each block's int8 codes [S, nblocks] */
} job_t;

/* 2^(s - 127 - shift) of E8M0 code s; NaN for 0xFF */
static inline float scale_value(uint8_t s, int shift) { return s == 0xFF ? NAN : ldexpf(1.0f, (int)s - 127 - shift); }

/* the float32 value of IEEE half h, exactly (subnormal halves, signed zeros, infinities; NaN stays NaN, payload kept):
 * branch-light bit arithmetic (F. Giesen's half_to_float_fast3); the one float operation, for subnormal halves,
 * subtracts two normal float32 values exactly (so a flush-to-zero mode cannot change it) */
static inline float half_to_float(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } o, magic;
    magic.u = 113u << 23;                      /* 2^-14 */
    const uint32_t shifted_exp = 0x7C00u << 13; /* the exponent bits after the shift */
    o.u = (uint32_t)(h & 0x7FFF) << 13;
    uint32_t exp = shifted_exp & o.u;
    o.u += (127u - 15u) << 23; /* rebias */
    if (exp == shifted_exp) {
        o.u += (128u - 16u) << 23; /* Inf / NaN: exponent all ones */
    } else if (exp == 0) {
        o.u += 1u << 23; /* zero / subnormal: 2^-14 * (1 + m / 1024) - 2^-14 = m * 2^-24 */
        o.f -= magic.f;
    }
    o.u |= (uint32_t)(h & 0x8000) << 16;
    return o.f;
}

/* the half at p (2 bytes, little-endian) as float32 */
static inline float half_at(const uint8_t *p) { return half_to_float((uint16_t)(p[0] | (p[1] << 8))); }

/* SCALES[fast][s] = 2^(s - 127 - shift of the fast path's integers), NaN for 0xFF; filled when the library loads */
MXK_INTERNAL extern float SCALES[4][256];

/* code i of packed codes p with `bits` bits a code (LSB first: FP6 4 codes in 3 bytes, FP4 low nibble first) */
static inline unsigned code_at(const uint8_t *p, int64_t i, int bits) {
    if (bits == 8) return p[i];
    if (bits == 4) return (p[i >> 1] >> ((i & 1) * 4)) & 15u;
    int64_t bit = 6 * i, byte = bit >> 3;
    int sh = (int)(bit & 7);
    unsigned v = p[byte];
    if (sh > 2) v |= (unsigned)p[byte + 1] << 8;
    return (v >> sh) & 63u;
}

/* each path computes rows [n0, n1) of y (decode_rows_portable: of the decoded weights) */
/* the 32 weights of GGUF block b of row n (fast 4, 5, 6), exactly: the portable path's decode */
MXK_INTERNAL void gguf_block_portable(const job_t *j, int64_t n, int64_t b, float w[32]);
MXK_INTERNAL void decode_rows_portable(const job_t *j, int64_t r0, int64_t r1, float *out);
MXK_INTERNAL void linear_portable(const job_t *j, int64_t n0, int64_t n1);
MXK_INTERNAL void linear_avx2(const job_t *j, int64_t n0, int64_t n1);
MXK_INTERNAL void linear_vbmi(const job_t *j, int64_t n0, int64_t n1);
MXK_INTERNAL void linear_gguf_avx512(const job_t *j, int64_t n0, int64_t n1); /* GGUF blocks, AVX-512F */
MXK_INTERNAL void linear_q8(const job_t *j, int64_t n0, int64_t n1, int path);
MXK_INTERNAL void linear_gq8(const job_t *j, int64_t n0, int64_t n1, int path); /* GGUF blocks (mxkernel_gq8.c) */
/* groups [g0, g1) of 16 W rows in the interleaved layout (mxkernel_gx16.c) */
MXK_INTERNAL void linear_gx16(const job_t *j, int64_t g0, int64_t g1, int path);
/* u[r, b, h] = d[r, b] * (float)sum of block b's codes (halves 1) or of each half's (halves 2), sq the sums (NULL: not
 * wanted) (mxkernel_gq8.c) */
void mxk_q8_block_sums(const int8_t *q, const float *d, int64_t rows, int64_t nblocks, int halves, float *u,
                       int32_t *sq);
/* activations x [S, xstride] -> int8 codes q [S, nblocks, 32] and scales d [S, nblocks] (mxkernel_q8.c) */
void mxk_quantize_q8(const float *x, int64_t s, int64_t xstride, int64_t nblocks, int8_t *q, float *d);
/* the API's y[S, N] = x[S, K] @ W^T (mxkernel.c; the onnxruntime operator of mxkernel_ort.c calls it too) */
int mxk_linear(const uint8_t *codes, const uint8_t *scales, const float *lut, int bits, int block, int fast, int64_t n,
               int64_t k, int64_t nblocks, const float *x, int64_t s, int64_t xstride, float *y, int threads);
int mxk_decode_ggml(const uint8_t *codes, const uint8_t *scales, int fast, int64_t n, int64_t nblocks, float *out,
                    int threads);
/* accel's cache attention (mxkernel_attn.c, the onnxruntime operator ai.accel::CacheAttention) */
int mxk_cache_attention(const float *qkv, float *kc, float *vc, const int64_t *pos, const int64_t *slots,
                        const float *cos_t, const float *sin_t, const uint8_t *tree_mask, int64_t b, int64_t s,
                        int64_t h, int64_t hkv, int64_t d, int64_t ctx, float *out, int threads);
/* out[r, i] = silu(y[r, i]) * y[r, half + i] for y [rows, 2 half] (mxkernel_attn.c: MXLinear's glu attribute) */
void mxk_silu_mul(const float *y, int64_t rows, int64_t half, float *out);
/* split [0, n) over up to `threads` parts of the pool, fn(ctx, i0, i1) each (mxkernel.c) */
MXK_INTERNAL int mxk_parallel(void (*fn)(const void *, int64_t, int64_t), const void *ctx, int64_t n, int threads);
/* A parallel-for the caller's runtime provides (onnxruntime's intra-op pool, mxkernel_ort.c): runs fn(usr, i) once for
 * every i in [0, total), on any of its threads in any order, and returns 0; nonzero when it ran none (the caller then
 * runs them itself). Set per calling thread: the calls this thread makes until it is set to NULL split their rows
 * into parts this runs, instead of the library's own pool (so two pools never compete for the same cores). */
typedef int (*mxk_pfor_t)(void *pctx, void (*fn)(void *usr, size_t i), size_t total, void *usr);
MXK_INTERNAL void mxk_use_pfor(mxk_pfor_t pfor, void *pctx);
long mxk_pfor_calls(void); /* calls that ran on a runtime's parallel-for (mxk_use_pfor) */
int mxk_linear_q8(const uint8_t *codes, const uint8_t *scales, int fast, int64_t n, int64_t nblocks, const float *x,
                  int64_t s, int64_t xstride, float *y, int threads);
int mxk_linear_x16(const uint8_t *codes, const uint8_t *scales, int fast, int64_t n, int64_t nblocks, const float *x,
                   int64_t s, int64_t xstride, float *y, int threads);
/* whether the CPU runs a path (0 where it was not compiled for x86-64) */
MXK_INTERNAL int have_avx2(void);
MXK_INTERNAL int have_vbmi(void);
MXK_INTERNAL int have_avx512f(void);
MXK_INTERNAL int mxk_isa_cap(void); /* mxk_set_isa's level */
MXK_INTERNAL int have_vnni(void);
MXK_INTERNAL int have_avxvnni(void);
int mxk_avxvnni(void); /* whether the int8-activation AVX2 path (mxk_q8_path 1) uses AVX-VNNI now */

#if MXK_X86
#define MXK_AVX2 __attribute__((target("avx2,fma")))
/* the 32 codes of an FP6 block (24 bytes) as 32 bytes, code i in bits 2..7 of byte i (bits 0..1 are left over from
 * the neighbouring code: the users below shift or mask them away, and a byte is zero only where its code is) */
MXK_AVX2 static inline __m256i unpack_fp6(const uint8_t *p) {
    __m128i lo = _mm_loadu_si128((const __m128i *)p);       /* bytes 0..15: groups 0..3 at 0..11 */
    __m128i hi = _mm_loadu_si128((const __m128i *)(p + 8)); /* bytes 8..23: groups 4..7 at 4..15 */
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    /* each dword from one 3-byte group g0 g1 g2 (codes c0..c3 at bits 0, 6, 12, 18): the words g0 | g1 << 8 (c0 at
     * bit 0, c1 at 6) and g1 | g2 << 8 (c2 at 4, c3 at 10); the first word times 16 (bits past 15 drop) puts both
     * words' codes at bits 4 and 10 (below bit 4: zeros or c1's high bits). The high byte of each word then holds
     * its code at bits 2..7 already; the low byte takes the word shifted right by 2. */
    const __m256i spread = _mm256_setr_epi8(0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 7, 8, 9, 10, 10, 11, /* lane 0 */
                                            4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11, 12, 13, 14, 14, 15);
    v = _mm256_mullo_epi16(_mm256_shuffle_epi8(v, spread), _mm256_set1_epi32(0x00010010));
    return _mm256_blendv_epi8(_mm256_srli_epi16(v, 2), v, _mm256_set1_epi16((short)0x8000));
}

/* the 32 fifth bits at p (4 bytes, bit i: code i) as bytes 16 or 0, in code order: each byte of the broadcast mask
 * copied to the 8 result bytes it covers, then tested against that byte's own bit */
MXK_AVX2 static inline __m256i fifth_bits(const uint8_t *p) {
    uint32_t m;
    memcpy(&m, p, 4);
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i t = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)m), pick), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(t, bit), _mm256_set1_epi8(16));
}

/* E2M3 codes (unpack_fp6's bytes: code << 2) -> value * 8 as int8: magnitude s.ee.mmm: e = 0, 1 give the low 4
 * bits themselves; e = 2, 3 a table; then the sign (bit 5) */
MXK_AVX2 static inline __m256i e2m3_magnitudes(__m256i c) { /* |value| * 8 of unpack_fp6's bytes c */
    const __m256i high = _mm256_setr_epi8(16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60, 16, 18, 20,
                                          22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60);
    __m256i lo4 = _mm256_and_si256(_mm256_srli_epi16(c, 2), _mm256_set1_epi8(0x0F)); /* the code's bits 0..3 */
    /* vpblendvb reads bit 7 of each mask byte: the code's bit 4, one place up (what crosses into the next byte of
     * the word lands in its bit 0) */
    return _mm256_blendv_epi8(lo4, _mm256_shuffle_epi8(high, lo4), _mm256_slli_epi16(c, 1));
}
/* a byte negative exactly where the code is (its sign, bit 5, is the byte's bit 7), zero only where the code is 0 */
MXK_AVX2 static inline __m256i e2m3_signs(__m256i c) { return c; }
MXK_AVX2 static inline __m256i e2m3_ints(__m256i c) {
    return _mm256_sign_epi8(e2m3_magnitudes(c), e2m3_signs(c)); /* a zero byte has magnitude 0 anyway */
}

/* the 32 codes of an FP4 block (16 bytes) -> value * 2 as int8, in code order */
MXK_AVX2 static inline __m256i e2m1_ints(const uint8_t *p) {
    const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    __m128i first = _mm_unpacklo_epi8(lo, hi), second = _mm_unpackhi_epi8(lo, hi);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_shuffle_epi8(table, first)),
                                   _mm_shuffle_epi8(table, second), 1);
}

/* the 8 int32 lanes of a block's int8 products, 4 bytes a lane, aw unsigned and sx signed (the int8-activation
 * paths): vpmaddubsw then vpmaddwd (AVX2) or vpdpbusd (VNNI), equal wherever no pair sum reaches int16's limit (MX
 * weights: <= 2 * 127 * 60; GGUF blocks: <= 2 * 128 * 127) */
MXK_AVX2 static inline __m256i dot_u8s8_avx2(__m256i aw, __m256i sx) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
}
#define MXK_VNNI __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")))
MXK_VNNI static inline __m256i dot_u8s8_vnni(__m256i aw, __m256i sx) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
}
#if MXK_AVXVNNI
/* the AVX2 paths' functions with AVX-VNNI's vpdpbusd (VEX) in place of vpmaddubsw + vpmaddwd: the same int32 lanes */
#define MXK_AVXVNNI_FN __attribute__((target("avx2,fma,f16c,avxvnni")))
MXK_AVXVNNI_FN static inline __m256i dot_u8s8_avxvnni(__m256i aw, __m256i sx) {
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aw, sx);
}
#endif
/* (acc0 + acc1) + (acc2 + acc3) lane by lane, from the 512-bit accumulators a01 = acc0 | acc1 and a23 = acc2 | acc3
 * of the int8-activation paths' two-blocks-a-register loops (their 256-bit halves) */
MXK_VNNI static inline __m256 pair_acc_sum(__m512 a01, __m512 a23) {
    const __m256 hi01 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a01), 1));
    const __m256 hi23 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a23), 1));
    return _mm256_add_ps(_mm256_add_ps(_mm512_castps512_ps256(a01), hi01), _mm256_add_ps(_mm512_castps512_ps256(a23), hi23));
}

#define MXK_VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma")))
/* the 32 codes of a block -> value * 2^shift as int8 (256-bit VBMI ops): a masked load of the block's bytes, vpermb
 * puts the bytes of 8 codes in each qword, vpmultishiftqb moves code j of a qword to its byte j, and a byte table
 * (vpermt2b: 64 entries for 6-bit codes; vpermb with the 16 entries twice for 4-bit codes) gives the integer */
MXK_VBMI static inline __m256i block_ints_vbmi(int fast, const uint8_t *p) {
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
MXK_VBMI static inline __m512i pair_ints_vbmi(int fast, const uint8_t *p) {
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
#endif

#endif
