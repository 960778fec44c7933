// The fused q/k-norm + RoPE + KV-write kernel (gpu::QkPrep) against the CPU references
// (RmsNorm per head, RopeNeox) and the cache's element conversion: every activation dtype,
// every KV element type, head_dim 64 and 128, with and without the norms and RoPE, tokens at
// ragged positions written to shuffled cache slots. Poisoned cache slots that no token owns
// must stay poisoned. The fused decode attention (gpu::AttentionDecodeFused: QkPrep's work
// inside the decode launch, splits merged in a cluster) against QkPrep + the split-decode
// attention: the same cache bytes, the same outputs within bf16 rounding of the merge order.
// Labelled `gpu`; exits 77 (SKIPPED) where no CUDA device is present.
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
  int64_t tokens = 5;  // 256 or more: QkPrep's one-block-a-token grid
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
  const int64_t T = c.tokens, nq = 6, nkv = 2, hd = c.hd, bs = 4, blocks = (T + 19) / bs + 1, slots = bs * blocks;
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
  std::vector<int32_t> pos = {0, 17, 3, 4095, 100000};
  std::vector<int32_t> slot = {9, 2, 23, 14, 5};
  if (T != 5) {  // scattered positions, slots in reverse with the lowest ones left unwritten
    pos.clear();
    slot.clear();
    for (int64_t t = 0; t < T; ++t) {
      pos.push_back(static_cast<int32_t>((t * 7919) % 200000));
      slot.push_back(static_cast<int32_t>(slots - 1 - t));
    }
  }
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

struct FusedCase {
  KvElem elem;
  int64_t hd, nq, nkv, window;
  bool norm, rope;
};

class FusedDecodeTest : public ::testing::TestWithParam<FusedCase> {
 protected:
  void SetUp() override {
    int n = 0, dev = 0, major = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (major < 9) GTEST_SKIP() << "thread-block clusters need compute capability 9.0";
  }
};

TEST_P(FusedDecodeTest, EqualsQkPrepThenSplitDecode) {
  const FusedCase c = GetParam();
  const int64_t hd = c.hd, nq = c.nq, nkv = c.nkv, bs = 16, blocks = 256;  // the five tables take 239
  // One token each, the last of its sequence. The new key lands in the first 64-key chunk of its
  // split (0, 36, 700), the second (1000: both staged before the loop) or a later one (2047:
  // staged inside the loop).
  const std::vector<int32_t> pos = {0, 36, 700, 1000, 2047};
  const int64_t T = static_cast<int64_t>(pos.size());
  std::mt19937 rng(static_cast<uint32_t>(hd * 7 + nq + static_cast<int>(c.elem) + c.window));
  std::normal_distribution<float> d(0.f, 1.f);
  auto bf16 = [&](size_t n, float sd) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = F32ToBf16(sd * d(rng));
    return v;
  };
  // Each sequence's table: shuffled distinct blocks; its slot: the last position's.
  std::vector<int32_t> perm(blocks);
  for (int32_t i = 0; i < blocks; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables, toff, slot;
  int64_t used = 0;
  for (int32_t p : pos) {
    toff.push_back(static_cast<int32_t>(tables.size()));
    const int64_t nb = p / bs + 1;
    for (int64_t b = 0; b < nb; ++b) tables.push_back(perm[used + b]);
    slot.push_back(tables[toff.back() + p / bs] * bs + p % bs);
    used += nb;
  }
  ASSERT_LE(used, blocks);
  const size_t esz = c.elem == KvElem::kBF16 ? 2 : 1, cells = blocks * bs * nkv * hd;
  std::vector<uint8_t> kbytes(cells * esz), vbytes(cells * esz);
  if (c.elem == KvElem::kBF16) {
    auto kk = bf16(cells, 1.f), vv = bf16(cells, 1.f);
    std::memcpy(kbytes.data(), kk.data(), kbytes.size());
    std::memcpy(vbytes.data(), vv.data(), vbytes.size());
  } else {
    for (auto* b : {&kbytes, &vbytes}) {
      for (auto& x : *b) x = static_cast<uint8_t>(rng() % 0x7e) | (rng() % 2 ? 0x80 : 0);  // finite e4m3
    }
  }
  std::vector<float> scales(blocks * bs * nkv);
  for (auto& x : scales) x = 0.01f + 0.02f * std::fabs(d(rng));
  auto q = bf16(T * nq * hd, 1.f), k = bf16(T * nkv * hd, 1.f), v = bf16(T * nkv * hd, 1.f);
  std::vector<float> qn(hd), kn(hd);
  for (auto& x : qn) x = 1.f + 0.3f * d(rng);
  for (auto& x : kn) x = 1.f + 0.3f * d(rng);
  Buf<uint16_t> dk(k), dv(v), dq_a(q), dq_b(q), out_a(std::vector<uint16_t>(T * nq * hd)), out_b(std::vector<uint16_t>(T * nq * hd));
  Buf<float> dqn(qn), dkn(kn);
  Buf<int32_t> dpos(pos), dslot(slot), dtables(tables), dtoff(toff);
  Buf<uint8_t> kc_a(kbytes), vc_a(vbytes), kc_b(kbytes), vc_b(vbytes);
  Buf<float> ks_a(scales), vs_a(scales), ks_b(scales), vs_b(scales);
  Buf<uint8_t> ws(std::vector<uint8_t>(static_cast<size_t>(gpu::AttentionWorkspaceBytes(T, nq, hd, 64))));
  auto params = [&](Buf<uint16_t>& dq, Buf<uint16_t>& out, Buf<uint8_t>& kc, Buf<uint8_t>& vc, Buf<float>& ks, Buf<float>& vs,
                    gpu::QkPrepParams* prep) {
    gpu::AttentionParams a;
    a.q = dq.p;
    a.out = out.p;
    a.dtype = ActDType::kBF16;
    a.num_tokens = T;
    a.num_heads = nq;
    a.pos = dpos.p;
    a.table_offset = dtoff.p;
    a.block_tables = dtables.p;
    a.window = c.window;
    a.scale = 1.f / std::sqrt(static_cast<float>(hd));
    a.cache = {kc.p, vc.p, c.elem == KvElem::kBF16 ? nullptr : ks.p, c.elem == KvElem::kBF16 ? nullptr : vs.p, c.elem, bs, nkv, hd};
    a.max_tokens_per_seq = 1;
    a.workspace = ws.p;
    a.workspace_bytes = static_cast<int64_t>(ws.n);
    prep->q = dq.p;
    prep->k = dk.p;
    prep->v = dv.p;
    prep->dtype = ActDType::kBF16;
    prep->num_tokens = T;
    prep->num_heads = nq;
    prep->q_norm = c.norm ? dqn.p : nullptr;
    prep->k_norm = c.norm ? dkn.p : nullptr;
    prep->eps = 1e-6f;
    prep->rope = c.rope;
    prep->pos = dpos.p;
    prep->theta = 1e6;
    prep->slots = dslot.p;
    prep->cache = a.cache;
    return a;
  };
  gpu::QkPrepParams prep_a, prep_b;
  gpu::AttentionParams a = params(dq_a, out_a, kc_a, vc_a, ks_a, vs_a, &prep_a);
  gpu::AttentionParams b = params(dq_b, out_b, kc_b, vc_b, ks_b, vs_b, &prep_b);
  STATUS_OK(gpu::QkPrep(prep_a, nullptr));
  STATUS_OK(gpu::Attention(a, nullptr));
  ASSERT_TRUE(gpu::AttentionDecodeFusedSupports(b, prep_b));
  STATUS_OK(gpu::AttentionDecodeFused(b, prep_b, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The new K/V rows: the same bytes (and scales) as QkPrep's; nothing else written.
  EXPECT_TRUE(kc_a.Host() == kc_b.Host());
  EXPECT_TRUE(vc_a.Host() == vc_b.Host());
  if (c.elem != KvElem::kBF16) {
    EXPECT_TRUE(ks_a.Host() == ks_b.Host());
    EXPECT_TRUE(vs_a.Host() == vs_b.Host());
  }
  EXPECT_TRUE(dq_b.Host() == q) << "the fused kernel must leave q as it was";
  const std::vector<uint16_t> ra = out_a.Host(), rb = out_b.Host();
  double worst = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    const float x = Bf16ToF32(ra[i]), y = Bf16ToF32(rb[i]);
    ASSERT_TRUE(std::isfinite(y)) << i;
    worst = std::max<double>(worst, std::fabs(x - y) / std::max(1.f, std::fabs(x)));
  }
  EXPECT_LE(worst, 1.6e-2) << "fused against QkPrep + split decode";
  // The position-0 token attends only itself: its output is its own value head exactly (bf16).
  if (c.elem == KvElem::kBF16) {
    for (int64_t h = 0; h < nq; ++h) {
      for (int64_t e = 0; e < hd; ++e) EXPECT_EQ(rb[h * hd + e], v[(h / (nq / nkv)) * hd + e]) << h << " " << e;
    }
  }
}

std::vector<FusedCase> FusedCases() {
  std::vector<FusedCase> v;
  for (KvElem e : {KvElem::kBF16, KvElem::kFp8E4M3}) {
    for (int64_t hd : {64, 128}) {
      v.push_back({e, hd, 32, 4, 0, true, true});     // Qwen3: 8 query heads per KV head
      v.push_back({e, hd, 16, 1, 0, false, true});    // 16 per KV head
      v.push_back({e, hd, 8, 8, 128, true, false});   // one per KV head, a sliding window
      v.push_back({e, hd, 12, 4, 512, false, false});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, FusedDecodeTest, ::testing::ValuesIn(FusedCases()));

std::vector<Case> AllCases() {
  std::vector<Case> v;
  for (ActDType a : {ActDType::kF32, ActDType::kBF16}) {
    for (KvElem e : {KvElem::kF32, KvElem::kBF16, KvElem::kFp8E4M3}) {
      for (int64_t hd : {64, 128}) {
        for (int f = 0; f < 4; ++f) v.push_back({a, e, hd, (f & 1) != 0, (f & 2) != 0});
      }
    }
  }
  for (KvElem e : {KvElem::kBF16, KvElem::kFp8E4M3}) v.push_back({ActDType::kBF16, e, 128, true, true, 300});
  v.push_back({ActDType::kF32, KvElem::kF32, 64, true, true, 256});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, QkPrepTest, ::testing::ValuesIn(AllCases()));

}  // namespace
}  // namespace moeshard
