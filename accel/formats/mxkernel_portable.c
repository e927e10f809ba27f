/* The portable path (any format, any block size): value = lut[code] * 2^(s - 127) in float32; GGUF blocks (fast 4,
 * 5, 6): d * q, d * (q - 8), d * q + m from the blocks' halves; repacked blocks (fast 7..10): d * q + m from their
 * float32 scales. See mxkernel.h. */
#include <string.h>

#include "mxkernel.h"

/* the scale value i of a GGUF block's scale bytes s: float16 (fast 4, 5, 6) or float32 (fast 7..10) */
static float scale_at(int fast, const uint8_t *s, int i) {
    if (!f32_scales(fast)) return half_at(s + 2 * i);
    float v;
    memcpy(&v, s + 4 * i, sizeof v);
    return v;
}

void gguf_block_portable(const job_t *j, int64_t n, int64_t b, float w[32]) {
    const int fast = j->fast, cb = block_code_bytes(fast), sb = block_scale_bytes(fast);
    const uint8_t *c = j->codes + (n * j->nblocks + b) * cb, *s = j->scales + (n * j->nblocks + b) * sb;
    const float d = scale_at(fast, s, 0);
    if (!nibble_codes(fast)) { /* int8 codes: Q8_0 d * q; I8_F32 d * q + m per 16 weights */
        for (int e = 0; e < 32; e++) w[e] = d * (float)(int8_t)c[e];
        if (fast == FAST_I8_F32) {
            const float m0 = scale_at(fast, s, 1), d1 = scale_at(fast, s, 2), m1 = scale_at(fast, s, 3);
            for (int e = 0; e < 16; e++) w[e] += m0; /* d * q is exact: the add is the one rounding */
            for (int e = 16; e < 32; e++) w[e] = d1 * (float)(int8_t)c[e] + m1;
        }
        return;
    }
    const int off = code_offset(fast);
    uint32_t fifth = 0; /* 5-bit types: bit i is code i's fifth bit */
    if (q5_codes(fast)) memcpy(&fifth, c + 16, 4);
    for (int e = 0; e < 16; e++) {
        int lo = (int)(c[e] & 15u) | (int)((fifth >> e) & 1u) << 4;
        int hi = (int)(c[e] >> 4) | (int)((fifth >> (e + 16)) & 1u) << 4;
        w[e] = d * (float)(lo - off);
        w[e + 16] = d * (float)(hi - off);
    }
    if (has_offset(fast)) {
        const float m = scale_at(fast, s, 1);
        for (int e = 0; e < 32; e++) w[e] += m; /* d * q is exact: the add is the one rounding */
    }
}

void decode_rows_portable(const job_t *j, int64_t r0, int64_t r1, float *out) {
    int64_t width = j->nblocks * j->block;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t b = 0; b < j->nblocks; b++) {
            int64_t base = r * width + b * j->block;
            if (is_gguf(j->fast)) {
                gguf_block_portable(j, r, b, out + base);
                continue;
            }
            float sc = scale_value(j->scales[r * j->nblocks + b], 0);
            for (int e = 0; e < j->block; e++) out[base + e] = j->lut[code_at(j->codes, base + e, j->bits)] * sc;
        }
    }
}

static void linear_portable_gguf(const job_t *j, int64_t n0, int64_t n1) {
    float w[32];
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t s = 0; s < j->s; s++) {
            const float *x = j->x + s * j->xstride;
            float acc = 0.0f;
            for (int64_t b = 0; b < j->nblocks; b++) {
                gguf_block_portable(j, n, b, w);
                for (int e = 0; e < 32; e++) acc += w[e] * x[b * 32 + e];
            }
            j->y[s * j->n + n] = acc;
        }
    }
}

void linear_portable(const job_t *j, int64_t n0, int64_t n1) {
    if (is_gguf(j->fast)) {
        linear_portable_gguf(j, n0, n1);
        return;
    }
    int64_t width = j->nblocks * j->block;
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t s = 0; s < j->s; s++) {
            const float *x = j->x + s * j->xstride;
            float acc = 0.0f;
            for (int64_t b = 0; b < j->nblocks; b++) {
                float sc = scale_value(j->scales[n * j->nblocks + b], 0);
                int64_t base = n * width + b * j->block;
                int64_t stop = j->k - b * j->block < j->block ? j->k - b * j->block : j->block;
                for (int64_t e = 0; e < stop; e++)
                    acc += (j->lut[code_at(j->codes, base + e, j->bits)] * sc) * x[b * j->block + e];
            }
            j->y[s * j->n + n] = acc;
        }
    }
}
