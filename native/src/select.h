// topk for generated kernels (select.cpp). Each routine writes the indices of the first k
// elements of the row x[0], x[stride], ..., x[(n - 1) * stride] to out[0], out[out_stride], ...:
// the largest first (with CUVIL_TOPK_LARGEST in `mode`, else the smallest), NaN above every number,
// equal values by index (torch.sort's stable order) or, with CUVIL_TOPK_TORCH_ORDER, in the order
// torch.topk's CPU kernel leaves them; CUVIL_TOPK_UNSORTED is torch.topk(sorted=False)'s order, and
// with CUVIL_TOPK_KTHVALUE only out[0], the index of the k-th smallest that torch.kthvalue picks.
// Rows are independent: callers run them on any thread.
#pragma once

#include <cstdint>

enum : int32_t { CUVIL_TOPK_LARGEST = 1, CUVIL_TOPK_TORCH_ORDER = 2, CUVIL_TOPK_UNSORTED = 4, CUVIL_TOPK_KTHVALUE = 8 };

extern "C" {
void cuvil_topk_f32(const void* x, int64_t n, int64_t stride, int64_t k, int32_t mode, int64_t* out,
                    int64_t out_stride);
void cuvil_topk_i64(const void* x, int64_t n, int64_t stride, int64_t k, int32_t mode, int64_t* out,
                    int64_t out_stride);
void cuvil_topk_i32(const void* x, int64_t n, int64_t stride, int64_t k, int32_t mode, int64_t* out,
                    int64_t out_stride);
void cuvil_topk_i8(const void* x, int64_t n, int64_t stride, int64_t k, int32_t mode, int64_t* out,
                   int64_t out_stride);
}
