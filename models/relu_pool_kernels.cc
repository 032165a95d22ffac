#include "models/relu_pool_kernels.h"

#include <algorithm>
#include <cstring>

namespace cleave::kernels {

#if defined(__x86_64__)
#define CLEAVE_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLEAVE_CLONES
#endif

CLEAVE_CLONES void ReluMaxPool2x2(const float* in, int64_t planes, int64_t h, int64_t w,
                                  float* out, int32_t* winner) {
  const int64_t oh = h / 2, ow = w / 2;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < oh; ++i) {
      const float* r0 = in + (p * h + 2 * i) * w;
      const float* r1 = r0 + w;
      for (int64_t j = 0; j < ow; ++j) {
        const float a = r0[2 * j], b = r0[2 * j + 1], c = r1[2 * j], d = r1[2 * j + 1];
        const float m = std::max(std::max(std::max(a, b), std::max(c, d)), 0.f);
        out[j] = m;
        // The first element equal to the maximum won, none (4) if it is not above 0;
        // in arithmetic rather than branches, which mispredict on random signs.
        const int first = (a != m) * (1 + (b != m) * (1 + (c != m)));
        const int none = !(m > 0);
        winner[j] = first + none * (4 - first);
      }
      out += ow;
      winner += ow;
    }
  }
}

void ReluMaxPool2x2Grad(const float* grad_out, const int32_t* winner, int64_t planes, int64_t h,
                        int64_t w, float* grad_in) {
  const int64_t oh = h / 2, ow = w / 2;
  // Rows and columns no window covers (odd sizes) get no gradient.
  if ((h | w) & 1) std::memset(grad_in, 0, planes * h * w * sizeof(float));
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < oh; ++i) {
      float* r0 = grad_in + (p * h + 2 * i) * w;
      float* r1 = r0 + w;
      for (int64_t j = 0; j < ow; ++j) {
        // Each window's four gradients, selected by masks rather than branches.
        uint32_t v;
        std::memcpy(&v, &grad_out[j], sizeof v);
        const uint32_t k = static_cast<uint32_t>(winner[j]);
        const uint32_t q[4] = {v & (0u - (k == 0)), v & (0u - (k == 1)), v & (0u - (k == 2)),
                               v & (0u - (k == 3))};
        std::memcpy(&r0[2 * j], &q[0], 2 * sizeof(float));
        std::memcpy(&r1[2 * j], &q[2], 2 * sizeof(float));
      }
      grad_out += ow;
      winner += ow;
    }
  }
}

CLEAVE_CLONES void ReluGrad(const float* out, int64_t n, float* grad) {
  for (int64_t i = 0; i < n; ++i) grad[i] = out[i] > 0 ? grad[i] : 0.f;
}

}  // namespace cleave::kernels
