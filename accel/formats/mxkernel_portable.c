/* The portable path (any format, any block size): value = lut[code] * 2^(s - 127) in float32. See mxkernel.h. */
#include "mxkernel.h"

void decode_rows_portable(const job_t *j, int64_t r0, int64_t r1, float *out) {
    int64_t width = j->nblocks * j->block;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t b = 0; b < j->nblocks; b++) {
            float sc = scale_value(j->scales[r * j->nblocks + b], 0);
            int64_t base = r * width + b * j->block;
            for (int e = 0; e < j->block; e++) out[base + e] = j->lut[code_at(j->codes, base + e, j->bits)] * sc;
        }
    }
}

void linear_portable(const job_t *j, int64_t n0, int64_t n1) {
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
