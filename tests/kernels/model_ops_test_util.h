// Shared by the op-consistency tests of one binary (model_ops_test.cc: norms, RoPE, residuals,
// projections, routing, embedding; attention_ops_test.cc: paged attention and the FP8 prefill
// copy): device buffers, bf16 rounding, the error measure and the fixture, parameterized by the
// activation dtype (fp32: 2e-6 relative; bf16: 1e-2). The fixture skips where no CUDA device is.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/gpu_params.h"

namespace moeshard::ops_test {

using gpu::ActDType;

// Device copy of a host vector, freed on scope exit.
template <typename T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& h) : n_(h.size()) {
    cudaMalloc(&p_, std::max<size_t>(1, n_ * sizeof(T)));
    if (n_) cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  explicit Dev(size_t n) : Dev(std::vector<T>(n)) {}
  ~Dev() { cudaFree(p_); }
  T* get() const { return p_; }
  std::vector<T> Host() const {
    std::vector<T> h(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

inline std::vector<float> Randn(size_t n, std::mt19937& rng, float sd = 1.f) {
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = F32ToBf16(v[i]);
  return o;
}
inline std::vector<float> FromBf16(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = Bf16ToF32(v[i]);
  return o;
}
inline std::vector<float> RoundBf16(const std::vector<float>& v) { return FromBf16(ToBf16(v)); }

// max |a - b| / max(1, max |b|): the error relative to the output's scale.
inline double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 1, e = 0;
  for (float x : b) m = std::max<double>(m, std::fabs(x));
  for (size_t i = 0; i < a.size(); ++i) e = std::max<double>(e, std::fabs(a[i] - b[i]));
  return a.size() == b.size() ? e / m : 1e30;
}

class ModelOpsTest : public ::testing::TestWithParam<ActDType> {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  }
  bool bf16() const { return GetParam() == ActDType::kBF16; }
  double tol() const { return bf16() ? 1e-2 : 2e-6; }
  // Activations of the test's dtype on the device, and the values the reference sees.
  struct Act {
    std::unique_ptr<Dev<float>> f;
    std::unique_ptr<Dev<uint16_t>> b;
    std::vector<float> ref;
    void* get() const { return f ? static_cast<void*>(f->get()) : static_cast<void*>(b->get()); }
    std::vector<float> Host() const { return f ? f->Host() : FromBf16(b->Host()); }
  };
  Act MakeAct(const std::vector<float>& v) const {
    Act a;
    if (bf16()) {
      a.b = std::make_unique<Dev<uint16_t>>(ToBf16(v));
      a.ref = RoundBf16(v);
    } else {
      a.f = std::make_unique<Dev<float>>(v);
      a.ref = v;
    }
    return a;
  }
  std::mt19937 rng_{1234};
};

}  // namespace moeshard::ops_test
