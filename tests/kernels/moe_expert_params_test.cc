// The MoE expert step's checks that need no device (kernels/moe/moe_expert.h): the CPU reference on
// numbers worked out by hand, and every refusal Validate and the repacks' shape rules make before any
// CUDA call. Labelled `cudahost`: it runs in the CUDA build on any machine, GPU or not (the device
// cases are in moe_expert_test.cc, labelled `gpu`).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/moe_ref.h"
#include "kernels/moe/moe_expert.h"

namespace moeshard {
namespace {

using gpu::ActDType;

// Needs no device: the CPU reference on numbers worked out by hand. One expert with
// gate = [1 0], up = [0 1], down = [1 2]ᵀ: x = (1, 2) gives h = silu(1) · 2 and the
// expert's output (h, 2h), normalized (1, 2) / sqrt(2.5).
TEST(MoeExpertNoDeviceTest, ReferenceMatchesHandComputed) {
  const float gate[2] = {1, 0}, up[2] = {0, 1}, down[2] = {1, 2};
  auto ref = [](const float* w, int64_t rows, int64_t cols) {
    WeightRef r;
    r.format = WeightFormat::kF32;
    r.rows = rows;
    r.cols = cols;
    r.data = reinterpret_cast<const uint8_t*>(w);
    r.row_stride_bytes = cols * 4;
    return r;
  };
  std::vector<MoeRefExpert> experts = {{ref(gate, 1, 2), ref(up, 1, 2), ref(down, 2, 1)}};
  const int32_t ids[4] = {0, -1, -1, -1};  // token 1 has no local expert
  const float weights[4] = {0.5f, 0.5f, 0.25f, 0.75f};
  const float x[4] = {1, 2, 3, 4};
  const double h = 2.0 / (1.0 + std::exp(-1.0));
  for (bool norm : {false, true}) {
    float out[4];
    MoeExpertRef(experts, 2, 1, 2, 2, ids, weights, x, norm, 0.f, out);
    const double d0 = norm ? 1 / std::sqrt(2.5) : h, d1 = norm ? 2 / std::sqrt(2.5) : 2 * h;
    EXPECT_NEAR(out[0], 0.5 * d0, 1e-6);
    EXPECT_NEAR(out[1], 0.5 * d1, 1e-6);
    EXPECT_EQ(out[2], 0.f);
    EXPECT_EQ(out[3], 0.f);
  }
}

// Needs no device: validation fails before any CUDA call.
TEST(MoeExpertNoDeviceTest, RejectsBadParams) {
  gpu::MoeExpertParams p;
  EXPECT_EQ(gpu::MoeExpertStep(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.num_local_experts = 2;
  p.width = p.inter = 64;
  p.top_k = 2;
  p.num_tokens = 0;
  EXPECT_TRUE(gpu::MoeExpertStep(p, nullptr).ok());  // nothing to do
  p.num_total_experts = 1;                           // fewer experts in the layer than on this GPU
  const absl::Status fewer = gpu::MoeExpertStep(p, nullptr);
  EXPECT_EQ(fewer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fewer.message().find("num_total_experts"), std::string::npos) << fewer;
  p.num_total_experts = -3;
  EXPECT_EQ(gpu::MoeExpertStep(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.num_total_experts = 8;
  EXPECT_TRUE(gpu::MoeExpertStep(p, nullptr).ok());
  p.num_tokens = 4;
  EXPECT_EQ(gpu::MoeExpertStep(p, nullptr).code(), absl::StatusCode::kInvalidArgument);  // null pointers
  EXPECT_GT(gpu::MoeExpertWorkspaceBytes(32, 4096, 4096, 8, 8), size_t{8 * 8 * 4096 * 10});
}

// Parameters that pass Validate's size and pointer checks without a device: every pointer at one
// 256-byte-aligned host buffer (`fake`), never dereferenced — the checks under test refuse first.
alignas(256) uint8_t fake[256];  // FakeParams' pointers
gpu::MoeExpertParams FakeParams() {
  gpu::MoeExpertParams p;
  p.num_local_experts = 2;
  p.width = p.inter = 256;
  p.top_k = 2;
  p.num_tokens = 4;
  p.experts = reinterpret_cast<const gpu::MoeExpertWeights*>(fake);
  p.expert_ids = reinterpret_cast<const int32_t*>(fake);
  p.weights = reinterpret_cast<const float*>(fake);
  p.x = fake;
  p.out = reinterpret_cast<float*>(fake);
  p.workspace = fake;
  return p;
}

// Hints that would send repacked views down a path that cannot read them are refused before any
// launch (Validate; the pointers are never dereferenced).
TEST(MoeExpertNoDeviceTest, RejectsInconsistentRepackHints) {
  gpu::MoeExpertParams p = FakeParams();
  p.act_dtype = ActDType::kBF16;
  const uint32_t nvfp4 = gpu::MoeFormatBit(WeightFormat::kNVFP4), mxfp4 = gpu::MoeFormatBit(WeightFormat::kMXFP4);
  auto says = [&](uint32_t hint) {
    p.expert_formats = hint;
    return std::string(gpu::MoeExpertStep(p, nullptr).message());
  };
  EXPECT_THAT(says(mxfp4 | gpu::kMoeMxfp4Repacked), ::testing::HasSubstr("kMoeMxfp4Repacked needs kMoeNvfp4Repacked"));
  EXPECT_THAT(says(mxfp4 | gpu::kMoeNvfp4Repacked | gpu::kMoeMxfp4Repacked),
              ::testing::HasSubstr("without the NVFP4 format bit"));
  EXPECT_THAT(says(nvfp4 | gpu::kMoeQ8Repacked), ::testing::HasSubstr("kMoeQ8Repacked needs kMoeNvfp4Repacked"));
  EXPECT_THAT(says(nvfp4 | gpu::kMoeNvfp4Repacked | gpu::kMoeQ8Repacked | gpu::kMoeMxfp4Repacked),
              ::testing::HasSubstr("exclude each other"));
  // A consistent hint passes these checks and stops at the next one (the workspace's size).
  EXPECT_THAT(says(nvfp4 | gpu::kMoeNvfp4Repacked | gpu::kMoeMxfp4Repacked), ::testing::HasSubstr("workspace of 0"));
  EXPECT_THAT(says(nvfp4 | gpu::kMoeNvfp4Repacked | gpu::kMoeQ8Repacked), ::testing::HasSubstr("workspace of 0"));
}

// The combine's bf16 copy (MoeExpertParams::out_act) is refused before any launch where it cannot be
// written: fp32 activations, an address off 8 bytes, and the rows-only step, which has no combine.
TEST(MoeExpertNoDeviceTest, RefusesOutActItCannotWrite) {
  gpu::MoeExpertParams p = FakeParams();
  p.out_act = fake;
  p.act_dtype = ActDType::kF32;
  EXPECT_THAT(std::string(gpu::MoeExpertStep(p, nullptr).message()),
              ::testing::HasSubstr("out_act needs act_dtype bf16"));
  p.act_dtype = ActDType::kBF16;
  p.out_act = fake + 2;
  EXPECT_THAT(std::string(gpu::MoeExpertStep(p, nullptr).message()), ::testing::HasSubstr("8-byte alignment"));
  // Aligned and bf16: past this check, stopped at the next (the workspace's size).
  p.out_act = fake + 8;
  EXPECT_THAT(std::string(gpu::MoeExpertStep(p, nullptr).message()), ::testing::HasSubstr("workspace of 0"));
  auto rows = gpu::MoeExpertStepRows(p, nullptr);
  ASSERT_FALSE(rows.ok());
  EXPECT_THAT(std::string(rows.status().message()), ::testing::HasSubstr("out_act needs the combine"));
}

// A 32 x 512 view of format f over `data` (row stride `stride`, columns from c0), and two views no
// repack takes: one off the 32-column grid (columns from 16), one 96 columns wide.
struct RepackViews {
  WeightRef ok, odd, narrow;
};
RepackViews RepackViewsOf(WeightFormat f, const uint8_t* data, int64_t stride, int64_t c0) {
  RepackViews r;
  r.ok.format = f;
  r.ok.rows = 32;
  r.ok.cols = 512;
  r.ok.col_offset = c0;
  r.ok.data = data;
  r.ok.row_stride_bytes = stride;
  r.odd = r.ok;
  r.odd.col_offset = 16;
  r.narrow = r.ok;
  r.narrow.cols = 96;
  return r;
}

// The MXFP4 repack's shape rules, checked before any device work: an MXFP4 view on the 32-column
// grid with rows % 16 and cols % 256; anything else refused with the rule (MoeRepackMxfp4) or
// reported not repackable (MoeMxfp4Repackable).
TEST(MoeExpertNoDeviceTest, MxRepackTakesOnlyItsShapes) {
  alignas(16) static uint8_t bytes[64];
  const auto [v, odd, narrow] = RepackViewsOf(WeightFormat::kMXFP4, bytes, 512 / 32 * 17, 0);
  WeightRef nv = v;
  nv.format = WeightFormat::kNVFP4;
  for (const WeightRef& w : {odd, narrow, nv}) {
    auto r = gpu::MoeRepackMxfp4(w, bytes, bytes, nullptr);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("needs an MXFP4 view with rows % 16 == 0"));
    auto ok = gpu::MoeMxfp4Repackable(&w, 1, nullptr);
    ASSERT_TRUE(ok.ok());
    EXPECT_FALSE(*ok);
  }
  const WeightRef both[2] = {v, odd};  // one ineligible view makes the set not repackable
  auto ok = gpu::MoeMxfp4Repackable(both, 2, nullptr);
  ASSERT_TRUE(ok.ok());
  EXPECT_FALSE(*ok);
  auto none = gpu::MoeMxfp4Repackable(nullptr, 0, nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(*none);
  auto unaligned = gpu::MoeRepackMxfp4(v, bytes + 1, bytes, nullptr);
  EXPECT_THAT(std::string(unaligned.status().message()), ::testing::HasSubstr("16-byte aligned"));
}

// The Q8_0 repack's shape rules, likewise: a Q8_0 view on the 32-column grid with rows % 16 and
// cols % 256 (MoeQ8Repackable says so without reading anything); anything else refused with the rule.
TEST(MoeExpertNoDeviceTest, Q8RepackTakesOnlyItsShapes) {
  alignas(16) static uint8_t bytes[64];
  const auto [v, odd, narrow] = RepackViewsOf(WeightFormat::kQ8_0, bytes, 576 / 32 * 34, 32);
  EXPECT_TRUE(gpu::MoeQ8Repackable(v));
  WeightRef short_rows = v;
  short_rows.rows = 24;
  WeightRef mx = v;
  mx.format = WeightFormat::kMXFP4;
  for (const WeightRef& w : {odd, narrow, short_rows, mx}) {
    EXPECT_FALSE(gpu::MoeQ8Repackable(w));
    auto r = gpu::MoeRepackQ8(w, bytes, bytes, nullptr);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("needs a Q8_0 view with rows % 16 == 0"));
  }
  auto unaligned = gpu::MoeRepackQ8(v, bytes, bytes + 2, nullptr);
  EXPECT_THAT(std::string(unaligned.status().message()), ::testing::HasSubstr("16-byte aligned"));
}

}  // namespace
}  // namespace moeshard
