/* Block-quantized weights: Q4_0 and the K-quants decoded against a reference written here from
 * the GGUF format's definition (ggml-common.h's layouts, value by value), rows quantized into
 * them, and the integer matmul of 8-bit activations: the same bits on every instruction set,
 * batch, column split and thread count, and within rounding of a double-precision reference. */
#include <sluice/kernels.h>

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rs = 987654321;
static uint32_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}

static float frand(void)
{
    return (float)(rnd() >> 8) * (1.0f / 8388608.0f) - 1.0f;
}

#define LEN(a) (int)(sizeof(a) / sizeof((a)[0]))

static const enum sl_dtype qtypes[] = {SL_DTYPE_Q8_0, SL_DTYPE_Q4_0, SL_DTYPE_Q4_K, SL_DTYPE_Q5_K,
                                       SL_DTYPE_Q6_K};

/* A finite half in [2^-14, 2) with a random sign: a plausible scale. */
static uint16_t rand_half(void)
{
    return (uint16_t)((rnd() & 1) << 15 | (1 + rnd() % 15) << 10 | (rnd() & 0x3ff));
}

static float half(const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return sl_cpu_f16_to_f32(h);
}

static size_t block_bytes(enum sl_dtype t)
{
    return sl_dtype_row_bytes(t, sl_dtype_block(t));
}

/* Random bytes for rows of blocks, every fp16 field a finite scale. */
static unsigned char *rand_rows(enum sl_dtype t, int rows, int cols)
{
    size_t n = sl_dtype_row_bytes(t, cols) * (size_t)rows, bb = block_bytes(t);
    unsigned char *p = malloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)rnd();
    for (size_t b = 0; b < n; b += bb) {
        uint16_t h[2] = {rand_half(), rand_half()};
        if (t == SL_DTYPE_Q6_K)
            memcpy(p + b + 208, h, 2);
        else
            memcpy(p + b, h, t == SL_DTYPE_Q4_K || t == SL_DTYPE_Q5_K ? 4 : 2);
    }
    return p;
}

/* Value v of a row, from the format's definition. */
static float ref_value(enum sl_dtype t, const unsigned char *row, int v)
{
    switch (t) {
    case SL_DTYPE_Q8_0: {
        const unsigned char *b = row + (size_t)(v / 32) * 34;
        return half(b) * (float)(int8_t)b[2 + v % 32];
    }
    case SL_DTYPE_Q4_0: {
        const unsigned char *b = row + (size_t)(v / 32) * 18;
        int i = v % 32, q = i < 16 ? b[2 + i] & 15 : b[2 + i - 16] >> 4;
        return half(b) * (float)(q - 8);
    }
    case SL_DTYPE_Q4_K:
    case SL_DTYPE_Q5_K: {
        const unsigned char *b = row + (size_t)(v / 256) * block_bytes(t);
        const unsigned char *scales = b + 4, *qh = b + 16;
        const unsigned char *qs = b + (t == SL_DTYPE_Q4_K ? 16 : 48);
        int i = v % 256, chunk = i / 64, upper = (i % 64) >= 32, l = i % 32;
        int s = 2 * chunk + upper, sc, m;
        if (s < 4) {
            sc = scales[s] & 63;
            m = scales[s + 4] & 63;
        } else {
            sc = (scales[s + 4] & 0xF) | ((scales[s - 4] >> 6) << 4);
            m = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
        }
        int q = upper ? qs[32 * chunk + l] >> 4 : qs[32 * chunk + l] & 0xF;
        if (t == SL_DTYPE_Q5_K && (qh[l] >> s) & 1)
            q += 16;
        return (half(b) * (float)sc) * (float)q - half(b + 2) * (float)m;
    }
    case SL_DTYPE_Q6_K: {
        const unsigned char *b = row + (size_t)(v / 256) * 210;
        const unsigned char *ql = b, *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        int i = v % 256, h = i / 128, j = (i % 128) / 32, l = i % 32;
        int lo = j % 2 ? ql[64 * h + 32 + l] : ql[64 * h + l];
        lo = j < 2 ? lo & 0xF : lo >> 4;
        int q = lo | ((qh[32 * h + l] >> (2 * j)) & 3) << 4;
        return (half(b + 208) * (float)scales[i / 16]) * (float)(q - 32);
    }
    default: return NAN;
    }
}

Test(quant, rows_decode_as_the_format_defines_when_blocks_are_random)
{
    const int cols = 512, rows = 2048; /* 4096 super-blocks: every 6-bit scale and min */
    for (int ti = 0; ti < LEN(qtypes); ti++) {
        enum sl_dtype t = qtypes[ti];
        unsigned char *p = rand_rows(t, rows, cols);
        struct sl_mat m = {t, p, rows, cols};
        size_t rb = sl_dtype_row_bytes(t, cols);
        float *out = malloc(cols * sizeof(float));
        bool seen_sc[8][64] = {{false}}, seen_m[8][64] = {{false}};
        for (int r = 0; r < rows; r++) {
            sl_cpu_mat_row(out, &m, r);
            for (int v = 0; v < cols; v++) {
                float want = ref_value(t, p + rb * (size_t)r, v);
                cr_assert(out[v] == want || (isnan(out[v]) && isnan(want)),
                          "%s row %d value %d: %.9g, want %.9g", sl_dtype_name(t), r, v, out[v],
                          want);
            }
            if (t == SL_DTYPE_Q4_K || t == SL_DTYPE_Q5_K)
                for (int b = 0; b < cols / 256; b++)
                    for (int s = 0; s < 8; s++) {
                        int sc, mn;
                        const unsigned char *sb = p + rb * (size_t)r + block_bytes(t) * b + 4;
                        /* The packing as written in kernels.h, independent of ref_value. */
                        sc = s < 4 ? sb[s] & 63 : (sb[s + 4] & 15) | (sb[s - 4] >> 6) << 4;
                        mn = s < 4 ? sb[s + 4] & 63 : (sb[s + 4] >> 4) | (sb[s] >> 6) << 4;
                        seen_sc[s][sc] = seen_m[s][mn] = true;
                    }
        }
        if (t == SL_DTYPE_Q4_K || t == SL_DTYPE_Q5_K)
            for (int s = 0; s < 8; s++)
                for (int v = 0; v < 64; v++)
                    cr_assert(seen_sc[s][v] && seen_m[s][v], "%s: sub-block %d value %d untried",
                              sl_dtype_name(t), s, v);
        cr_assert_eq(sl_dtype_row_bytes(t, cols),
                     (size_t)(cols / sl_dtype_block(t)) * block_bytes(t));
        cr_assert_eq(sl_dtype_row_bytes(t, sl_dtype_block(t) + 16), 0, "%s: a partial block",
                     sl_dtype_name(t));
        free(out);
        free(p);
    }
    cr_assert_eq(block_bytes(SL_DTYPE_Q4_0), 18);
    cr_assert_eq(block_bytes(SL_DTYPE_Q4_K), 144);
    cr_assert_eq(block_bytes(SL_DTYPE_Q5_K), 176);
    cr_assert_eq(block_bytes(SL_DTYPE_Q6_K), 210);
}

/* Quantizing random rows keeps every value within the step its block allows, relative to the
 * row's scale: about 1/15 of a sub-block's span for 4 bits, 1/31 for 5, 1/63 for 6. */
Test(quant, quantized_rows_stay_near_their_values_when_rows_are_random)
{
    const enum sl_dtype ts[] = {SL_DTYPE_Q4_0, SL_DTYPE_Q4_K, SL_DTYPE_Q5_K, SL_DTYPE_Q6_K};
    const double tol[] = {0.09, 0.09, 0.05, 0.04}; /* rms error / rms value */
    const int cols = 1024;
    float *x = malloc(cols * sizeof(float)), *back = malloc(cols * sizeof(float));
    unsigned char *q = malloc(sl_dtype_row_bytes(SL_DTYPE_Q6_K, cols));
    for (int ti = 0; ti < LEN(ts); ti++)
        for (int rep = 0; rep < 20; rep++) {
            float scale = rep % 2 ? 1e-3f : 40.0f;
            for (int i = 0; i < cols; i++)
                x[i] = frand() * scale;
            sl_cpu_quantize_row(ts[ti], q, x, cols);
            struct sl_mat m = {ts[ti], q, 1, cols};
            sl_cpu_mat_row(back, &m, 0);
            double e = 0, s = 0;
            for (int i = 0; i < cols; i++) {
                e += (double)(back[i] - x[i]) * (back[i] - x[i]);
                s += (double)x[i] * x[i];
            }
            cr_assert(sqrt(e / s) < tol[ti], "%s: relative rms error %.4f", sl_dtype_name(ts[ti]),
                      sqrt(e / s));
        }
    /* An all-zero row stays zero. */
    memset(x, 0, cols * sizeof(float));
    for (int ti = 0; ti < LEN(ts); ti++) {
        sl_cpu_quantize_row(ts[ti], q, x, cols);
        struct sl_mat m = {ts[ti], q, 1, cols};
        sl_cpu_mat_row(back, &m, 0);
        for (int i = 0; i < cols; i++)
            cr_assert_eq(back[i], 0.0f, "%s", sl_dtype_name(ts[ti]));
    }
    free(x);
    free(back);
    free(q);
}

static int isas(enum sl_cpu_isa *out)
{
    int n = 0;
    for (enum sl_cpu_isa i = SL_CPU_ISA_SCALAR; i <= sl_cpu_isa_best(); i++)
        out[n++] = i;
    return n;
}

/* Activation rows: |q| <= 127, d·q within half a step of x, sums of 16 exact; the same bytes on
 * every instruction set. */
Test(quant, activations_quantize_to_the_same_bytes_on_every_isa)
{
    const int n = 5, cols = 768;
    float *x = malloc((size_t)n * cols * sizeof(float));
    for (int i = 0; i < n * cols; i++)
        x[i] = frand() * (i % 97 == 0 ? 50.0f : 1.0f);
    for (int i = 0; i < cols; i++)
        x[2 * cols + i] = 0.0f; /* a zero row */
    const enum sl_qact kinds[] = {SL_QACT_32, SL_QACT_256};
    enum sl_cpu_isa list[3];
    int ni = isas(list);
    for (int ki = 0; ki < 2; ki++) {
        enum sl_qact kind = kinds[ki];
        size_t rb = sl_cpu_qact_row_bytes(kind, cols);
        cr_assert(rb >= (size_t)cols && rb % 32 == 0);
        unsigned char *ref = malloc(rb * n), *got = malloc(rb * n);
        memset(ref, 0, rb * n);
        cr_assert_eq(sl_cpu_set_isa(SL_CPU_ISA_SCALAR), SL_OK);
        sl_cpu_qact_quantize(kind, ref, x, n, cols);
        int bs = kind == SL_QACT_256 ? 256 : 32;
        for (int r = 0; r < n; r++) {
            const unsigned char *row = ref + rb * r;
            const int8_t *q = (const int8_t *)row;
            const float *d = (const float *)(row + cols);
            for (int i = 0; i < cols; i++) {
                float xi = x[(size_t)r * cols + i], di = d[i / bs];
                cr_assert(q[i] >= -127 && q[i] <= 127);
                cr_assert(fabsf(di * q[i] - xi) <= 0.5f * di * 1.0001f + 1e-30f,
                          "row %d value %d: %g·%d vs %g", r, i, di, q[i], xi);
            }
            if (kind == SL_QACT_256) {
                const int16_t *s = (const int16_t *)(row + cols + 4 * (cols / 256));
                for (int g = 0; g < cols / 16; g++) {
                    int want = 0;
                    for (int i = 0; i < 16; i++)
                        want += q[16 * g + i];
                    cr_assert_eq(s[g], want);
                }
            }
        }
        for (int i = 1; i < ni; i++) {
            cr_assert_eq(sl_cpu_set_isa(list[i]), SL_OK);
            memset(got, 0, rb * n);
            sl_cpu_qact_quantize(kind, got, x, n, cols);
            cr_assert(memcmp(ref, got, rb * n) == 0, "%s differs from scalar",
                      sl_cpu_isa_name(list[i]));
        }
        free(ref);
        free(got);
    }
    sl_cpu_set_isa(sl_cpu_isa_best());
    free(x);
}

/* The integer product from the definition, in double: dequantized weights times dequantized
 * activations. */
static double ref_dot(enum sl_dtype t, const unsigned char *wrow, const unsigned char *xrow,
                      int cols, double *mag)
{
    int bs = sl_dtype_block(t) == 256 ? 256 : 32;
    const int8_t *q = (const int8_t *)xrow;
    const float *d = (const float *)(xrow + cols);
    double s = 0;
    *mag = 0;
    for (int v = 0; v < cols; v++) {
        double p = (double)ref_value(t, wrow, v) * d[v / bs] * q[v];
        s += p;
        *mag += fabs(p);
    }
    return s;
}

static void check_int_matmul(enum sl_dtype t, int n, int d, int cols, bool extreme)
{
    unsigned char *w = rand_rows(t, d, cols);
    if (extreme) {
        /* Every quant and scale at its largest, with the largest activations: the widest
         * intermediate sums. */
        size_t bb = block_bytes(t), nbytes = sl_dtype_row_bytes(t, cols) * (size_t)d;
        for (size_t b = 0; b < nbytes; b += bb) {
            memset(w + b, t == SL_DTYPE_Q8_0 ? 0x7f : 0xff, bb);
            uint16_t one = 0x3c00;
            if (t == SL_DTYPE_Q6_K) {
                memset(w + b + 192, 0x7f, 16);
                memcpy(w + b + 208, &one, 2);
            } else {
                memcpy(w + b, &one, 2);
                if (t == SL_DTYPE_Q4_K || t == SL_DTYPE_Q5_K)
                    memcpy(w + b + 2, &one, 2);
            }
        }
    }
    struct sl_mat m = {t, w, d, cols};
    enum sl_qact kind = sl_cpu_qact_kind(t);
    size_t xb = sl_cpu_qact_row_bytes(kind, cols), rb = sl_dtype_row_bytes(t, cols);
    float *x = malloc((size_t)n * cols * sizeof(float));
    for (int i = 0; i < n * cols; i++)
        x[i] = extreme ? (i % 3 ? 1.0f : -1.0f) : frand();
    unsigned char *qa = malloc(xb * n);
    cr_assert_eq(sl_cpu_set_isa(SL_CPU_ISA_SCALAR), SL_OK);
    sl_cpu_qact_quantize(kind, qa, x, n, cols);
    float *ref = malloc((size_t)n * d * sizeof(float)),
          *got = malloc((size_t)n * d * sizeof(float));
    sl_cpu_matmul_q_cols(ref, qa, &m, n, 0, d);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < d; i++) {
            double mag, want = ref_dot(t, w + rb * i, qa + xb * r, cols, &mag);
            float g = ref[(size_t)r * d + i];
            cr_assert(fabs(g - want) <= 1e-6 * mag + 1e-30, "%s n=%d [%d,%d]: %.9g vs %.9g",
                      sl_dtype_name(t), n, r, i, g, want);
        }
    enum sl_cpu_isa list[3];
    int ni = isas(list);
    for (int k = 0; k < ni; k++) {
        cr_assert_eq(sl_cpu_set_isa(list[k]), SL_OK);
        memset(got, 0xff, (size_t)n * d * sizeof(float));
        sl_cpu_matmul_q_cols(got, qa, &m, n, 0, d);
        cr_assert(memcmp(ref, got, (size_t)n * d * sizeof(float)) == 0,
                  "%s %s n=%d: differs from scalar", sl_cpu_isa_name(list[k]), sl_dtype_name(t), n);
        /* Row by row and in column pieces: the same bits. */
        memset(got, 0xff, (size_t)n * d * sizeof(float));
        for (int r = 0; r < n; r++)
            for (int c = 0; c < d; c += 3)
                sl_cpu_matmul_q_cols(got + (size_t)r * d, qa + xb * r, &m, 1, c,
                                     d - c < 3 ? d : c + 3);
        cr_assert(memcmp(ref, got, (size_t)n * d * sizeof(float)) == 0,
                  "%s %s n=%d: rows alone differ from the batch", sl_cpu_isa_name(list[k]),
                  sl_dtype_name(t), n);
    }
    sl_cpu_set_isa(sl_cpu_isa_best());
    free(w);
    free(x);
    free(qa);
    free(ref);
    free(got);
}

Test(quant, integer_matmul_gives_one_result_on_every_isa_and_batch)
{
    const int ns[] = {1, 2, 5};
    for (int ti = 0; ti < LEN(qtypes); ti++) {
        enum sl_dtype t = qtypes[ti];
        /* Q8_0 and Q4_0: a partial unit of 8 blocks at the row's end (288 = 9 blocks). */
        int cols = sl_dtype_block(t) == 256 ? 768 : 288;
        for (int a = 0; a < LEN(ns); a++)
            check_int_matmul(t, ns[a], 11, cols, false);
        check_int_matmul(t, 2, 5, sl_dtype_block(t) == 256 ? 2048 : 2048, true);
    }
}

/* The fp32 path of the new types (cpu_int8_activations off) equals the fp32 matmul of the
 * dequantized matrix, bit for bit, on every instruction set and batch. */
Test(quant, float_matmul_of_new_types_equals_its_dequantized_twin)
{
    const enum sl_dtype ts[] = {SL_DTYPE_Q4_0, SL_DTYPE_Q4_K, SL_DTYPE_Q5_K, SL_DTYPE_Q6_K};
    const int ns[] = {1, 2, 3, 7, 33};
    enum sl_cpu_isa list[3];
    int ni = isas(list);
    for (int ti = 0; ti < LEN(ts); ti++) {
        int d = 13, cols = 512;
        unsigned char *w = rand_rows(ts[ti], d, cols);
        struct sl_mat m = {ts[ti], w, d, cols};
        float *deq = malloc((size_t)d * cols * sizeof(float));
        for (int i = 0; i < d; i++)
            sl_cpu_mat_row(deq + (size_t)i * cols, &m, i);
        struct sl_mat mf = {SL_DTYPE_F32, deq, d, cols};
        for (int k = 0; k < ni; k++) {
            cr_assert_eq(sl_cpu_set_isa(list[k]), SL_OK);
            for (int a = 0; a < LEN(ns); a++) {
                int n = ns[a];
                float *x = malloc((size_t)n * cols * sizeof(float));
                for (int i = 0; i < n * cols; i++)
                    x[i] = frand();
                float *o1 = malloc((size_t)n * d * sizeof(float));
                float *o2 = malloc((size_t)n * d * sizeof(float));
                sl_cpu_matmul(o1, x, &m, n);
                sl_cpu_matmul(o2, x, &mf, n);
                cr_assert(memcmp(o1, o2, (size_t)n * d * sizeof(float)) == 0,
                          "%s %s n=%d: differs from its dequantized twin", sl_cpu_isa_name(list[k]),
                          sl_dtype_name(ts[ti]), n);
                free(x);
                free(o1);
                free(o2);
            }
        }
        sl_cpu_set_isa(sl_cpu_isa_best());
        free(w);
        free(deq);
    }
}

/* The pool's matmuls with int8 on: the integer matmul of x quantized once, whatever the thread
 * count, with room reserved for the quantized x or without (then quantized call by call); a
 * job mixing kinds (Q8_0 and Q6_K beside Q4_K) quantizes each kind once. Off: the fp32 path. */
Test(quant, pool_matmuls_take_the_integer_path_when_int8_is_on)
{
    const int n = 6, cols = 512, d = 40, hid = 24;
    unsigned char *wq = rand_rows(SL_DTYPE_Q4_K, d, cols);
    unsigned char *wk = rand_rows(SL_DTYPE_Q8_0, d, cols);
    unsigned char *wv = rand_rows(SL_DTYPE_Q6_K, d, cols);
    unsigned char *w1 = rand_rows(SL_DTYPE_Q4_K, hid, cols);
    unsigned char *w3 = rand_rows(SL_DTYPE_Q4_K, hid, cols);
    struct sl_mat ws[3] = {
        {SL_DTYPE_Q4_K, wq, d, cols}, {SL_DTYPE_Q8_0, wk, d, cols}, {SL_DTYPE_Q6_K, wv, d, cols}};
    struct sl_mat m1 = {SL_DTYPE_Q4_K, w1, hid, cols}, m3 = {SL_DTYPE_Q4_K, w3, hid, cols};
    float *x = malloc((size_t)n * cols * sizeof(float));
    for (int i = 0; i < n * cols; i++)
        x[i] = frand();
    float *want[3], *got[3], *fp[3];
    for (int i = 0; i < 3; i++) {
        enum sl_qact kind = sl_cpu_qact_kind(ws[i].type);
        unsigned char *qa = malloc(sl_cpu_qact_row_bytes(kind, cols) * n);
        sl_cpu_qact_quantize(kind, qa, x, n, cols);
        want[i] = malloc((size_t)n * d * sizeof(float));
        got[i] = malloc((size_t)n * d * sizeof(float));
        fp[i] = malloc((size_t)n * d * sizeof(float));
        sl_cpu_matmul_q_cols(want[i], qa, &ws[i], n, 0, d);
        sl_cpu_matmul(fp[i], x, &ws[i], n);
        cr_assert(memcmp(want[i], fp[i], (size_t)n * d * sizeof(float)) != 0,
                  "the integer and fp32 paths should differ somewhere");
        free(qa);
    }
    unsigned char *qa = malloc(sl_cpu_qact_row_bytes(SL_QACT_256, cols) * n);
    sl_cpu_qact_quantize(SL_QACT_256, qa, x, n, cols);
    float *h1 = malloc((size_t)n * hid * sizeof(float)),
          *h3 = malloc((size_t)n * hid * sizeof(float));
    sl_cpu_matmul_q_cols(h1, qa, &m1, n, 0, hid);
    sl_cpu_matmul_q_cols(h3, qa, &m3, n, 0, hid);
    sl_cpu_swiglu(h1, h3, n * hid);
    float *g1 = malloc((size_t)n * hid * sizeof(float)),
          *g3 = malloc((size_t)n * hid * sizeof(float));
    for (int room = 0; room < 2; room++)
        for (int th = 1; th <= 2; th++) {
            struct sl_cpu_pool *p = sl_cpu_pool_new(th, false);
            cr_assert_not_null(p);
            if (room)
                cr_assert_eq(sl_cpu_pool_reserve(p, n, cols), SL_OK);
            cr_assert(!sl_cpu_pool_int8(p), "int8 is off until asked for");
            sl_cpu_pool_set_int8(p, true);
            cr_assert(sl_cpu_pool_int8(p));
            float *const outs[3] = {got[0], got[1], got[2]};
            sl_cpu_matmul_multi_mt(p, 3, outs, x, ws, n);
            for (int i = 0; i < 3; i++)
                cr_assert(memcmp(want[i], got[i], (size_t)n * d * sizeof(float)) == 0,
                          "multi %s, room %d, threads %d", sl_dtype_name(ws[i].type), room, th);
            sl_cpu_matmul_swiglu_mt(p, g1, g3, x, &m1, &m3, n);
            cr_assert(memcmp(h1, g1, (size_t)n * hid * sizeof(float)) == 0,
                      "swiglu, room %d, threads %d", room, th);
            sl_cpu_pool_set_int8(p, false);
            sl_cpu_matmul_mt(p, got[0], x, &ws[0], n);
            cr_assert(memcmp(fp[0], got[0], (size_t)n * d * sizeof(float)) == 0,
                      "int8 off: the fp32 path, room %d, threads %d", room, th);
            sl_cpu_pool_free(p);
        }
    for (int i = 0; i < 3; i++) {
        free(want[i]);
        free(got[i]);
        free(fp[i]);
    }
    free(qa);
    free(h1);
    free(h3);
    free(g1);
    free(g3);
    free(x);
    free(wq);
    free(wk);
    free(wv);
    free(w1);
    free(w3);
}
