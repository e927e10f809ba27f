/* The fused MX kernel's API (mxk_*), the choice of path per call and the thread pool. See mxkernel.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mxkernel.h"

int mxk_version(void) { return MXK_VERSION; }

float SCALES[4][256];

__attribute__((constructor)) static void init_scales(void) {
    static const int shift[4] = {0, 3, 1, 6};
    for (int f = 0; f < 4; f++)
        for (int s = 0; s < 256; s++) SCALES[f][s] = scale_value((uint8_t)s, shift[f]);
}

static int max_isa = 3; /* mxk_set_isa: the highest path allowed (tests and benchmarks compare the paths) */

/* 0: portable loop; 1: AVX2 + FMA (+ F16C); 2: AVX-512 (MX formats: VBMI byte permutes; GGUF blocks: AVX-512F) */
static int use_fast(const job_t *j) {
    if (j->fast <= FAST_NONE || j->fast > FAST_MAX || j->block != 32 || max_isa < 1 || !have_avx2()) return 0;
    if (is_gguf(j->fast)) return max_isa >= 2 && have_avx512f() ? 2 : 1;
    return max_isa >= 2 && have_vbmi() ? 2 : 1;
}

/* the highest path to use from now on: 3 (default: the best the CPU has), 2 (AVX-512, but the int8-activation path
 * without VBMI's unpacking), 1 (AVX2 at most), 0 (portable only) */
void mxk_set_isa(int level) { max_isa = level; }

int mxk_isa_cap(void) { return max_isa; }

static int allow_avxvnni = 1; /* mxk_set_avxvnni */

/* whether the int8-activation AVX2 path may use AVX-VNNI where the CPU has it (1, the default) or keeps to
 * vpmaddubsw (0: tests and benchmarks compare the two on a CPU that has both) */
void mxk_set_avxvnni(int on) { allow_avxvnni = on; }

int mxk_avxvnni(void) { return allow_avxvnni && max_isa >= 1 && have_avxvnni(); /* which needs AVX2 */ }

#if MXK_AVXVNNI
#include <cpuid.h>
int have_avxvnni(void) { /* CPUID leaf 7, sub-leaf 1: EAX bit 4 (the OS keeps YMM state: have_avx2) */
    static int cached = -1;
    if (cached < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        cached = have_avx2() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1u);
    }
    return cached;
}
#else
int have_avxvnni(void) { return 0; }
#endif

/* ------------------------------------------------------------------------------------------------- threads */

typedef struct {
    const job_t *job;
    int64_t n0, n1;
    float *decode_out; /* NULL: linear */
} part_t;

static void *run_part(void *arg) {
    part_t *p = (part_t *)arg;
    if (p->job->fn)
        p->job->fn(p->job->fn_ctx, p->n0, p->n1);
    else if (p->decode_out)
        decode_rows_portable(p->job, p->n0, p->n1, p->decode_out);
    else if (p->job->x16)
        linear_gx16(p->job, p->n0, p->n1, p->job->q8_path);
    else if (p->job->xq && is_gguf(p->job->fast))
        linear_gq8(p->job, p->n0, p->n1, p->job->q8_path);
    else if (p->job->xq)
        linear_q8(p->job, p->n0, p->n1, p->job->q8_path);
    else if (use_fast(p->job) == 2 && is_gguf(p->job->fast))
        linear_gguf_avx512(p->job, p->n0, p->n1);
    else if (use_fast(p->job) == 2)
        linear_vbmi(p->job, p->n0, p->n1);
    else if (use_fast(p->job) == 1)
        linear_avx2(p->job, p->n0, p->n1);
    else
        linear_portable(p->job, p->n0, p->n1);
    return NULL;
}

/* part i of `count` equal parts of job j's rows [0, n) (the last ones a row larger) */
static part_t part_of(const job_t *j, int64_t i, int64_t count, float *decode_out) {
    part_t p = {j, j->n * i / count, j->n * (i + 1) / count, decode_out};
    return p;
}

/* A small pool of worker threads, started on first need and kept. A call splits its rows into chunks (a few per
 * thread: a thread that starts late or runs slower takes fewer) and publishes them in one atomic word, pool_next:
 * the call's number (low 32 bits), its chunk count and the next unclaimed chunk. The caller and the workers claim
 * chunks from it with compare-and-swap until none is left, so each chunk runs once, on one thread, and a worker the
 * OS has not scheduled (a busy machine) delays nothing. Nothing on this path takes a lock: a worker that finished,
 * and a caller waiting for the last chunk, spin for up to SPIN_NS (decode steps call the kernel every few tens of
 * microseconds; a sleeping thread's wake-up costs about as much as a small layer's product, and a lock the other
 * thread holds puts the waiter to sleep), then sleep on a condition variable, announced in a counter the other side
 * reads after its own atomic store (no wake-up is lost): an idle pool never spins for long. A row's result depends
 * only on the row, never on the chunk or the thread that computed it. Calls are serialised (ctypes releases the
 * GIL, so two Python threads may call at once). After fork() the child starts over. */
#define SPIN_NS 100000
#define CHUNKS_PER_THREAD 4
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER, pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static int pool_workers = 0, atfork_done = 0;
static const job_t *pool_job;  /* the current call's job and decode output: stable while it has unfinished chunks */
static float *pool_decode_out;
static uint64_t pool_next = 0; /* call number << 32 | chunk count << 16 | next chunk */
static int pool_pending = 0;   /* the current call's unfinished chunks */
static int pool_sleepers = 0, caller_sleeping = 0;

static uint32_t call_of(uint64_t v) { return (uint32_t)(v >> 32); }

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* spin while call_of(pool_next) == call, for up to SPIN_NS; returns when it changed or the time is up */
static void spin_while_call(uint32_t call) {
    int64_t end = now_ns() + SPIN_NS;
    for (int i = 1; call_of(__atomic_load_n(&pool_next, __ATOMIC_ACQUIRE)) == call; i++) {
#if MXK_X86
        _mm_pause();
#endif
        if ((i & 63) == 0 && now_ns() > end) return;
    }
}

/* spin while *v > 0, for up to SPIN_NS */
static void spin_while_positive(const int *v) {
    int64_t end = now_ns() + SPIN_NS;
    for (int i = 1; __atomic_load_n(v, __ATOMIC_ACQUIRE) > 0; i++) {
#if MXK_X86
        _mm_pause();
#endif
        if ((i & 63) == 0 && now_ns() > end) return;
    }
}

/* run chunks of call `call` until none is left unclaimed (or another call has begun: then this one has none left) */
static void run_chunks(uint32_t call) {
    uint64_t v = __atomic_load_n(&pool_next, __ATOMIC_ACQUIRE);
    for (;;) {
        int64_t idx = (int64_t)(v & 0xFFFF), count = (int64_t)((v >> 16) & 0xFFFF);
        if (call_of(v) != call || idx >= count) return;
        if (!__atomic_compare_exchange_n(&pool_next, &v, v + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
        /* a claimed chunk keeps its call unfinished, so the job cannot change under it */
        part_t part = part_of(pool_job, idx, count, pool_decode_out);
        run_part(&part);
        if (__atomic_sub_fetch(&pool_pending, 1, __ATOMIC_SEQ_CST) == 0 &&
            __atomic_load_n(&caller_sleeping, __ATOMIC_SEQ_CST)) {
            pthread_mutex_lock(&pool_mu);
            pthread_cond_signal(&done_cv);
            pthread_mutex_unlock(&pool_mu);
        }
        v = __atomic_load_n(&pool_next, __ATOMIC_ACQUIRE);
    }
}

/* arg: the call number current when the worker was created (the calls before it) */
static void *worker_main(void *arg) {
    uint32_t seen = (uint32_t)(uintptr_t)arg;
    for (;;) {
        spin_while_call(seen);
        if (call_of(__atomic_load_n(&pool_next, __ATOMIC_ACQUIRE)) == seen) {
            pthread_mutex_lock(&pool_mu);
            __atomic_add_fetch(&pool_sleepers, 1, __ATOMIC_SEQ_CST);
            while (call_of(__atomic_load_n(&pool_next, __ATOMIC_SEQ_CST)) == seen)
                pthread_cond_wait(&work_cv, &pool_mu);
            __atomic_sub_fetch(&pool_sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&pool_mu);
        }
        seen = call_of(__atomic_load_n(&pool_next, __ATOMIC_ACQUIRE));
        run_chunks(seen);
    }
    return NULL;
}

static void pool_after_fork(void) {
    pool_workers = pool_pending = pool_sleepers = caller_sleeping = 0;
    pool_next = 0;
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
        uintptr_t arg = call_of(__atomic_load_n(&pool_next, __ATOMIC_ACQUIRE)); /* changes only under call_mu */
        if (pthread_create(&tid, NULL, worker_main, (void *)arg) != 0) break;
        pthread_detach(tid);
        pool_workers++;
    }
    return pool_workers;
}

/* rows [0, n) of job j on the caller and the pool's workers (threads - 1 of them), in chunks */
static void run_pooled(const job_t *j, int threads, float *decode_out) {
    int64_t count = (int64_t)threads * CHUNKS_PER_THREAD;
    if (count > j->n) count = j->n;
    pool_job = j;
    pool_decode_out = decode_out;
    __atomic_store_n(&pool_pending, (int)count, __ATOMIC_RELAXED);
    uint32_t call = call_of(__atomic_load_n(&pool_next, __ATOMIC_ACQUIRE)) + 1;
    __atomic_store_n(&pool_next, (uint64_t)call << 32 | (uint64_t)count << 16, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool_sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&pool_mu);
        pthread_cond_broadcast(&work_cv);
        pthread_mutex_unlock(&pool_mu);
    }
    run_chunks(call);
    spin_while_positive(&pool_pending);
    if (__atomic_load_n(&pool_pending, __ATOMIC_ACQUIRE) > 0) {
        pthread_mutex_lock(&pool_mu);
        __atomic_store_n(&caller_sleeping, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&pool_pending, __ATOMIC_SEQ_CST) > 0) pthread_cond_wait(&done_cv, &pool_mu);
        __atomic_store_n(&caller_sleeping, 0, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&pool_mu);
    }
}

/* the runtime's parallel-for of this thread's calls (mxk_use_pfor), NULL: the pool above */
static __thread mxk_pfor_t ext_pfor = NULL;
static __thread void *ext_pctx = NULL;
static long ext_calls = 0;

void mxk_use_pfor(mxk_pfor_t pfor, void *pctx) {
    ext_pfor = pfor;
    ext_pctx = pctx;
}

static void run_part_at(void *parts, size_t i) { run_part((part_t *)parts + i); }

/* rows [0, n) of job j as `count` parts (part_of) */
static void split_parts(part_t *parts, const job_t *j, int count, float *decode_out) {
    for (int t = 0; t < count; t++) parts[t] = part_of(j, t, count, decode_out);
}

/* the parts of a call on the runtime's parallel-for: no shared state, so calls from several threads run at once */
static int run_parts_ext(const job_t *j, int threads, float *decode_out) {
    part_t parts[MXK_MAX_THREADS];
    split_parts(parts, j, threads, decode_out);
    if (ext_pfor(ext_pctx, run_part_at, (size_t)threads, parts) != 0)
        for (int t = 0; t < threads; t++) run_part(&parts[t]);
    else
        __atomic_add_fetch(&ext_calls, 1, __ATOMIC_RELAXED);
    return 0;
}

/* how many calls ran on a runtime's parallel-for since the library loaded (tests: the operators use it) */
long mxk_pfor_calls(void) { return __atomic_load_n(&ext_calls, __ATOMIC_RELAXED); }

/* split rows [0, n) over up to `threads` parts (the caller's thread runs the first one) */
static int run_parts(const job_t *j, int threads, float *decode_out) {
    if (threads < 1) threads = 1;
    if (threads > MXK_MAX_THREADS) threads = MXK_MAX_THREADS;
    if (threads > j->n) threads = (int)(j->n > 0 ? j->n : 1);
    if (ext_pfor != NULL) return run_parts_ext(j, threads, decode_out);
    if (threads > 1) {
        pthread_mutex_lock(&call_mu);
        if (pool_grow(threads - 1) < threads - 1) threads = pool_workers + 1; /* the system refused */
        if (threads > 1) run_pooled(j, threads, decode_out);
        pthread_mutex_unlock(&call_mu);
        if (threads > 1) return 0;
    }
    part_t whole = part_of(j, 0, 1, decode_out); /* one thread: no pool state touched */
    run_part(&whole);
    return 0;
}

/* ------------------------------------------------------------------------------------------------- API */

/* the path serving format `fast` (1 E2M3, 2 E2M1, 3 INT8, 4..10 GGUF blocks: mxkernel.h) at block size `block` on
 * this CPU: 0 portable, 1 AVX2, 2 AVX-512 (VBMI for the MX formats, AVX-512F for GGUF blocks) */
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
    job_t j = {codes, scales, lut,  NULL, NULL, n,    nblocks * block, nblocks, 0,
               0,     bits,   block, FAST_NONE, NULL, NULL, 0,         NULL,    NULL, NULL, 0, 0, NULL};
    return run_parts(&j, threads, out);
}

/* out[n, nblocks * 32] = every weight of GGUF blocks (fast 4..10; mxkernel.h), float32, bit-exact to
 * accel.formats.ggml's dequantize; -1 for another format code */
int mxk_decode_ggml(const uint8_t *codes, const uint8_t *scales, int fast, int64_t n, int64_t nblocks, float *out,
                    int threads) {
    if (!is_gguf(fast)) return -1;
    job_t j = {codes, scales, NULL, NULL, NULL, n, nblocks * 32, nblocks, 0, 0, gguf_bits(fast), 32, fast, NULL, NULL,
               0, NULL, NULL, NULL, 0, 0, NULL};
    return run_parts(&j, threads, out);
}

/* y[S, N] = x[S, K] @ W^T; x rows are xstride >= nblocks * block floats apart, columns K.. zero. GGUF blocks (fast 4
 * .. 10): scales is the uint8 plane of the blocks' float16 (fast 7..10: float32) scales (mxkernel.h), bits
 * gguf_bits(fast), block 32, K = nblocks * 32, lut unused (may be NULL). -1 for an unknown format code or GGUF
 * arguments that do not fit. */
int mxk_linear(const uint8_t *codes, const uint8_t *scales, const float *lut, int bits, int block, int fast,
               int64_t n, int64_t k, int64_t nblocks, const float *x, int64_t s, int64_t xstride, float *y,
               int threads) {
    if (fast < FAST_NONE || fast > FAST_MAX) return -1;
    if (is_gguf(fast) && (bits != gguf_bits(fast) || block != 32 || k != nblocks * 32)) return -1;
    job_t j = {codes, scales, lut, x, y, n, k, nblocks, s, xstride, bits, block, fast, NULL, NULL, 0, NULL, NULL, NULL,
               0, 0, NULL};
    return run_parts(&j, threads, NULL);
}

int mxk_parallel(void (*fn)(const void *, int64_t, int64_t), const void *ctx, int64_t n, int threads) {
    job_t j;
    memset(&j, 0, sizeof j);
    j.n = n;
    j.fn = fn;
    j.fn_ctx = ctx;
    return run_parts(&j, threads, NULL);
}

/* the int8-activation path of a call: 3 AVX-512 VNNI + VBMI, 2 AVX-512 VNNI, 1 AVX2, 0 portable (capped by
 * mxk_set_isa) */
int mxk_q8_path(void) {
    if (max_isa >= 2 && have_vnni()) return max_isa >= 3 && have_vbmi() ? 3 : 2;
    return max_isa >= 1 && have_avx2() ? 1 : 0;
}

#define Q8_STACK_BLOCKS 256 /* 8 KiB of int8 codes */

/* a call's quantized activations: a decode step's fit in q8_stack_t on the caller's stack (no allocator call per
 * operator); larger calls allocate (heap) */
typedef struct {
    int8_t q[32 * Q8_STACK_BLOCKS] __attribute__((aligned(32)));
    float d[Q8_STACK_BLOCKS], u[2 * Q8_STACK_BLOCKS];
    int32_t sq[2 * Q8_STACK_BLOCKS];
} q8_stack_t;
typedef struct {
    int8_t *q;  /* codes [S, nblocks, 32] */
    float *d;   /* scales [S, nblocks] */
    float *u;   /* d * sum(q) [S, nblocks, halves]; NULL where not asked for */
    int32_t *sq; /* sum(q) [S, nblocks, halves]; NULL where not asked for */
    int heap;
} q8_acts_t;

static void q8_acts_free(q8_acts_t *a) {
    if (a->heap) {
        free(a->q);
        free(a->d);
        free(a->u);
        free(a->sq);
    }
}

/* quantize x [S, xstride] per block of 32 into a (mxk_quantize_q8), with the block sums (halves 1 or 2 a block:
 * mxk_q8_block_sums) where `sums` is 1 (u) or 2 (u and sq); 0, or -2 when out of memory (nothing left allocated) */
static int q8_acts(const float *x, int64_t s, int64_t xstride, int64_t nblocks, int halves, int sums, q8_stack_t *st,
                   q8_acts_t *a) {
    const int64_t rb = s * nblocks > 0 ? s * nblocks : 1;
    a->heap = rb > Q8_STACK_BLOCKS;
    a->q = a->heap ? (int8_t *)malloc((size_t)(32 * rb)) : st->q;
    a->d = a->heap ? (float *)malloc(sizeof(float) * (size_t)rb) : st->d;
    a->u = sums < 1 ? NULL : a->heap ? (float *)malloc(sizeof(float) * (size_t)(halves * rb)) : st->u;
    a->sq = sums < 2 ? NULL : a->heap ? (int32_t *)malloc(sizeof(int32_t) * (size_t)(halves * rb)) : st->sq;
    if (!a->q || !a->d || (sums >= 1 && !a->u) || (sums >= 2 && !a->sq)) {
        q8_acts_free(a);
        return -2;
    }
    mxk_quantize_q8(x, s, xstride, nblocks, a->q, a->d);
    if (a->u) mxk_q8_block_sums(a->q, a->d, s, nblocks, halves, a->u, a->sq);
    return 0;
}

/* y[S, N] = q8(x)[S, K] @ W^T for MXFP6 E2M3 (fast 1) or MXFP4 E2M1 (fast 2) weights in blocks of 32, or GGUF
 * blocks (fast 4..10; codes and scales as mxk_linear's), the activations quantized per block
 * to int8 first (mxkernel_q8.c, mxkernel_gq8.c: integer dot products per block); -1 for another format, -2 when out
 * of memory */
int mxk_linear_q8(const uint8_t *codes, const uint8_t *scales, int fast, int64_t n, int64_t nblocks, const float *x,
                  int64_t s, int64_t xstride, float *y, int threads) {
    if (fast != FAST_E2M3 && fast != FAST_E2M1 && !is_gguf(fast)) return -1;
    const int halves = fast == FAST_I8_F32 ? 2 : 1; /* I8_F32: an offset per 16 weights */
    const int offsets = is_gguf(fast) && has_offset(fast); /* the m * dx * sum(q) terms need the block sums */
    q8_stack_t st;
    q8_acts_t a;
    if (q8_acts(x, s, xstride, nblocks, halves, offsets, &st, &a)) return -2;
    int bits = fast == FAST_E2M3 ? 6 : is_gguf(fast) ? gguf_bits(fast) : 4;
    job_t j = {codes, scales, NULL, x, y, n, nblocks * 32, nblocks, s, xstride, bits, 32, fast, a.q, a.d, mxk_q8_path(),
               NULL,  NULL, a.u, 0, 0, NULL};
    int rc = run_parts(&j, threads, NULL);
    q8_acts_free(&a);
    return rc;
}

/* y[S, N] = q8(x)[S, K] @ W^T for GGUF blocks (fast 4..10) interleaved 16 rows at a time (mxkernel_gx16.c:
 * ceil(N / 16) groups in the planes); -1 for another format, -2 when out of memory */
int mxk_linear_x16(const uint8_t *codes, const uint8_t *scales, int fast, int64_t n, int64_t nblocks, const float *x,
                   int64_t s, int64_t xstride, float *y, int threads) {
    if (!is_gguf(fast)) return -1;
    q8_stack_t st;
    q8_acts_t a; /* the integer sums too (sq: the starting sums of the unsigned codes) */
    if (q8_acts(x, s, xstride, nblocks, fast == FAST_I8_F32 ? 2 : 1, 2, &st, &a)) return -2;
    job_t j;
    memset(&j, 0, sizeof j);
    j.codes = codes;
    j.scales = scales;
    j.y = y;
    j.n = (n + 15) / 16;
    j.width = n;
    j.k = nblocks * 32;
    j.nblocks = nblocks;
    j.s = s;
    j.xstride = xstride;
    j.bits = gguf_bits(fast);
    j.block = 32;
    j.fast = fast;
    j.xq = a.q;
    j.xd = a.d;
    j.xu = a.u;
    j.xs = a.sq;
    j.x16 = 1;
    j.q8_path = mxk_q8_path();
    int rc = run_parts(&j, threads, NULL);
    q8_acts_free(&a);
    return rc;
}
