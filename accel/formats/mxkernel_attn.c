/* Attention over the position-indexed KV cache, one operator per layer (ai.accel::CacheAttention, mxkernel_ort.c):
 * from the layer's joined q/k/v projection it applies RoPE, writes each token's K/V row at its cache slot (in place)
 * and attends each query head over the slots its token sees, only those (not the whole cache).
 *
 * qkv [B, S, (H + 2 Hkv) * D]: per token the H query heads, then Hkv key heads, then Hkv value heads (the output of
 * the joined Linear). kc, vc [B, Hkv, ctx, D]: the cache. pos [B, S]: positions (-1: a padding column, which writes
 * nothing and gets zeros); slots [B, S]: the slot each token writes (its position, or a tree call's slot_ids).
 * cos_t, sin_t [ctx, D / 2] (NULL: no RoPE): the angles of each position; RoPE rotates halves (rotate_half):
 * out[:D/2] = x1 cos - x2 sin, out[D/2:] = x2 cos + x1 sin, plain float32 products and a difference or sum (never
 * fused into an FMA: rope_row is compiled without FMA and never inlined). tree_mask [B, S, ctx] (NULL: a chain call,
 * where token (b, s) sees the slots t <= pos[b, s]): the slots each token sees. All writes happen before any read.
 * out [B, S, H * D]: query head hq of KV head hq / (H / Hkv).
 *
 * Per query row: scores sc_t = dot(q, K_t) * (1 / sqrt(D)) over the visible slots t in increasing order; m = max;
 * e_t = exp(sc_t - m) (exp_portable below: a polynomial within 3 ulp of expf; the AVX2 path 8 slots at a time, the
 * same floats); sum = e_t added in slot order; out = (sum_t e_t * V_t, an FMA per slot in slot order) / sum.
 * The dot product is 8 lanes of FMAs (lane i takes elements i, i + 8, ...) summed as ((l0 + l4) + (l2 + l6)) +
 * ((l1 + l5) + (l3 + l7)), then the D % 8 tail by FMAs: the portable loop (fmaf) and the AVX2 path (D a multiple of
 * 8; the dots of 8 slots at a time where all 8 are visible, the output sums of 64 columns kept in registers across
 * the slots) compute exactly the same floats. A row's
 * result depends only on its query and the cache slots it sees: not on the other tokens of the call, the cache
 * length or the threads. A row with a position or slot outside the cache is
 * NaN (a graph or call accel does not make; OrtBackend checks positions). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mxkernel.h"

typedef struct {
    const float *qkv, *cos_t, *sin_t;
    float *kc, *vc, *out;
    const int64_t *pos, *slots;
    const uint8_t *tree_mask;
    int64_t b, s, h, hkv, d, ctx;
    int simd;
} attn_t;

/* RoPE of one head row x [D] at angles (c, s) [D / 2] into y (no FMA: see the header) */
__attribute__((noinline)) static void rope_row(const float *x, const float *c, const float *s, int64_t d, float *y) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = x[i] * c[i], b = x[i + half] * s[i];
        float e = x[i + half] * c[i], f = x[i] * s[i];
        y[i] = a - b;
        y[i + half] = e + f;
    }
}

static float dot_portable(const float *a, const float *b, int64_t d) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
        for (int k = 0; k < 8; k++) l[k] = fmaf(a[i + k], b[i + k], l[k]);
    float r = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for (; i < d; i++) r = fmaf(a[i], b[i], r);
    return r;
}

static void axpy_portable(float e, const float *v, float *y, int64_t d) {
    for (int64_t i = 0; i < d; i++) y[i] = fmaf(e, v[i], y[i]);
}

/* exp(x) for the softmax (x = score - max <= 0; NaN stays NaN): x clamped to [-88, 88], n = rint(x / ln 2),
 * r = x - n ln2_hi - n ln2_lo (FMAs), a degree-6 polynomial (Taylor terms; |r| <= ln 2 / 2), times 2^n made from
 * its exponent bits (x below about -87.7, where 2^n <= 2^-127: 0). Within 3 ulp of expf (2.7 of exp) wherever the
 * result is a normal float32: checked over every float32 in [-88, 0]. The AVX2 loop (exp8_avx2) performs the same
 * operations 8 lanes at a time: the same floats. */
#define EXP_C1 0.5f
#define EXP_C2 0.16666667163372039794921875f    /* 1/6 */
#define EXP_C3 0.041666667908430099487304688f   /* 1/24 */
#define EXP_C4 0.008333333767950534820556641f   /* 1/120 */
#define EXP_C5 0.001388888922519981861114502f   /* 1/720 */
#define EXP_LN2_HI 0.693145751953125f
#define EXP_LN2_LO 1.428606765330187045e-06f
#define EXP_LOG2E 1.44269502162933349609375f
static float exp_portable(float x) {
    if (x != x) return x;
    x = x < -88.0f ? -88.0f : x > 88.0f ? 88.0f : x;
    float n = rintf(x * EXP_LOG2E);
    float r = fmaf(-n, EXP_LN2_HI, x);
    r = fmaf(-n, EXP_LN2_LO, r);
    float p = fmaf(EXP_C5, r, EXP_C4);
    p = fmaf(p, r, EXP_C3);
    p = fmaf(p, r, EXP_C2);
    p = fmaf(p, r, EXP_C1);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t e = (int32_t)n + 127;
    union {
        uint32_t u;
        float f;
    } two;
    two.u = e > 0 ? (uint32_t)e << 23 : 0u;
    return p * two.f;
}

/* e[t] = exp(sc[t] - m) for t in [0, last] (masked slots: anything; they are skipped) */
static void exps_portable(float *sc, int64_t last, float m) {
    for (int64_t t = 0; t <= last; t++) sc[t] = exp_portable(sc[t] - m);
}

/* out[0..d) = sum over the visible slots t in order of e[t] * V_t: an FMA per element a slot */
static void pv_portable(const float *e, const float *vb, const uint8_t *mask, int64_t last, int64_t d, float *out) {
    memset(out, 0, sizeof(float) * (size_t)d);
    for (int64_t t = 0; t <= last; t++)
        if (!mask || mask[t]) axpy_portable(e[t], vb + t * d, out, d);
}

#if MXK_X86
#define ATTN_AVX2 __attribute__((target("avx2,fma")))
ATTN_AVX2 static float dot_avx2(const float *a, const float *b, int64_t d) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)); /* l0+l4 .. l3+l7 */
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));                                             /* (l0+l4)+(l2+l6), ... */
    u = _mm_add_ss(u, _mm_movehdup_ps(u));
    return _mm_cvtss_f32(u);
}

/* the dots of q with 8 rows k0 + t * d (t = 0..7): each exactly dot_avx2's, 8 independent FMA chains at once (two
 * FMA units of 4 cycles' latency: 8 chains keep both busy) */
ATTN_AVX2 static void dot8_avx2(const float *q, const float *k0, int64_t d, float *out) {
    __m256 acc[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
        __m256 qv = _mm256_loadu_ps(q + i);
        _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++)
            acc[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + r * d + i), acc[r]);
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) {
        __m128 u = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
        u = _mm_add_ps(u, _mm_movehl_ps(u, u));
        u = _mm_add_ss(u, _mm_movehdup_ps(u));
        out[r] = _mm_cvtss_f32(u);
    }
}

ATTN_AVX2 static void axpy_avx2(float e, const float *v, float *y, int64_t d) {
    __m256 ev = _mm256_set1_ps(e);
    for (int64_t i = 0; i < d; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(ev, _mm256_loadu_ps(v + i), _mm256_loadu_ps(y + i)));
}

/* exp_portable of 8 lanes: the same operations (max and min keep a NaN x: it is their second operand) */
ATTN_AVX2 static __m256 exp8_avx2(__m256 x) {
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-88.0f), x));
    __m256 n = _mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E));
    n = _mm256_round_ps(n, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(EXP_C5), r, _mm256_set1_ps(EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    e = _mm256_and_si256(_mm256_slli_epi32(e, 23), _mm256_cmpgt_epi32(e, _mm256_setzero_si256()));
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_blendv_ps(y, x, nan); /* a NaN lane: x itself (the clamps kept it) */
}

/* out[0..d) = sum over the visible slots t in order of e[t] * V_t, 64 columns at a time in 8 registers (each
 * column the FMAs of axpy_avx2, in slot order: the same floats); d % 8 == 0 */
ATTN_AVX2 static void pv_avx2(const float *e, const float *vb, const uint8_t *mask, int64_t last, int64_t d,
                              float *out) {
    int64_t c = 0;
    for (; c + 64 <= d; c += 64) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int64_t t = 0; t <= last; t++) {
            if (mask && !mask[t]) continue;
            const float *v = vb + t * d + c;
            __m256 ev = _mm256_set1_ps(e[t]);
            a0 = _mm256_fmadd_ps(ev, _mm256_loadu_ps(v), a0);
            a1 = _mm256_fmadd_ps(ev, _mm256_loadu_ps(v + 8), a1);
            a2 = _mm256_fmadd_ps(ev, _mm256_loadu_ps(v + 16), a2);
            a3 = _mm256_fmadd_ps(ev, _mm256_loadu_ps(v + 24), a3);
            a4 = _mm256_fmadd_ps(ev, _mm256_loadu_ps(v + 32), a4);
            a5 = _mm256_fmadd_ps(ev, _mm256_loadu_ps(v + 40), a5);
            a6 = _mm256_fmadd_ps(ev, _mm256_loadu_ps(v + 48), a6);
            a7 = _mm256_fmadd_ps(ev, _mm256_loadu_ps(v + 56), a7);
        }
        _mm256_storeu_ps(out + c, a0);
        _mm256_storeu_ps(out + c + 8, a1);
        _mm256_storeu_ps(out + c + 16, a2);
        _mm256_storeu_ps(out + c + 24, a3);
        _mm256_storeu_ps(out + c + 32, a4);
        _mm256_storeu_ps(out + c + 40, a5);
        _mm256_storeu_ps(out + c + 48, a6);
        _mm256_storeu_ps(out + c + 56, a7);
    }
    if (c < d) { /* the last d % 64 columns: through memory */
        memset(out + c, 0, sizeof(float) * (size_t)(d - c));
        for (int64_t t = 0; t <= last; t++)
            if (!mask || mask[t]) axpy_avx2(e[t], vb + t * d + c, out + c, d - c);
    }
}

/* e[t] = exp(sc[t] - m) for t in [0, last] (masked slots: anything; they are skipped), 8 at a time */
ATTN_AVX2 static void exps_avx2(float *sc, int64_t last, float m) {
    int64_t t = 0;
    __m256 mv = _mm256_set1_ps(m);
    for (; t + 8 <= last + 1; t += 8) _mm256_storeu_ps(sc + t, exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(sc + t), mv)));
    for (; t <= last; t++) sc[t] = exp_portable(sc[t] - m);
}
#else
static float dot_avx2(const float *a, const float *b, int64_t d) { return dot_portable(a, b, d); }
static void dot8_avx2(const float *q, const float *k0, int64_t d, float *out) {
    for (int r = 0; r < 8; r++) out[r] = dot_portable(q, k0 + r * d, d);
}
static void pv_avx2(const float *e, const float *vb, const uint8_t *mask, int64_t last, int64_t d, float *out) {
    pv_portable(e, vb, mask, last, d, out);
}
static void exps_avx2(float *sc, int64_t last, float m) { exps_portable(sc, last, m); }
#endif

/* The gated SiLU of a joined gate/up projection (ai.accel::MXLinear with glu = 1, mxkernel_ort.c): y [rows, 2 half]
 * holds each row's gate then up outputs; out[r, i] = (g / (1 + exp(-g))) * u, g = y[r, i], u = y[r, half + i], with
 * this file's exp (exp_portable; exp8_avx2 the same floats): float32 operations in that order (no product feeds a
 * sum, so nothing contracts into an FMA), and the portable loop and the AVX2 loop agree bit for bit. silu(g) * u
 * within a few ulp (the exp's 3 ulp; below g = -88 the exp's clamp leaves results under 1e-36 in magnitude), as
 * onnxruntime's QuickGelu is (its own logistic approximation: the two differ in the last bits). */
static void silu_mul_portable(const float *g, const float *u, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) {
        float den = 1.0f + exp_portable(-g[i]);
        float a = g[i] / den;
        out[i] = a * u[i];
    }
}

#if MXK_X86
ATTN_AVX2 static void silu_mul_avx2(const float *g, const float *u, int64_t n, float *out) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 den = _mm256_add_ps(one, exp8_avx2(_mm256_xor_ps(gv, sign)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
    }
    silu_mul_portable(g + i, u + i, n - i, out + i);
}
#endif

void mxk_silu_mul(const float *y, int64_t rows, int64_t half, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *g = y + r * 2 * half;
#if MXK_X86
        if (mxk_isa_cap() >= 1 && have_avx2()) {
            silu_mul_avx2(g, g + half, half, out + r * half);
            continue;
        }
#endif
        silu_mul_portable(g, g + half, half, out + r * half);
    }
}

/* whether the 8 slots from t are all visible (a chain call, mask NULL: the caller's t + 7 <= last says so) */
static inline int visible8(const uint8_t *mask, int64_t t) {
    if (!mask) return 1;
    uint64_t eight;
    memcpy(&eight, mask + t, 8);
    return eight == 0x0101010101010101ull; /* the tree mask holds 0 or 1 per slot */
}

/* the last slot a tree row sees (-1: none; its attention is then 0 / 0, NaN) */
static int64_t last_visible(const uint8_t *mask, int64_t ctx) {
    int64_t t = ctx;
    for (uint64_t word; t >= 8; t -= 8) { /* 8 slots at a time while they are all hidden */
        memcpy(&word, mask + t - 8, 8);
        if (word) break;
    }
    while (t > 0 && !mask[t - 1]) t--;
    return t - 1;
}

/* query rows [r0, r1) of the B * S * H rows (b, s, hq) */
static void attend_rows(const void *arg, int64_t r0, int64_t r1) {
    const attn_t *a = arg;
    const int64_t d = a->d, ctx = a->ctx, width = (a->h + 2 * a->hkv) * d, group = a->h / a->hkv;
    const float scale = (float)(1.0 / sqrt((double)d));
    float small[4096]; /* scores, the roped query, the output sums: on the stack when they fit */
    size_t need = (size_t)(ctx + 2 * d);
    float *sc = need <= sizeof small / sizeof *small ? small : malloc(sizeof(float) * need);
    if (sc == NULL) {
        for (int64_t i = r0 * d; i < r1 * d; i++) a->out[i] = NAN; /* rows (b, s, hq) are contiguous in out */
        return;
    }
    float *q = sc + ctx, *acc = q + d;
    int64_t seen = -1, seen_last = -1; /* the token (b, s) whose last visible slot was found, and that slot */
    for (int64_t r = r0; r < r1; r++) {
        int64_t bi = r / (a->s * a->h), si = (r / a->h) % a->s, hq = r % a->h, kvh = hq / group;
        int64_t p = a->pos[bi * a->s + si];
        float *y = a->out + (bi * a->s + si) * a->h * d + hq * d;
        if (p < 0) {
            memset(y, 0, sizeof(float) * (size_t)d);
            continue;
        }
        int64_t slot = a->slots[bi * a->s + si];
        if (p >= ctx || slot < 0 || slot >= ctx) {
            for (int64_t i = 0; i < d; i++) y[i] = NAN;
            continue;
        }
        const float *x = a->qkv + (bi * a->s + si) * width + hq * d;
        if (a->cos_t)
            rope_row(x, a->cos_t + p * (d / 2), a->sin_t + p * (d / 2), d, q);
        else
            memcpy(q, x, sizeof(float) * (size_t)d);
        const float *kb = a->kc + (bi * a->hkv + kvh) * ctx * d, *vb = a->vc + (bi * a->hkv + kvh) * ctx * d;
        const uint8_t *mask = a->tree_mask ? a->tree_mask + (bi * a->s + si) * ctx : NULL;
        if (mask && bi * a->s + si != seen) { /* a tree token's last visible slot, once for its query heads */
            seen = bi * a->s + si;
            seen_last = last_visible(mask, ctx);
        }
        int64_t last = mask ? seen_last : p; /* a tree row: no slot past its last visible one */
        float m = -INFINITY;
        int64_t t = 0;
        for (; t <= last; t++) {
            if (mask && !mask[t]) continue;
            if (a->simd && t + 7 <= last && visible8(mask, t)) { /* 8 dots at once: the same floats */
                dot8_avx2(q, kb + t * d, d, sc + t);
                for (int r = 0; r < 8; r++) {
                    sc[t + r] *= scale;
                    if (sc[t + r] > m) m = sc[t + r];
                }
                t += 7;
                continue;
            }
            sc[t] = (a->simd ? dot_avx2(q, kb + t * d, d) : dot_portable(q, kb + t * d, d)) * scale;
            if (sc[t] > m) m = sc[t]; /* a NaN score is no maximum; its e_t makes the row NaN below */
        }
        if (mask) /* masked slots hold no score: give them one (their exp is skipped below) */
            for (int64_t t = 0; t <= last; t++)
                if (!mask[t]) sc[t] = m;
        (a->simd ? exps_avx2 : exps_portable)(sc, last, m);
        float sum = 0.0f;
        for (int64_t t = 0; t <= last; t++)
            if (!mask || mask[t]) sum += sc[t];
        (a->simd ? pv_avx2 : pv_portable)(sc, vb, mask, last, d, acc);
        for (int64_t i = 0; i < d; i++) y[i] = acc[i] / sum; /* no visible slot: 0 / 0, NaN */
    }
    if (sc != small) free(sc);
}

int mxk_cache_attention(const float *qkv, float *kc, float *vc, const int64_t *pos, const int64_t *slots,
                        const float *cos_t, const float *sin_t, const uint8_t *tree_mask, int64_t b, int64_t s,
                        int64_t h, int64_t hkv, int64_t d, int64_t ctx, float *out, int threads) {
    if (b < 1 || s < 1 || hkv < 1 || h < hkv || h % hkv || d < 2 || d % 2 || ctx < 1) return -1;
    const int64_t width = (h + 2 * hkv) * d;
    for (int64_t bi = 0; bi < b; bi++) /* the cache writes first: every row of the call sees them */
        for (int64_t si = 0; si < s; si++) {
            int64_t p = pos[bi * s + si], slot = slots[bi * s + si];
            if (p < 0 || p >= ctx || slot < 0 || slot >= ctx) continue;
            const float *x = qkv + (bi * s + si) * width;
            for (int64_t kh = 0; kh < hkv; kh++) {
                float *krow = kc + ((bi * hkv + kh) * ctx + slot) * d, *vrow = vc + ((bi * hkv + kh) * ctx + slot) * d;
                if (cos_t)
                    rope_row(x + (h + kh) * d, cos_t + p * (d / 2), sin_t + p * (d / 2), d, krow);
                else
                    memcpy(krow, x + (h + kh) * d, sizeof(float) * (size_t)d);
                memcpy(vrow, x + (h + hkv + kh) * d, sizeof(float) * (size_t)d);
            }
        }
    int64_t rows = b * s * h;
    if (threads < 1) threads = 1;
    if (threads > MXK_MAX_THREADS) threads = MXK_MAX_THREADS;
    if (threads > rows) threads = (int)rows;
    attn_t a = {qkv, cos_t, sin_t, kc, vc, out, pos, slots, tree_mask, b, s, h, hkv, d, ctx,
                MXK_X86 && d % 8 == 0 && mxk_isa_cap() >= 1 && have_avx2()};
    return mxk_parallel(attend_rows, &a, rows, threads);
}
