/* The fused kernel as an onnxruntime custom operator: ai.accel::MXLinear, y[..., N] = x[..., K] @ W^T straight from
 * the packed MX codes and E8M0 scales (the same mxk_linear call as PackedMX.matmul, so the same float32 results).
 *
 * Node: inputs x (float32 [..., K]), codes (uint8: the packed codes of W [N, K], C order), scales (uint8 [N, K / 32]:
 * E8M0 codes), lut (float32 [256]: the value of each code, for the portable path); attributes N, K, bits, block (32),
 * fast (1 E2M3, 2 E2M1, 3 INT8: the SIMD paths' formats, 0 none). K must be a multiple of block (the exporter
 * checks). GGUF blocks (fast 4 Q8_0 and 8 I8_F32 with bits 8, 5 Q4_0, 6 Q4_1 and 7 Q4_F32 with bits 4, 9 Q5S_F32 and
 * 10 Q5_F32 with bits 5; block 32): codes the uint8 code plane (N * K * bits / 8 bytes), scales the uint8 plane of
 * the blocks' scales (N * K / 32 * block_scale_bytes: float16 d, Q4_1 d then m; float32 d then m for Q4_F32 and the
 * 5-bit types, d0 m0 d1 m1 for I8_F32), lut
 * still a float32 [256] input that is not read. Attribute act_bits 8 (optional; default 32, float32 activations):
 * int8 activations per block (mxk_linear_q8) for E2M3, E2M1 and every GGUF type (fast 4..10). Attribute glu 1
 * (optional; default 0): W's rows are a gate projection then an up projection (N even) and the output is
 * [..., N / 2], silu(gate) * up (mxk_silu_mul, mxkernel_attn.c), the MLP's Split, activation and product in the node.
 * Attribute interleave 16 (optional; default 0, the stored layout; only with act_bits 8 and a GGUF layout): the
 * planes hold the blocks interleaved 16 rows at a time (mxkernel_gx16.c, ceil(N / 16) groups: the sizes of N rounded
 * up to a multiple of 16) and mxk_linear_x16 runs them.
 * The domain's second operator, CacheAttention, is described where it is defined below. Registered by onnxruntime's
 * RegisterCustomOpsLibrary (Python: SessionOptions.register_custom_ops_library) on this library, which accel already
 * builds and loads for PackedMX (mxkernel_build.py).
 *
 * onnxruntime's pip wheels ship no C headers, so the few parts of its C ABI used here are declared below: the API
 * table (OrtApi) is an array of function pointers that only ever grows at the end, and OrtCustomOp a struct whose
 * fields past those of the declared version onnxruntime does not read. Positions are those of API version 13
 * (onnxruntime 1.13), which every later onnxruntime serves from OrtApiBase::GetApi(13); KernelContext_ParallelFor (API
 * version 17, onnxruntime 1.17) where the running onnxruntime serves it.
 *
 * Threads: where onnxruntime offers KernelContext_ParallelFor and the session's idle threads spin (its options'
 * session.intra_op.allow_spinning, read when the session registers the library: each choice has its own ai.accel
 * domain), both operators split their rows over the session's own intra-op pool (mxk_use_pfor), so no second pool
 * competes with onnxruntime's spinning threads for the cores. Otherwise (sessions
 * whose threads sleep between operators, onnxruntime before 1.17) they use the library's pool, whose workers stay
 * hot between the many kernel calls of a step where a sleeping onnxruntime thread would be woken for each.
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mxkernel.h"

#define ORT_API_VERSION_USED 13
#define MXL_MAX_DIMS 8

typedef struct OrtStatus OrtStatus;
typedef void *ort_fn; /* an entry of the API table */
typedef struct {
    const ort_fn *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} ort_api_base;

enum { ORT_FLOAT = 1, ORT_UINT8 = 2, ORT_INT64 = 7, ORT_BOOL = 9 }; /* ONNXTensorElementDataType */
enum { ORT_FAIL = 1 }; /* OrtErrorCode */

/* positions in the OrtApi table */
enum {
    API_CREATE_STATUS = 0,
    API_CREATE_CUSTOM_OP_DOMAIN = 26,
    API_CUSTOM_OP_DOMAIN_ADD = 27,
    API_ADD_CUSTOM_OP_DOMAIN = 28,
    API_GET_TENSOR_MUTABLE_DATA = 51,
    API_GET_TENSOR_ELEMENT_TYPE = 60,
    API_GET_DIMENSIONS_COUNT = 61,
    API_GET_DIMENSIONS = 62,
    API_GET_TENSOR_TYPE_AND_SHAPE = 65,
    API_KERNEL_INFO_GET_ATTRIBUTE_INT64 = 86,
    API_KERNEL_CONTEXT_GET_INPUT = 90,
    API_KERNEL_CONTEXT_GET_OUTPUT = 91,
    API_RELEASE_STATUS = 93,
    API_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO = 99,
    API_HAS_SESSION_CONFIG_ENTRY = 237, /* version 14 */
    API_GET_SESSION_CONFIG_ENTRY = 238, /* version 14 */
    API_KERNEL_CONTEXT_PARALLEL_FOR = 274, /* version 17 */
};
#define ORT_API_VERSION_PFOR 17

typedef struct custom_op {
    uint32_t version;
    void *(*CreateKernel)(const struct custom_op *op, const ort_fn *api, const void *info);
    const char *(*GetName)(const struct custom_op *op);
    const char *(*GetExecutionProviderType)(const struct custom_op *op);
    int (*GetInputType)(const struct custom_op *op, size_t index);
    size_t (*GetInputTypeCount)(const struct custom_op *op);
    int (*GetOutputType)(const struct custom_op *op, size_t index);
    size_t (*GetOutputTypeCount)(const struct custom_op *op);
    void (*KernelCompute)(void *kernel, void *context);
    void (*KernelDestroy)(void *kernel);
    int (*GetInputCharacteristic)(const struct custom_op *op, size_t index); /* 0: required */
    int (*GetOutputCharacteristic)(const struct custom_op *op, size_t index);
    int (*GetInputMemoryType)(const struct custom_op *op, size_t index); /* 0: the default (CPU) */
    void *later_fields[32]; /* fields of later API versions: zero, and never read at version 13 */
} custom_op;

/* an operator as registered: onnxruntime hands `op` back to CreateKernel, so its kernels learn which pool to use */
typedef struct {
    custom_op op;
    int ort_pool; /* 1: the session's intra-op pool (its idle threads spin); 0: the library's pool */
} accel_op;

typedef struct {
    const ort_fn *api;
    int64_t n, k, bits, block, fast;
    int64_t act_bits; /* optional attribute: 8 = int8 activations per block (mxk_linear_q8), else float32 */
    int64_t glu;      /* optional attribute: 1 = output silu(first N / 2 outputs) * last N / 2 */
    int64_t interleave; /* optional attribute: 16 = the interleaved layout of mxkernel_gx16.c, else 0 */
    int sizes_ok; /* the codes and scales inputs were checked against N, K, bits and block (they are initializers) */
    int ort_pool; /* accel_op.ort_pool of the operator it was created from */
} mxl_kernel;

/* kernel threads of one MXLinear call (mxk_set_ort_threads; a weight under 2^16 elements a thread uses fewer) */
static int ort_threads = 1;

void mxk_set_ort_threads(int threads) { ort_threads = threads < 1 ? 1 : threads > MXK_MAX_THREADS ? MXK_MAX_THREADS : threads; }

#define CALL(api, pos, type) ((type)(api)[pos])
typedef OrtStatus *(*status_fn_i64)(const void *, const char *, int64_t *);

/* 1 if an API call failed (its status released) */
static int failed(const ort_fn *api, OrtStatus *st) {
    if (st == NULL) return 0;
    CALL(api, API_RELEASE_STATUS, void (*)(OrtStatus *))(st);
    return 1;
}

/* the API table of version 17 (KernelContext_ParallelFor); NULL where onnxruntime is older (RegisterCustomOps) */
static const ort_fn *api_pfor = NULL;

/* mxk_pfor_t on the kernel context's intra-op pool: fn(usr, i) for i in [0, total) */
static int ort_pfor(void *context, void (*fn)(void *, size_t), size_t total, void *usr) {
    typedef OrtStatus *(*pfor_fn)(const void *, void (*)(void *, size_t), size_t, size_t, void *);
    return failed(api_pfor, CALL(api_pfor, API_KERNEL_CONTEXT_PARALLEL_FOR, pfor_fn)(context, fn, total, 0, usr));
}

/* the kernel calls this thread makes from now until pool_off run on the context's pool (ort_pool: the kernel's
 * operator was registered for a session whose idle threads spin, which needs API 17) */
static void pool_on(void *context, int ort_pool) {
    if (ort_pool && api_pfor != NULL) mxk_use_pfor(ort_pfor, context);
}
static void pool_off(void) { mxk_use_pfor(NULL, NULL); }

static void *mxl_create(const custom_op *op, const ort_fn *api, const void *info) {
    mxl_kernel *m = calloc(1, sizeof *m);
    if (m == NULL) return NULL;
    m->api = api;
    m->ort_pool = ((const accel_op *)op)->ort_pool;
    status_fn_i64 get = CALL(api, API_KERNEL_INFO_GET_ATTRIBUTE_INT64, status_fn_i64);
    if (failed(api, get(info, "N", &m->n)) || failed(api, get(info, "K", &m->k)) ||
        failed(api, get(info, "bits", &m->bits)) || failed(api, get(info, "block", &m->block)) ||
        failed(api, get(info, "fast", &m->fast)) || m->n < 0 || m->k < 0 || m->block < 1 || m->k % m->block != 0 ||
        m->fast < FAST_NONE || m->fast > FAST_MAX ||
        (is_gguf((int)m->fast) && (m->bits != gguf_bits((int)m->fast) || m->block != 32))) {
        m->n = -1; /* compute then writes NaN: a graph accel did not write */
    }
    if (failed(api, get(info, "act_bits", &m->act_bits))) m->act_bits = 32; /* absent: float32 activations */
    if (m->act_bits != 32 &&
        !(m->act_bits == 8 && m->block == 32 && (m->fast == FAST_E2M3 || m->fast == FAST_E2M1 || is_gguf((int)m->fast))))
        m->n = -1;
    if (failed(api, get(info, "glu", &m->glu))) m->glu = 0; /* absent: the product itself */
    if (m->glu != 0 && (m->glu != 1 || m->n % 2 != 0)) m->n = -1;
    if (failed(api, get(info, "interleave", &m->interleave))) m->interleave = 0; /* absent: the stored layout */
    if (m->interleave != 0 && !(m->interleave == 16 && m->act_bits == 8 && is_gguf((int)m->fast))) m->n = -1;
    return m;
}

/* the shape of an input; -1 on failure */
static int dims_of(const ort_fn *api, const void *value, int64_t *dims, int *elem) {
    void *info = NULL;
    size_t nd = 0;
    if (failed(api, CALL(api, API_GET_TENSOR_TYPE_AND_SHAPE, OrtStatus * (*)(const void *, void **))(value, &info)))
        return -1;
    int ok = !failed(api, CALL(api, API_GET_DIMENSIONS_COUNT, OrtStatus * (*)(const void *, size_t *))(info, &nd)) &&
             nd <= MXL_MAX_DIMS &&
             !failed(api, CALL(api, API_GET_DIMENSIONS, OrtStatus * (*)(const void *, int64_t *, size_t))(info, dims,
                                                                                                         nd)) &&
             !failed(api, CALL(api, API_GET_TENSOR_ELEMENT_TYPE, OrtStatus * (*)(const void *, int *))(info, elem));
    CALL(api, API_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO, void (*)(void *))(info);
    return ok ? (int)nd : -1;
}

static void *data_of(const ort_fn *api, const void *value) {
    void *p = NULL;
    if (failed(api, CALL(api, API_GET_TENSOR_MUTABLE_DATA, OrtStatus * (*)(void *, void **))((void *)value, &p)))
        return NULL;
    return p;
}

static void mxl_compute(void *kernel, void *context) {
    mxl_kernel *m = kernel;
    const ort_fn *api = m->api;
    typedef OrtStatus *(*get_input_fn)(const void *, size_t, const void **);
    typedef OrtStatus *(*get_output_fn)(void *, size_t, const int64_t *, size_t, void **);
    const void *in[4] = {NULL, NULL, NULL, NULL};
    for (size_t i = 0; i < 4; i++)
        if (failed(api, CALL(api, API_KERNEL_CONTEXT_GET_INPUT, get_input_fn)(context, i, &in[i]))) return;
    int64_t dims[MXL_MAX_DIMS];
    int elem = 0;
    int nd = dims_of(api, in[0], dims, &elem);
    if (nd < 1) return;
    int ok = m->n >= 0 && elem == ORT_FLOAT && dims[nd - 1] == m->k;
    int64_t rows = 1;
    for (int d = 0; d < nd - 1; d++) rows *= dims[d];
    const int64_t n_out = m->n > 0 ? (m->glu ? m->n / 2 : m->n) : 0;
    dims[nd - 1] = n_out;
    void *out = NULL;
    if (failed(api, CALL(api, API_KERNEL_CONTEXT_GET_OUTPUT, get_output_fn)(context, 0, dims, (size_t)nd, &out)))
        return;
    float *const dst = data_of(api, out), *y = dst;
    const float *x = data_of(api, in[0]);
    const uint8_t *codes = data_of(api, in[1]), *scales = data_of(api, in[2]);
    const float *lut = data_of(api, in[3]);
    if (dst == NULL) return;
    if (ok && m->glu) { /* the full product first, then its gated half into the output */
        y = malloc(sizeof(float) * (size_t)(rows * m->n > 0 ? rows * m->n : 1));
        ok = y != NULL;
        if (y == NULL) y = dst;
    }
    if (ok && !m->sizes_ok) { /* once per node: codes [N * K * bits / 8] bytes, scales [N * K / block] (GGUF: times
                                * block_scale_bytes), lut [256] */
        int64_t cd[MXL_MAX_DIMS], sd[MXL_MAX_DIMS], ld[MXL_MAX_DIMS], count[3] = {1, 1, 1};
        int ce = 0, se = 0, le = 0, cn = dims_of(api, in[1], cd, &ce), sn = dims_of(api, in[2], sd, &se);
        int ln = dims_of(api, in[3], ld, &le);
        for (int d = 0; d < cn; d++) count[0] *= cd[d];
        for (int d = 0; d < sn; d++) count[1] *= sd[d];
        for (int d = 0; d < ln; d++) count[2] *= ld[d];
        const int64_t rows_w = m->interleave ? (m->n + 15) / 16 * 16 : m->n; /* interleaved: whole groups */
        ok = cn >= 0 && sn >= 0 && ln >= 0 && ce == ORT_UINT8 && se == ORT_UINT8 && le == ORT_FLOAT &&
             count[0] == rows_w * m->k * m->bits / 8 &&
             count[1] == rows_w * (m->k / m->block) * block_scale_bytes((int)m->fast) && count[2] == 256;
        m->sizes_ok = ok;
    }
    if (!ok || x == NULL || codes == NULL || scales == NULL || lut == NULL) { /* not accel's graph: loud NaNs */
        for (int64_t i = 0; i < rows * n_out; i++) dst[i] = NAN;
        if (y != dst) free(y);
        return;
    }
    int64_t per_thread = (int64_t)1 << 16, weights = m->n * m->k;
    int threads = weights / per_thread < ort_threads ? (int)(weights / per_thread) : ort_threads;
    pool_on(context, m->ort_pool);
    if (m->interleave) {
        if (mxk_linear_x16(codes, scales, (int)m->fast, m->n, m->k / 32, x, rows, m->k, y, threads < 1 ? 1 : threads))
            for (int64_t i = 0; i < rows * m->n; i++) y[i] = NAN; /* out of memory: loud NaNs */
    } else if (m->act_bits == 8) {
        if (mxk_linear_q8(codes, scales, (int)m->fast, m->n, m->k / 32, x, rows, m->k, y, threads < 1 ? 1 : threads))
            for (int64_t i = 0; i < rows * m->n; i++) y[i] = NAN; /* out of memory: loud NaNs */
    } else {
        mxk_linear(codes, scales, lut, (int)m->bits, (int)m->block, (int)m->fast, m->n, m->k, m->k / m->block, x,
                   rows, m->k, y, threads < 1 ? 1 : threads);
    }
    pool_off();
    if (y != dst) {
        mxk_silu_mul(y, rows, m->n / 2, dst);
        free(y);
    }
}

static void mxl_destroy(void *kernel) { free(kernel); }
static const char *mxl_name(const custom_op *op) { (void)op; return "MXLinear"; }
static const char *mxl_provider(const custom_op *op) { (void)op; return NULL; }
static int mxl_input_type(const custom_op *op, size_t i) { (void)op; return i == 0 || i == 3 ? ORT_FLOAT : ORT_UINT8; }
static size_t mxl_inputs(const custom_op *op) { (void)op; return 4; }
static int mxl_output_type(const custom_op *op, size_t i) { (void)op; (void)i; return ORT_FLOAT; }
static size_t mxl_outputs(const custom_op *op) { (void)op; return 1; }
static int mxl_zero(const custom_op *op, size_t i) { (void)op; (void)i; return 0; }

#define MXLINEAR(POOL)                                                                                               \
    {{ORT_API_VERSION_USED, mxl_create, mxl_name, mxl_provider, mxl_input_type, mxl_inputs, mxl_output_type,         \
      mxl_outputs, mxl_compute, mxl_destroy, mxl_zero, mxl_zero, mxl_zero, {0}},                                     \
     POOL}

/* ------------------------------------------------------------------------------------------------- CacheAttention
 * ai.accel::CacheAttention (mxkernel_attn.c): inputs qkv float32 [B, S, (H + 2 Hkv) * D], past_key and past_value
 * float32 [B, Hkv, ctx, D], position_ids and slots int64 [B, S], cos and sin float32 [ctx, D / 2] (or [0]: no RoPE),
 * tree_mask bool [B, S, ctx] (or [0]: a chain call); attributes num_heads H, num_kv_heads Hkv; outputs the attention
 * [B, S, H * D] and the updated caches (the same shapes as the past ones). OrtBackend binds each cache output to its
 * input's buffer: the operator then writes the new rows in place; otherwise it copies the cache first. Inputs of
 * other shapes or types give NaN attention (and the caches unchanged), as MXLinear does. */
typedef struct {
    const ort_fn *api;
    int64_t h, hkv;
    int ort_pool; /* as mxl_kernel's */
} attn_kernel;

static void *attn_create(const custom_op *op, const ort_fn *api, const void *info) {
    attn_kernel *m = calloc(1, sizeof *m);
    if (m == NULL) return NULL;
    m->api = api;
    m->ort_pool = ((const accel_op *)op)->ort_pool;
    status_fn_i64 get = CALL(api, API_KERNEL_INFO_GET_ATTRIBUTE_INT64, status_fn_i64);
    if (failed(api, get(info, "num_heads", &m->h)) || failed(api, get(info, "num_kv_heads", &m->hkv)) || m->hkv < 1 ||
        m->h < m->hkv || m->h % m->hkv)
        m->h = -1;
    return m;
}

/* the input's element count when it has `nd` dims equal to want[0..nd) (want -1: any), else -1 */
static int64_t shaped(const ort_fn *api, const void *value, int nd, const int64_t *want, int elem, int64_t *dims) {
    int e = 0, n = dims_of(api, value, dims, &e);
    if (n != nd || e != elem) return -1;
    int64_t count = 1;
    for (int i = 0; i < n; i++) {
        if (dims[i] < 0 || (want[i] >= 0 && dims[i] != want[i])) return -1;
        count *= dims[i];
    }
    return count;
}

static void attn_compute(void *kernel, void *context) {
    attn_kernel *m = kernel;
    const ort_fn *api = m->api;
    typedef OrtStatus *(*get_input_fn)(const void *, size_t, const void **);
    typedef OrtStatus *(*get_output_fn)(void *, size_t, const int64_t *, size_t, void **);
    const void *in[8];
    for (size_t i = 0; i < 8; i++)
        if (failed(api, CALL(api, API_KERNEL_CONTEXT_GET_INPUT, get_input_fn)(context, i, &in[i]))) return;
    int64_t qd[MXL_MAX_DIMS] = {0}, kd[MXL_MAX_DIMS] = {0}, any[4] = {-1, -1, -1, -1}, tmp[MXL_MAX_DIMS];
    int e = 0;
    /* the caches first: past_key 4-D float32, past_value the same shape (then kept or copied whatever else) */
    int cache_ok = m->h > 0 && shaped(api, in[1], 4, any, ORT_FLOAT, kd) > 0 && shaped(api, in[2], 4, kd, ORT_FLOAT,
                                                                                      tmp) > 0;
    int ok = cache_ok && dims_of(api, in[0], qd, &e) == 3 && e == ORT_FLOAT;
    int64_t b = kd[0], hkv = kd[1], ctx = kd[2], d = kd[3], s = qd[1];
    int64_t bs[2] = {b, s}, rope_shape[2] = {ctx, d / 2}, tree[3] = {b, s, ctx};
    ok = ok && hkv == m->hkv && qd[0] == b && qd[2] == (m->h + 2 * hkv) * d && d >= 2 && d % 2 == 0;
    ok = ok && shaped(api, in[3], 2, bs, ORT_INT64, tmp) >= 0 && shaped(api, in[4], 2, bs, ORT_INT64, tmp) >= 0;
    int64_t zero[1] = {0};
    int rope = ok && shaped(api, in[5], 2, rope_shape, ORT_FLOAT, tmp) > 0 && shaped(api, in[6], 2, rope_shape,
                                                                                      ORT_FLOAT, tmp) > 0;
    ok = ok && (rope || (shaped(api, in[5], 1, zero, ORT_FLOAT, tmp) == 0 && shaped(api, in[6], 1, zero, ORT_FLOAT,
                                                                                  tmp) == 0));
    int has_tree = ok && shaped(api, in[7], 3, tree, ORT_BOOL, tmp) >= 0;
    ok = ok && (has_tree || shaped(api, in[7], 1, zero, ORT_BOOL, tmp) == 0);
    /* the attention's shape: [B, S, H * D] (D from past_key when only other inputs are wrong), else qkv's own */
    if (!cache_ok && dims_of(api, in[0], qd, &e) != 3) qd[0] = qd[1] = qd[2] = 0;
    int64_t od[3] = {qd[0] > 0 ? qd[0] : 0, qd[1] > 0 ? qd[1] : 0, cache_ok ? m->h * kd[3] : (qd[2] > 0 ? qd[2] : 0)};
    void *outs[3] = {NULL, NULL, NULL};
    if (failed(api, CALL(api, API_KERNEL_CONTEXT_GET_OUTPUT, get_output_fn)(context, 0, od, 3, &outs[0]))) return;
    float *y = data_of(api, outs[0]);
    if (cache_ok) /* the caches: kept (bound in place) or copied, also when the other inputs are wrong */
        for (size_t i = 1; i < 3; i++)
            if (failed(api, CALL(api, API_KERNEL_CONTEXT_GET_OUTPUT, get_output_fn)(context, i, kd, 4, &outs[i])))
                return;
    float *kc = cache_ok ? data_of(api, outs[1]) : NULL, *vc = cache_ok ? data_of(api, outs[2]) : NULL;
    const float *pk = cache_ok ? data_of(api, in[1]) : NULL, *pv = cache_ok ? data_of(api, in[2]) : NULL;
    if (cache_ok && kc != NULL && vc != NULL && pk != NULL && pv != NULL) {
        size_t bytes = sizeof(float) * (size_t)(kd[0] * kd[1] * kd[2] * kd[3]);
        if (kc != pk) memcpy(kc, pk, bytes); /* not bound in place: the cache is copied first */
        if (vc != pv) memcpy(vc, pv, bytes);
    }
    if (!ok || y == NULL || kc == NULL || vc == NULL) {
        for (int64_t i = 0; y != NULL && i < od[0] * od[1] * od[2]; i++) y[i] = NAN;
        return;
    }
    const float *cos_t = rope ? data_of(api, in[5]) : NULL, *sin_t = rope ? data_of(api, in[6]) : NULL;
    const uint8_t *mask = has_tree && s > 0 ? data_of(api, in[7]) : NULL; /* ONNX bool: one byte, 0 or 1 */
    pool_on(context, m->ort_pool);
    if (s > 0 && mxk_cache_attention(data_of(api, in[0]), kc, vc, data_of(api, in[3]), data_of(api, in[4]), cos_t,
                                     sin_t, mask, b, s, m->h, hkv, d, ctx, y, ort_threads))
        for (int64_t i = 0; i < b * s * m->h * d; i++) y[i] = NAN; /* out of memory: loud NaNs */
    pool_off();
}

static const char *attn_name(const custom_op *op) { (void)op; return "CacheAttention"; }
static int attn_input_type(const custom_op *op, size_t i) {
    (void)op;
    return i == 3 || i == 4 ? ORT_INT64 : i == 7 ? ORT_BOOL : ORT_FLOAT;
}
static size_t attn_inputs(const custom_op *op) { (void)op; return 8; }
static size_t attn_outputs(const custom_op *op) { (void)op; return 3; }

#define CACHE_ATTENTION(POOL)                                                                                        \
    {{ORT_API_VERSION_USED, attn_create, attn_name, mxl_provider, attn_input_type, attn_inputs, mxl_output_type,     \
      attn_outputs, attn_compute, mxl_destroy, mxl_zero, mxl_zero, mxl_zero, {0}},                                   \
     POOL}

/* the operators of each pool choice ([0] the library's pool, [1] the session's), in one ai.accel domain each */
static const accel_op OPS[2][2] = {{MXLINEAR(0), CACHE_ATTENTION(0)}, {MXLINEAR(1), CACHE_ATTENTION(1)}};
static pthread_mutex_t domain_mu = PTHREAD_MUTEX_INITIALIZER;
static void *domains[2] = {NULL, NULL}; /* created on first need, shared by every session, never released */

/* whether the session options let idle intra-op threads spin (onnxruntime's default where the entry is unset) */
static int options_spin(const void *options) {
    const char *key = "session.intra_op.allow_spinning";
    int has = 0;
    char value[8] = {0};
    size_t size = sizeof value;
    typedef OrtStatus *(*has_fn)(const void *, const char *, int *);
    typedef OrtStatus *(*get_fn)(const void *, const char *, char *, size_t *);
    if (failed(api_pfor, CALL(api_pfor, API_HAS_SESSION_CONFIG_ENTRY, has_fn)(options, key, &has)) || !has) return 1;
    if (failed(api_pfor, CALL(api_pfor, API_GET_SESSION_CONFIG_ENTRY, get_fn)(options, key, value, &size))) return 1;
    return strcmp(value, "0") != 0;
}

/* onnxruntime's entry point: add an ai.accel domain (MXLinear, CacheAttention) to the session options; its operators
 * run on the session's intra-op pool where the session's idle threads spin and onnxruntime serves API 17 */
OrtStatus *RegisterCustomOps(void *options, const ort_api_base *base) {
    const ort_fn *api = base->GetApi(ORT_API_VERSION_USED);
    if (api == NULL) return NULL; /* cannot report without an API; onnxruntime < 1.13 is not supported */
    typedef OrtStatus *(*create_status_fn)(int, const char *);
    OrtStatus *st = NULL;
    pthread_mutex_lock(&domain_mu);
    api_pfor = base->GetApi(ORT_API_VERSION_PFOR); /* NULL before onnxruntime 1.17 */
    int pool = api_pfor != NULL && options_spin(options);
    if (domains[pool] == NULL) {
        void *d = NULL;
        st = CALL(api, API_CREATE_CUSTOM_OP_DOMAIN, OrtStatus * (*)(const char *, void **))("ai.accel", &d);
        typedef OrtStatus *(*add_op_fn)(void *, const custom_op *);
        for (int i = 0; i < 2 && st == NULL; i++)
            st = CALL(api, API_CUSTOM_OP_DOMAIN_ADD, add_op_fn)(d, &OPS[pool][i].op);
        if (st == NULL) domains[pool] = d;
    }
    void *domain = domains[pool];
    pthread_mutex_unlock(&domain_mu);
    if (st != NULL) return st;
    if (domain == NULL) return CALL(api, API_CREATE_STATUS, create_status_fn)(ORT_FAIL, "accel: no ai.accel domain");
    return CALL(api, API_ADD_CUSTOM_OP_DOMAIN, OrtStatus * (*)(void *, void *))(options, domain);
}
