// The fused q/k-norm + RoPE + KV-write kernel (gpu::QkPrep) against the CPU references
// (RmsNorm per head, RopeNeox) and the cache's element conversion: every activation dtype,
// every KV element type, head_dim 64 and 128, with and without the norms and RoPE, tokens at
// ragged positions written to shuffled cache slots. Poisoned cache slots that no token owns
// must stay poisoned. Labelled `gpu`; exits 77 (SKIPPED) where no CUDA device is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/gpu_ops.h"
#include "tests/kernels/gpu_test_util.h"

namespace moeshard {
namespace {

using gpu::ActDType;
using gpu::KvElem;

template <typename T>
struct Buf {
  explicit Buf(const std::vector<T>& h) : n(h.size()) {
    cudaMalloc(&p, std::max<size_t>(1, n * sizeof(T)));
    cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~Buf() { cudaFree(p); }
  std::vector<T> Host() const {
    std::vector<T> h(n);
    cudaDeviceSynchronize();
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  T* p = nullptr;
  size_t n;
};

float Fp8ToF32(uint8_t v) {
  const uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9) : std::ldexp(1.f + man / 8.f, static_cast<int>(exp) - 7);
  return sign ? -mag : mag;
}

struct Case {
  ActDType act;
  KvElem elem;
  int64_t hd;
  bool norm, rope;
};

class QkPrepTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {  // skips where no CUDA device is present (gpu_test_main then exits 77)
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(QkPrepTest, MatchesNormRopeAndCacheWrite) {
  const Case c = GetParam();
  const int64_t T = 5, nq = 6, nkv = 2, hd = c.hd, bs = 4, blocks = 6, slots = bs * blocks;
  std::mt19937 rng(static_cast<uint32_t>(hd + 3 * static_cast<int>(c.elem)));
  std::normal_distribution<float> d(0.f, 1.f);
  auto randn = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    if (c.act == ActDType::kBF16) {
      for (auto& x : v) x = Bf16ToF32(F32ToBf16(x));
    }
    return v;
  };
  std::vector<float> q = randn(T * nq * hd), k = randn(T * nkv * hd), v = randn(T * nkv * hd);
  std::vector<float> qn(hd), kn(hd);
  for (auto& x : qn) x = 1.f + 0.3f * d(rng);
  for (auto& x : kn) x = 1.f + 0.3f * d(rng);
  const std::vector<int32_t> pos = {0, 17, 3, 4095, 100000};
  const std::vector<int32_t> slot = {9, 2, 23, 14, 5};
  auto dev_act = [&](const std::vector<float>& h) {
    std::vector<uint8_t> bytes;
    if (c.act == ActDType::kF32) {
      bytes.resize(h.size() * 4);
      std::memcpy(bytes.data(), h.data(), bytes.size());
    } else {
      bytes.resize(h.size() * 2);
      for (size_t i = 0; i < h.size(); ++i) {
        const uint16_t b = F32ToBf16(h[i]);
        std::memcpy(bytes.data() + 2 * i, &b, 2);
      }
    }
    return Buf<uint8_t>(bytes);
  };
  Buf<uint8_t> dq = dev_act(q), dk = dev_act(k), dv = dev_act(v);
  Buf<float> dqn(qn), dkn(kn);
  Buf<int32_t> dpos(pos), dslot(slot);
  const size_t esz = c.elem == KvElem::kF32 ? 4 : c.elem == KvElem::kBF16 ? 2 : 1;
  Buf<uint8_t> kc(std::vector<uint8_t>(slots * nkv * hd * esz, 0xee)), vc(std::vector<uint8_t>(slots * nkv * hd * esz, 0xee));
  Buf<float> ks(std::vector<float>(slots * nkv, -1.f)), vs(std::vector<float>(slots * nkv, -1.f));
  gpu::QkPrepParams p;
  p.q = dq.p;
  p.k = dk.p;
  p.v = dv.p;
  p.dtype = c.act;
  p.num_tokens = T;
  p.num_heads = nq;
  p.q_norm = c.norm ? dqn.p : nullptr;
  p.k_norm = c.norm ? dkn.p : nullptr;
  p.eps = 1e-6f;
  p.rope = c.rope;
  p.pos = dpos.p;
  p.theta = 1e6;
  p.slots = dslot.p;
  p.cache = {kc.p, vc.p, ks.p, vs.p, c.elem, bs, nkv, hd};
  STATUS_OK(gpu::QkPrep(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<float> qr = q, kr = k;
  if (c.norm) {
    for (int64_t r = 0; r < T * nq; ++r) RmsNorm(qr.data() + r * hd, 1, hd, qn.data(), 1e-6f, qr.data() + r * hd);
    for (int64_t r = 0; r < T * nkv; ++r) RmsNorm(kr.data() + r * hd, 1, hd, kn.data(), 1e-6f, kr.data() + r * hd);
  }
  if (c.rope) {
    RopeNeox(qr.data(), T, nq, hd, pos.data(), 1e6);
    RopeNeox(kr.data(), T, nkv, hd, pos.data(), 1e6);
  }
  const double act_tol = c.act == ActDType::kF32 ? 1e-5 : 8e-3;
  auto qb = dq.Host();
  for (int64_t i = 0; i < T * nq * hd; ++i) {
    float got;
    if (c.act == ActDType::kF32) {
      std::memcpy(&got, qb.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, qb.data() + 2 * i, 2);
      got = Bf16ToF32(b);
    }
    ASSERT_NEAR(got, qr[i], act_tol * std::max(1.f, std::fabs(qr[i]))) << "q element " << i;
  }
  auto kb = kc.Host(), vb = vc.Host();
  auto ksh = ks.Host(), vsh = vs.Host();
  for (int which = 0; which < 2; ++which) {
    const auto& bytes = which ? vb : kb;
    const auto& sc = which ? vsh : ksh;
    const auto& ref = which ? v : kr;
    for (int64_t s = 0; s < slots; ++s) {
      const auto owner = std::find(slot.begin(), slot.end(), s);
      for (int64_t h = 0; h < nkv; ++h) {
        for (int64_t e = 0; e < hd; ++e) {
          const size_t at = (s * nkv + h) * hd + e;
          if (owner == slot.end()) {
            ASSERT_EQ(bytes[at * esz], 0xee) << "slot " << s << " written by no token";
            continue;
          }
          const int64_t t = owner - slot.begin();
          const float want = ref[(t * nkv + h) * hd + e];
          float got;
          double tol;
          if (c.elem == KvElem::kF32) {
            std::memcpy(&got, bytes.data() + at * 4, 4);
            tol = act_tol;
          } else if (c.elem == KvElem::kBF16) {
            uint16_t b;
            std::memcpy(&b, bytes.data() + at * 2, 2);
            got = Bf16ToF32(b);
            tol = 8e-3;
          } else {
            got = Fp8ToF32(bytes[at]) * sc[s * nkv + h];
            tol = 7e-2;
          }
          ASSERT_NEAR(got, want, tol * std::max(1.f, std::fabs(want))) << (which ? "v" : "k") << " slot " << s << " head " << h << " elem " << e;
        }
      }
    }
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> v;
  for (ActDType a : {ActDType::kF32, ActDType::kBF16}) {
    for (KvElem e : {KvElem::kF32, KvElem::kBF16, KvElem::kFp8E4M3}) {
      for (int64_t hd : {64, 128}) {
        for (int f = 0; f < 4; ++f) v.push_back({a, e, hd, (f & 1) != 0, (f & 2) != 0});
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, QkPrepTest, ::testing::ValuesIn(AllCases()));

}  // namespace
}  // namespace moeshard
