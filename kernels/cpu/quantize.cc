#include "kernels/cpu/quantize.h"

#include <cmath>

#include "common/dtype.h"

namespace moeshard {

Nvfp4Matrix QuantizeNvfp4(const float* w, int64_t rows, int64_t cols) {
  Nvfp4Matrix q;
  q.packed.assign(rows * cols / 2, 0);
  q.scale.assign(rows * cols / 16, 0);
  double amax = 0;
  for (int64_t i = 0; i < rows * cols; ++i) amax = std::max(amax, std::fabs(static_cast<double>(w[i])));
  amax = std::max(amax, 1e-12);
  q.scale2 = static_cast<float>(amax / (6.0 * 448.0));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 16; ++b) {
      const float* blk = w + r * cols + b * 16;
      double bmax = 0;
      for (int i = 0; i < 16; ++i) bmax = std::max(bmax, std::fabs(static_cast<double>(blk[i])));
      double sc = std::min(bmax / 6.0 / q.scale2, 448.0);
      uint8_t s8 = F32ToE4M3(static_cast<float>(sc));
      q.scale[r * (cols / 16) + b] = s8;
      double s = static_cast<double>(E4M3ToF32(s8)) * q.scale2;
      if (s == 0) s = 1;
      for (int i = 0; i < 16; ++i) {
        double v = blk[i] / s, a = std::fabs(v);
        int best = 0;
        double bd = INFINITY;
        for (int c = 0; c < 8; ++c) {
          double d = std::fabs(a - kE2M1Values[c]);
          if (d < bd) { bd = d; best = c; }
        }
        uint8_t code = static_cast<uint8_t>(best + (v < 0 && best != 0 ? 8 : 0));
        int64_t col = b * 16 + i;
        uint8_t& byte = q.packed[r * (cols / 2) + col / 2];
        byte |= (col & 1) ? static_cast<uint8_t>(code << 4) : code;
      }
    }
  }
  return q;
}

}  // namespace moeshard
