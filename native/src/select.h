// topk for generated kernels (select.cpp). Each routine writes the indices of the first k
// elements of the row x[0], x[stride], ..., x[(n - 1) * stride] in torch.topk's order (the
// largest first, or with largest == 0 the smallest; NaN above every number; equal values by
// index) to out[0], out[out_stride], ... Rows are independent: callers run them on any thread.
#pragma once

#include <cstdint>

extern "C" {
void cuvil_topk_f32(const void* x, int64_t n, int64_t stride, int64_t k, int32_t largest, int64_t* out,
                    int64_t out_stride);
void cuvil_topk_i64(const void* x, int64_t n, int64_t stride, int64_t k, int32_t largest, int64_t* out,
                    int64_t out_stride);
void cuvil_topk_i32(const void* x, int64_t n, int64_t stride, int64_t k, int32_t largest, int64_t* out,
                    int64_t out_stride);
void cuvil_topk_i8(const void* x, int64_t n, int64_t stride, int64_t k, int32_t largest, int64_t* out,
                   int64_t out_stride);
}
