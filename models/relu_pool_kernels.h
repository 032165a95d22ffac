// ReLU's and the fused ReLU + 2x2 max-pool's loops on raw arrays (no LibTorch: compiled with -O3
// and, on x86-64, also for AVX2).
#pragma once

#include <cstdint>

namespace cleave::kernels {

// out[p][i][j] = max(0, the 2x2 window at (2i, 2j) of plane p) for `planes` planes of
// h x w (odd sizes floor); winner names the window element that won (0..3, row-major)
// or 4 when none was above zero. Ties go to the first. (int32 rather than a byte: GCC
// then vectorises the loop with the floats.)
void ReluMaxPool2x2(const float* in, int64_t planes, int64_t h, int64_t w, float* out,
                    int32_t* winner);

// The input's gradient: each window's winner gets the output's gradient, the rest 0.
void ReluMaxPool2x2Grad(const float* grad_out, const int32_t* winner, int64_t planes, int64_t h,
                        int64_t w, float* grad_in);

// ReLU's gradient in place: grad[i] = 0 where out[i] (ReLU's output) is not above 0.
void ReluGrad(const float* out, int64_t n, float* grad);

}  // namespace cleave::kernels
