/* CPU kernels: plain loops, sequential fp32 reductions (see kernels.h for why). */
#include <sluice/kernels.h>

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

float sl_cpu_dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

void sl_cpu_matmul_cols(float *out, const float *x, const float *w, int n, int d, int k, int d0,
                        int d1)
{
    /* Four weight rows at a time: four independent accumulator chains hide the add latency that
     * bounds a single sequential dot, while each chain still sums in plain j order, so every
     * output is bit-identical to sl_cpu_dot. Weight rows are the outer loop so the four rows are
     * read from memory once per call and reused from L1 for every batch row. */
    int i = d0;
    for (; i + 4 <= d1; i += 4) {
        const float *w0 = w + (size_t)i * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
        for (int r = 0; r < n; r++) {
            const float *xr = x + (size_t)r * k;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            for (int j = 0; j < k; j++) {
                float xj = xr[j];
                s0 += w0[j] * xj;
                s1 += w1[j] * xj;
                s2 += w2[j] * xj;
                s3 += w3[j] * xj;
            }
            float *o = out + (size_t)r * d + i;
            o[0] = s0;
            o[1] = s1;
            o[2] = s2;
            o[3] = s3;
        }
    }
    for (; i < d1; i++) {
        const float *wi = w + (size_t)i * k;
        for (int r = 0; r < n; r++)
            out[(size_t)r * d + i] = sl_cpu_dot(x + (size_t)r * k, wi, k);
    }
}

void sl_cpu_matmul(float *out, const float *x, const float *w, int n, int d, int k)
{
    sl_cpu_matmul_cols(out, x, w, n, d, k, 0, d);
}

void sl_cpu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps)
{
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        float ss = 0.0f;
        for (int j = 0; j < dim; j++)
            ss += xr[j] * xr[j];
        ss /= (float)dim;
        ss += eps;
        ss = 1.0f / sqrtf(ss);
        for (int j = 0; j < dim; j++)
            o[j] = w[j] * (ss * xr[j]);
    }
}

void sl_cpu_softmax(float *x, int n)
{
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max)
            max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}

void sl_cpu_rope(float *x, int n_heads, int head_size, int pos, float theta)
{
    for (int i = 0; i < head_size; i += 2) {
        /* Same float expression order as run.c, so angles (and the golden) match exactly. */
        float freq = 1.0f / powf(theta, (float)i / (float)head_size);
        float val = (float)pos * freq;
        float fcr = cosf(val), fci = sinf(val);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)h * head_size + i;
            float v0 = v[0], v1 = v[1];
            v[0] = v0 * fcr - v1 * fci;
            v[1] = v0 * fci + v1 * fcr;
        }
    }
}

void sl_cpu_swiglu(float *h, const float *g, int n)
{
    for (int i = 0; i < n; i++) {
        float v = h[i];
        v *= 1.0f / (1.0f + expf(-v));
        h[i] = v * g[i];
    }
}

void sl_cpu_add(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += x[i];
}

void sl_cpu_axpy(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* ---------------------------------------------------------------------------------------------
 * Thread pool: one job at a time, published under a mutex with a generation counter; the caller
 * takes part 0 and waits for the others. Simple rather than clever: jobs are whole matmuls, so
 * the lock is taken a handful of times per layer, not per row.
 */

struct matmul_job {
    float *out;
    const float *x;
    const float *w;
    int n, d, k;
};

struct sl_cpu_pool {
    int n_threads; /* including the caller */
    pthread_t *tids;
    pthread_mutex_t mu;
    pthread_cond_t work; /* a new generation is published, or quit */
    pthread_cond_t done; /* pending reached 0 */
    uint64_t gen;
    int pending;
    bool quit;
    struct matmul_job job;
};

struct pool_arg {
    struct sl_cpu_pool *p;
    int part;
};

static void run_part(const struct matmul_job *j, int part, int parts)
{
    int d0 = (int)((int64_t)j->d * part / parts);
    int d1 = (int)((int64_t)j->d * (part + 1) / parts);
    sl_cpu_matmul_cols(j->out, j->x, j->w, j->n, j->d, j->k, d0, d1);
}

static void *pool_main(void *arg)
{
    struct pool_arg *a = arg;
    struct sl_cpu_pool *p = a->p;
    int part = a->part;
    free(a);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->quit)
            break;
        seen = p->gen;
        struct matmul_job j = p->job;
        pthread_mutex_unlock(&p->mu);
        run_part(&j, part, p->n_threads);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

struct sl_cpu_pool *sl_cpu_pool_new(int threads)
{
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    struct sl_cpu_pool *p = sl_xcalloc(1, sizeof(*p));
    p->n_threads = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    p->tids = sl_xcalloc((size_t)threads, sizeof(pthread_t));
    for (int i = 1; i < threads; i++) {
        struct pool_arg *a = sl_xmalloc(sizeof(*a));
        a->p = p;
        a->part = i;
        if (pthread_create(&p->tids[i], NULL, pool_main, a) != 0) {
            free(a);
            p->n_threads = i; /* join only those started */
            sl_cpu_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void sl_cpu_pool_free(struct sl_cpu_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++)
        pthread_join(p->tids[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->tids);
    free(p);
}

int sl_cpu_pool_threads(const struct sl_cpu_pool *p)
{
    return p ? p->n_threads : 1;
}

void sl_cpu_matmul_mt(struct sl_cpu_pool *p, float *out, const float *x, const float *w, int n,
                      int d, int k)
{
    /* Below a few hundred thousand multiply-adds the wake-up costs more than it saves. */
    if (!p || p->n_threads == 1 || (int64_t)n * d * k < 65536 || d < p->n_threads) {
        sl_cpu_matmul(out, x, w, n, d, k);
        return;
    }
    struct matmul_job j = {out, x, w, n, d, k};
    pthread_mutex_lock(&p->mu);
    p->job = j;
    p->pending = p->n_threads - 1;
    p->gen++;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    run_part(&j, 0, p->n_threads);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

size_t sl_dtype_row_bytes(enum sl_dtype t, int cols)
{
    if (cols < 1)
        return 0;
    switch (t) {
    case SL_DTYPE_F32: return (size_t)cols * 4;
    case SL_DTYPE_F16:
    case SL_DTYPE_BF16: return (size_t)cols * 2;
    case SL_DTYPE_Q8_0:
        return cols % SL_Q8_0_BLOCK ? 0 : (size_t)(cols / SL_Q8_0_BLOCK) * (2 + SL_Q8_0_BLOCK);
    }
    return 0;
}
