// Op-consistency harness: every CUDA op against its CPU reference (kernels/cpu), in the
// spirit of llama.cpp's test-backend-ops. Weight expansion must match DequantRow bit for
// bit in fp32 (and its bf16 rounding); MatMul must match the CPU MatMul within 1e-5 of
// Σ|x·w| per output with fp32 activations, and within bf16 rounding with bf16 activations.
// A last case prints FLOPs, bytes and achieved GB/s for one large shape (no timed asserts).
// Labelled `gpu`; skips where no CUDA device is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/cuda_check.h"
#include "tests/kernels/gpu_test_util.h"
#include "kernels/cuda/gpu_ops.h"

namespace moeshard {
namespace {

using gpu::ActDType;


constexpr auto& kFormats = testing_gpu::kAllFormats;

// Device memory owned for one test; freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { err_ = cudaMalloc(&ptr_, bytes ? bytes : 1); }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  cudaError_t err() const { return err_; }
  template <typename T = void> T* get() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaError_t err_;
};

// A weight matrix [rows, stored_cols] in its stored bytes on the host, rows padded apart.
struct HostWeight {
  WeightFormat format;
  int64_t rows = 0, cols = 0, row_stride_bytes = 0, scale_row_stride = 0;
  std::vector<uint8_t> data, scale;
  float scale2 = 1.f;
  WeightRef Ref(const uint8_t* d, const uint8_t* s) const {
    WeightRef w;
    w.format = format;
    w.rows = rows;
    w.cols = cols;
    w.data = d;
    w.row_stride_bytes = row_stride_bytes;
    w.scale = s;
    w.scale_row_stride = scale_row_stride;
    w.scale2 = scale2;
    return w;
  }
  WeightRef HostRef() const { return Ref(data.data(), scale.empty() ? nullptr : scale.data()); }
};

// `wide`: every byte random (all codes: NaN, inf, subnormal scales), for the bit-exact
// expansion; otherwise values of a trained layer's size, for the matmul. cols % 32 == 0.
HostWeight MakeHarnessWeight(WeightFormat f, int64_t rows, int64_t cols, bool wide, std::mt19937& rng) {
  HostWeight h;
  h.format = f;
  h.rows = rows;
  h.cols = cols;
  h.row_stride_bytes = WeightRowBytes(f, cols) + 16;  // padding keeps every element aligned
  h.data.resize(rows * h.row_stride_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uni(0.001f, 0.02f);
  if (wide && f != WeightFormat::kNVFP4) {
    for (auto& b : h.data) b = static_cast<uint8_t>(byte(rng));
    return h;
  }
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = h.data.data() + r * h.row_stride_bytes;
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(rng) * 0.05f;
      uint16_t b16;
      switch (f) {
        case WeightFormat::kF32: std::memcpy(row + c * 4, &v, 4); break;
        case WeightFormat::kBF16: b16 = F32ToBf16(v); std::memcpy(row + c * 2, &b16, 2); break;
        case WeightFormat::kF16: b16 = F32ToF16(v); std::memcpy(row + c * 2, &b16, 2); break;
        default: break;
      }
    }
    for (int64_t blk = 0; blk < cols / 32; ++blk) {
      if (f == WeightFormat::kQ8_0) {
        uint8_t* b = row + blk * 34;
        uint16_t d = F32ToF16(uni(rng));
        std::memcpy(b, &d, 2);
        for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(byte(rng));
      } else if (f == WeightFormat::kMXFP4) {
        uint8_t* b = row + blk * 17;
        b[0] = static_cast<uint8_t>(120 + byte(rng) % 8);
        for (int i = 0; i < 16; ++i) b[1 + i] = static_cast<uint8_t>(byte(rng));
      }
    }
  }
  if (f == WeightFormat::kNVFP4) {
    std::vector<float> w(rows * cols);
    for (auto& v : w) v = normal(rng) * 0.05f;
    Nvfp4Matrix q = QuantizeNvfp4(w.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(h.data.data() + r * h.row_stride_bytes, q.packed.data() + r * cols / 2, cols / 2);
    }
    h.scale = std::move(q.scale);
    h.scale_row_stride = cols / 16;
    h.scale2 = q.scale2;
    if (wide) {  // every e4m3 code and every nibble, NaN included
      for (auto& b : h.data) b = static_cast<uint8_t>(byte(rng));
      for (auto& b : h.scale) b = static_cast<uint8_t>(byte(rng));
      h.scale2 = 1.7f;
    }
  }
  return h;
}

// The weight's bytes on the device and the matching device view.
struct DeviceWeight {
  DeviceBuffer data, scale;
  WeightRef ref;
  explicit DeviceWeight(const HostWeight& h)
      : data(h.data.size()), scale(h.scale.size()) {
    cudaMemcpy(data.get(), h.data.data(), h.data.size(), cudaMemcpyHostToDevice);
    if (!h.scale.empty()) cudaMemcpy(scale.get(), h.scale.data(), h.scale.size(), cudaMemcpyHostToDevice);
    ref = h.Ref(data.get<uint8_t>(), h.scale.empty() ? nullptr : scale.get<uint8_t>());
  }
};

// Applies the same row/column window to a host and a device view.
WeightRef Window(WeightRef w, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  return w.RowSlice(r0, nr).ColSlice(c0, nc);
}

class OpHarnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(OpHarnessTest, ExpandMatchesDequantRowBitExact) {
  std::mt19937 rng(7);
  for (WeightFormat f : kFormats) {
    SCOPED_TRACE(WeightFormatName(f));
    HostWeight h = MakeHarnessWeight(f, 40, 320, /*wide=*/true, rng);
    DeviceWeight d(h);
    CUDA_OK(d.data.err());
    // The whole matrix, and a window whose columns start and end inside blocks.
    struct { int64_t r0, nr, c0, nc; } windows[] = {{0, 40, 0, 320}, {3, 30, 48, 221}};
    for (auto win : windows) {
      WeightRef hw = Window(h.HostRef(), win.r0, win.nr, win.c0, win.nc);
      WeightRef dw = Window(d.ref, win.r0, win.nr, win.c0, win.nc);
      std::vector<float> want(hw.rows * hw.cols);
      for (int64_t r = 0; r < hw.rows; ++r) DequantRow(hw, r, want.data() + r * hw.cols);
      DeviceBuffer out32(want.size() * 4), out16(want.size() * 2);
      STATUS_OK(gpu::ExpandWeights({dw, out32.get(), 0, ActDType::kF32}, nullptr));
      STATUS_OK(gpu::ExpandWeights({dw, out16.get(), 0, ActDType::kBF16}, nullptr));
      std::vector<uint32_t> got32(want.size());
      std::vector<uint16_t> got16(want.size());
      CUDA_OK(cudaMemcpy(got32.data(), out32.get(), got32.size() * 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(got16.data(), out16.get(), got16.size() * 2, cudaMemcpyDeviceToHost));
      int64_t bad = 0, nans = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        uint32_t wbits;
        std::memcpy(&wbits, &want[i], 4);
        // NaN payloads are the host ISA's choice (x86 keeps an operand's payload, the GPU
        // writes its canonical 0x7fffffff), so a NaN matches any NaN; all else bit for bit.
        float g;
        std::memcpy(&g, &got32[i], 4);
        if (std::isnan(want[i])) {
          if (!std::isnan(g) || !std::isnan(Bf16ToF32(got16[i]))) ++bad;
          ++nans;
          continue;
        }
        if (got32[i] != wbits || got16[i] != F32ToBf16(want[i])) {
          if (bad++ < 5) {
            ADD_FAILURE() << "element " << i << " (row " << i / hw.cols << ", col " << i % hw.cols
                          << "): cpu bits 0x" << std::hex << wbits << " gpu 0x" << got32[i]
                          << " gpu bf16 0x" << got16[i] << std::dec;
          }
        }
      }
      EXPECT_EQ(bad, 0) << "mismatches in window c0=" << win.c0;
      std::printf("  expand %-5s window c0=%-3ld: %zu elements match: finite bit-exact, %ld NaN as NaN\n",
                  WeightFormatName(f), long(win.c0), want.size(), long(nans));
    }
  }
}

// y = x · Wᵀ + bias on the GPU against kernels/cpu MatMul on the same (bf16-rounded) x.
void CheckMatMul(WeightFormat f, ActDType act, std::mt19937& rng) {
  const int64_t T = 37, rows = 100, stored_cols = 320, c0 = 32, K = 256;
  HostWeight h = MakeHarnessWeight(f, rows, stored_cols, /*wide=*/false, rng);
  DeviceWeight d(h);
  CUDA_OK(d.data.err());
  WeightRef hw = Window(h.HostRef(), 0, rows, c0, K), dw = Window(d.ref, 0, rows, c0, K);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(T * K), bias(rows), want(T * rows);
  for (auto& v : x) v = act == ActDType::kBF16 ? Bf16ToF32(F32ToBf16(normal(rng))) : normal(rng);
  for (auto& v : bias) v = normal(rng) * 0.1f;
  MatMul(x.data(), T, hw, want.data(), bias.data());

  const size_t act_bytes = act == ActDType::kF32 ? 4 : 2;
  std::vector<uint8_t> xdev(T * K * act_bytes);
  for (int64_t i = 0; i < T * K; ++i) {
    if (act == ActDType::kF32) {
      std::memcpy(xdev.data() + i * 4, &x[i], 4);
    } else {
      uint16_t b = F32ToBf16(x[i]);
      std::memcpy(xdev.data() + i * 2, &b, 2);
    }
  }
  DeviceBuffer dx(xdev.size()), dy(T * rows * act_bytes), dbias(rows * 4);
  CUDA_OK(cudaMemcpy(dx.get(), xdev.data(), xdev.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dbias.get(), bias.data(), rows * 4, cudaMemcpyHostToDevice));
  gpu::MatMulParams p;
  p.w = dw;
  p.x = dx.get();
  p.y = dy.get();
  p.num_tokens = T;
  p.act_dtype = act;
  p.bias = dbias.get<float>();
  STATUS_OK(gpu::MatMul(p, nullptr));
  std::vector<uint8_t> ydev(T * rows * act_bytes);
  CUDA_OK(cudaMemcpy(ydev.data(), dy.get(), ydev.size(), cudaMemcpyDeviceToHost));

  // Σ|x·w| bounds the reordering error of an fp32 dot product.
  std::vector<float> wrows(rows * K);
  for (int64_t r = 0; r < rows; ++r) DequantRow(hw, r, wrows.data() + r * K);
  int64_t bad = 0;
  double max_rel = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double mag = std::fabs(bias[r]);
      for (int64_t k = 0; k < K; ++k) mag += std::fabs(x[t * K + k] * wrows[r * K + k]);
      float g;
      if (act == ActDType::kF32) {
        std::memcpy(&g, ydev.data() + (t * rows + r) * 4, 4);
      } else {
        uint16_t b;
        std::memcpy(&b, ydev.data() + (t * rows + r) * 2, 2);
        g = Bf16ToF32(b);
      }
      const float c = want[t * rows + r];
      double tol = 1e-5 * mag + (act == ActDType::kBF16 ? std::ldexp(std::fabs(c), -8) : 0.0);
      double err = std::fabs(static_cast<double>(g) - c);
      max_rel = std::max(max_rel, err / (mag + 1e-30));
      if (!(err <= tol) && bad++ < 5) {
        ADD_FAILURE() << "y[" << t << "," << r << "]: gpu " << g << " cpu " << c << " tol " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  std::printf("  matmul %-5s act=%s  max |gpu-cpu|/sum|x*w| = %.3g\n", WeightFormatName(f),
              act == ActDType::kF32 ? "f32 " : "bf16", max_rel);
}

TEST_F(OpHarnessTest, MatMulMatchesCpu) {
  std::mt19937 rng(11);
  for (WeightFormat f : kFormats) {
    for (ActDType act : {ActDType::kF32, ActDType::kBF16}) {
      SCOPED_TRACE(std::string(WeightFormatName(f)) + (act == ActDType::kF32 ? " f32" : " bf16"));
      CheckMatMul(f, act, rng);
    }
  }
}

// Needs no device: validation fails before any CUDA call.
TEST(OpHarnessNoDeviceTest, RejectsBadParams) {
  gpu::MatMulParams p;  // empty weight view
  EXPECT_EQ(gpu::MatMul(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu::CudaStatus(cudaErrorInvalidValue, "cudaMemcpy(x)").message().substr(0, 12),
            "cudaMemcpy(x");
}

// Prints FLOPs, bytes and achieved bandwidth of one large, decode-like shape per format,
// against the measured device-to-device copy bandwidth. Informational only.
TEST_F(OpHarnessTest, ReportThroughput) {
  const int64_t T = 32, N = 14336, K = 4096;
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  auto time_ms = [&](auto&& fn, int iters) {
    fn();
    cudaEventRecord(e0);
    for (int i = 0; i < iters; ++i) fn();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms / iters;
  };
  {
    const size_t bytes = size_t{2} << 30;
    DeviceBuffer a(bytes), b(bytes);
    CUDA_OK(a.err());
    CUDA_OK(b.err());
    float ms = time_ms([&] { cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice); }, 5);
    std::printf("  d2d copy: %.0f GB/s (read + write)\n", 2.0 * bytes / ms / 1e6);
  }
  std::mt19937 rng(3);
  DeviceBuffer x(T * K * 2), y(T * N * 2);
  CUDA_OK(cudaMemset(x.get(), 0x3c, T * K * 2));  // bf16 ~0.0115
  for (WeightFormat f : kFormats) {
    HostWeight h = MakeHarnessWeight(f, N, K, /*wide=*/true, rng);
    if (f == WeightFormat::kBF16 || f == WeightFormat::kF16 || f == WeightFormat::kF32) {
      std::fill(h.data.begin(), h.data.end(), 0x3c);  // finite values for a fair timing
    }
    DeviceWeight d(h);
    CUDA_OK(d.data.err());
    gpu::MatMulParams p;
    p.w = d.ref;
    p.x = x.get();
    p.y = y.get();
    p.num_tokens = T;
    p.act_dtype = ActDType::kBF16;
    STATUS_OK(gpu::MatMul(p, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    float ms = time_ms([&] { (void)gpu::MatMul(p, nullptr); }, 10);
    CUDA_OK(cudaGetLastError());
    const double flops = 2.0 * T * N * K;
    const double bytes = double(h.data.size() + h.scale.size()) + T * K * 2 + T * N * 2;
    std::printf("  matmul %-5s T=%ld N=%ld K=%ld act=bf16: %.3f ms, %.2f GFLOP, %.1f MB, "
                "%.0f GB/s, %.2f TFLOP/s\n",
                WeightFormatName(f), long(T), long(N), long(K), ms, flops / 1e9, bytes / 1e6,
                bytes / ms / 1e6, flops / ms / 1e9);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace moeshard
