/* Weight helpers shared by the GGUF and safetensors loaders: element conversions and placing a
 * borrowed tensor where the kernels can read it. */
#include "worker_impl.h"

#include <stdlib.h>
#include <string.h>

float sl_model_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | man << 13; /* inf, nan (payload kept) */
    } else if (exp != 0) {
        bits = sign | (exp + 112) << 23 | man << 13; /* rebias 15 → 127 */
    } else if (man == 0) {
        bits = sign;
    } else {
        /* Subnormal half: normalize the mantissa into a float's implicit-one form. */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float sl_model_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void sl_model_row_to_f32(enum sl_dtype t, const void *row, float *out, int cols)
{
    struct sl_mat m = {t, row, 1, cols};
    sl_cpu_mat_row(out, &m, 0);
}

/* Alignment a kernel may assume for a row of type t. Q8_0 blocks are 34 bytes (Q4_0's 18, Q6_K's
 * 210), so their fp16 scales are only ever 2-aligned. */
static uintptr_t type_align(enum sl_dtype t)
{
    return t == SL_DTYPE_F32 ? 4 : 2;
}

struct sl_mat sl_model_mat_place(struct sl_model *m, enum sl_dtype t, const void *data, int rows,
                                 int cols)
{
    if ((uintptr_t)data % type_align(t) != 0) {
        /* Only formats with an odd alignment get here; the copy keeps kernels free of
         * unaligned loads. */
        size_t n = (size_t)rows * sl_dtype_row_bytes(t, cols);
        void *copy = sl_model_own(m, sl_xmalloc(n ? n : 1));
        memcpy(copy, data, n);
        data = copy;
    }
    return (struct sl_mat){t, data, rows, cols};
}

const float *sl_model_norm_f32(struct sl_model *m, enum sl_dtype t, const void *data, int n)
{
    if (t == SL_DTYPE_F32 && (uintptr_t)data % 4 == 0)
        return data;
    float *out = sl_model_own(m, sl_xmalloc((size_t)n * sizeof(float)));
    sl_model_row_to_f32(t, data, out, n);
    return out;
}
