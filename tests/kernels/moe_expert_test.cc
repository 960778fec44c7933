// The MoE expert step (kernels/moe/moe_expert.h) against its CPU reference
// (kernels/cpu/moe_ref.h): every weight format × {fp32, bf16 activations} × {per-expert norm
// on, off} × shapes that take the tensor-core path (NVFP4, bf16, aligned views) and shapes
// that take the generic one (odd sizes, column windows off the 32-column grid), with slots
// on other GPUs (-1), experts with no tokens, tokens with no local expert, and experts with
// more than one 64-token tile; the GEMV/mma path (Q8_0, MXFP4, BF16 experts, bf16
// activations) at decode and prefill group sizes (on Hopper, prefill sizes take the wgmma GEMMs
// of moe_wgmma.cu when the workspace is sized with the formats, as here), and the MoeExpertParams::expert_formats
// hint, which must leave every result unchanged bit for bit (with it, decode-sized steps of GEMV-path
// experts skip the route: moe_launch.h MoeWork::direct); and for NVFP4 with bf16
// activations, the same step on weights repacked by MoeRepackNvfp4 (the streaming kernels,
// decode-size items with the down GEMM split in K, mid-size and prefill-size items).
// fp32 must match within 2e-5 of each row's largest value;
// bf16 (which rounds gate, up and h to bf16) within 2 % of each row's L2 norm. Outputs are
// poisoned with NaN first, and a second run must repeat the first bit for bit; the direct GEMV over
// repacked experts gives the same bits in its block and warp forms.
// Labelled `gpu`; skips (exit 77) where no CUDA device is present.
#include "kernels/moe/moe_expert.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/moe_ref.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_ops.h"
#include "tests/kernels/gpu_test_util.h"

namespace moeshard {
namespace {

using gpu::ActDType;

constexpr auto& kFormats = testing_gpu::kAllFormats;

// Device memory freed on scope exit.
struct DeviceMem {
  void* ptr = nullptr;
  explicit DeviceMem(size_t bytes) { cudaMalloc(&ptr, bytes ? bytes : 1); }
  ~DeviceMem() { cudaFree(ptr); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
};

// One stored weight [rows, stored_cols] on host and device, viewed as columns [c0, c0+cols).
struct TestWeight {
  std::vector<uint8_t> data, scale;
  std::unique_ptr<DeviceMem> ddata, dscale;
  WeightRef host, dev;
};

// aligned: rows as a real checkpoint stores them (whole 128-column groups, no padding), so that
// every row of a Q8_0 or MXFP4 view starts at the same byte phase mod 4 (moe_direct.cu's
// compile-time phases); otherwise odd strides (its run-time phase).
void MakeWeight(WeightFormat f, int64_t rows, int64_t cols, int64_t c0, bool aligned, std::mt19937& rng,
                TestWeight& tw) {
  const int64_t stored = aligned ? c0 + cols + 128 : (c0 + cols + 31) / 32 * 32 + 32;
  const int64_t stride = WeightRowBytes(f, stored) + (aligned ? 0 : 16);
  tw.data.assign(rows * stride, 0);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> byte(0, 255);
  const float sd = 1.f / std::sqrt(static_cast<float>(cols));
  WeightRef w;
  w.format = f;
  w.rows = rows;
  w.cols = stored;
  w.row_stride_bytes = stride;
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = tw.data.data() + r * stride;
    for (int64_t c = 0; c < stored; ++c) {
      const float v = normal(rng) * sd;
      uint16_t b16;
      if (f == WeightFormat::kF32) std::memcpy(row + c * 4, &v, 4);
      if (f == WeightFormat::kBF16) b16 = F32ToBf16(v), std::memcpy(row + c * 2, &b16, 2);
      if (f == WeightFormat::kF16) b16 = F32ToF16(v), std::memcpy(row + c * 2, &b16, 2);
    }
    for (int64_t blk = 0; blk < stored / 32; ++blk) {
      if (f == WeightFormat::kQ8_0) {
        uint8_t* b = row + blk * 34;
        const uint16_t d = F32ToF16(sd / 64.f);
        std::memcpy(b, &d, 2);
        for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(byte(rng));
      } else if (f == WeightFormat::kMXFP4) {
        uint8_t* b = row + blk * 17;
        b[0] = static_cast<uint8_t>(127 - 2 - static_cast<int>(std::log2(std::sqrt(float(cols)))) + byte(rng) % 2);
        for (int i = 0; i < 16; ++i) b[1 + i] = static_cast<uint8_t>(byte(rng));
      }
    }
  }
  if (f == WeightFormat::kNVFP4) {
    std::vector<float> v(rows * stored);
    for (auto& x : v) x = normal(rng) * sd;
    Nvfp4Matrix q = QuantizeNvfp4(v.data(), rows, stored);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(tw.data.data() + r * stride, q.packed.data() + r * stored / 2, stored / 2);
    }
    tw.scale = std::move(q.scale);
    w.scale_row_stride = stored / 16;
    w.scale2 = q.scale2;
  }
  tw.ddata = std::make_unique<DeviceMem>(tw.data.size());
  cudaMemcpy(tw.ddata->ptr, tw.data.data(), tw.data.size(), cudaMemcpyHostToDevice);
  tw.host = w;
  tw.host.data = tw.data.data();
  tw.dev = w;
  tw.dev.data = static_cast<const uint8_t*>(tw.ddata->ptr);
  if (!tw.scale.empty()) {
    tw.dscale = std::make_unique<DeviceMem>(tw.scale.size());
    cudaMemcpy(tw.dscale->ptr, tw.scale.data(), tw.scale.size(), cudaMemcpyHostToDevice);
    tw.host.scale = tw.scale.data();
    tw.dev.scale = static_cast<const uint8_t*>(tw.dscale->ptr);
  }
  tw.host = tw.host.ColSlice(c0, cols);
  tw.dev = tw.dev.ColSlice(c0, cols);
}

struct Shape {
  const char* name;
  int64_t T;
  int top_k, E, E_total;  // ids drawn from [0, E_total); those ≥ E belong to other GPUs
  int64_t L, I, c0;
  int skip_expert;  // a local expert that no token picks (-1: none)
  bool aligned = false;  // MakeWeight's aligned rows
};

constexpr Shape kShapes[] = {
    {"one token", 1, 2, 3, 3, 256, 256, 0, -1},
    {"tp window", 37, 4, 6, 12, 256, 512, 32, 5},
    {"many tiles", 150, 2, 2, 2, 512, 256, 0, -1},
    {"odd sizes", 9, 3, 4, 8, 96, 64, 16, 2},
    {"off-grid window", 20, 2, 3, 5, 256, 256, 48, -1},
    // More than 512 tokens: the streaming kernels' prefill-size items (8 warps per block).
    {"prefill", 600, 2, 2, 2, 256, 256, 0, -1},
    // The GEMV/mma path (Q8_0, MXFP4, BF16 with bf16 activations): decode-sized groups
    // (≤ 8 tokens per expert, 1 n8 tile), and groups of 9-16 and 17-32 tokens with tails
    // (several 32-token groups per expert); I = 96 or 192 is off the NVFP4 path's 256 grid.
    {"gemv decode", 4, 8, 16, 32, 512, 192, 0, 3},
    // 48 pairs of repacked NVFP4 / MXFP4 experts: the direct GEMV over the streaming layout
    // (moe_stream_direct.cu), half the slots on other GPUs, a window at column 32, an idle
    // expert, gate/up's K one 256-column chunk (three of its four K quarters empty), down's two.
    {"repacked decode", 6, 8, 6, 12, 256, 512, 32, 5},
    // A wider decode step (L = 1024) through the direct GEMV kernels.
    {"gemv decode wide", 2, 8, 8, 16, 1024, 64, 0, -1},
    // The direct kernels' compile-time phases: I = 384 puts the down GEMV's four warps at
    // blocks 0, 3, 6 and 9 (MXFP4 phases 0, 3, 2, 1), in a window at column 128.
    {"gemv decode aligned", 3, 8, 12, 16, 512, 384, 128, -1, true},
    {"gemv mid", 40, 3, 6, 6, 256, 96, 0, -1},
    // 96 pairs with L = 160: the down GEMM's row-split blocks (past 64 pairs) over 5 row tiles of
    // 32, so a block's last three warps have none.
    {"gemv rows", 24, 4, 6, 6, 160, 96, 0, -1},
    {"gemv prefill", 300, 4, 8, 8, 256, 96, 0, -1},
    // Prefill sizes on Hopper: the wgmma GEMMs over expanded weights (moe_wgmma.cu), several
    // 128-row tiles an expert with tails, in 256-row weight tiles (L a multiple of 256, I of
    // 128): one tile (L 256, I 128), then two and four (L 512, I 256); then 128-row weight tiles
    // (I = 192) with a column window, an expert without tokens and slots on other GPUs.
    {"wgmma prefill", 700, 4, 8, 8, 256, 128, 0, -1},
    {"wgmma wide", 520, 4, 8, 8, 512, 256, 0, 3},
    {"wgmma window", 600, 4, 6, 12, 256, 192, 32, 5},
    // Repacked NVFP4 / MXFP4 experts through the wgmma GEMMs over decoded registers
    // (moe_stream_wgmma.cu): ~50 rows an expert (items of up to 64 tokens, the last rows of an
    // expert at the 32-token form), two row blocks of gate/up and of down, a window at column 64,
    // an expert without tokens, slots on other GPUs. ("prefill" and "many tiles" give it several
    // items an expert; ctest's _tok96 / _tok112 / _tok128 variants force the larger item sizes.)
    {"stream wgmma", 200, 4, 10, 16, 512, 256, 64, 7},
    // Past 4,096 wide (Muse Spark's latent is 4,096): the combine's eight float4 a thread, and its
    // bf16 copy (out_act). Last, so the shapes before keep their ids' alignment and draws.
    {"combine wide", 2, 8, 4, 8, 4128, 64, 0, -1},
    // Qwen3-30B's expert size (2,048 x 768): the direct GEMV's gate/up K eight chunks (two a
    // quarter), down's three (its first quarter empty); every token picks both local experts.
    {"qwen decode", 2, 8, 2, 8, 2048, 768, 0, -1, true},
    // 64 pairs, every token on all four experts: the direct GEMV's grouped units split each
    // expert's 16 pairs into two groups of 8.
    {"crowded decode", 16, 4, 4, 4, 256, 256, 0, -1},
    // 48 pairs, 12 an expert: groups of 8 and 4.
    {"crowded part", 12, 4, 4, 4, 256, 256, 0, -1},
    // A 4,096-wide latent (Muse Spark's): gate/up's K sixteen chunks, four a quarter (the warp
    // form's four-stage ring wraps four times within one row of K); down's K two chunks.
    {"latent decode", 1, 8, 4, 8, 4096, 512, 0, -1, true},
    // One token of Qwen3-30B's expert size on a GPU holding every expert: the residual update
    // inside the direct GEMV's down kernel (MoeExpertStepResidual), eight slots.
    {"qwen one token", 1, 8, 8, 8, 2048, 768, 0, -1, true},
};

// The shapes whose repacked steps took the direct GEMV and compared its two forms (RunCase).
std::set<std::string> g_direct_forms_compared;
// The shapes whose repacked steps compared the residual update inside down (CompareDownResidual).
std::set<std::string> g_down_residual_compared;

bool DownResidualOff() {
  const char* v = std::getenv("MOESHARD_MOE_DOWN_RESIDUAL");
  return v != nullptr && v[0] == '0';
}

// One token with every expert on this GPU (MoeExpertStepResidual): the residual update inside the
// down kernel must leave s, bit for bit, as MoeExpertStepRows' rows and the residual kernel's ungated
// update leave it (ResidualParams::mix_*), with the attention block's pre_add and without; and it must
// be taken unless MOESHARD_MOE_DOWN_RESIDUAL=0 (then nothing may be enqueued: s unchanged).
void CompareDownResidual(const gpu::MoeExpertParams& p, std::mt19937& rng) {
  const int64_t L = p.width;
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> s0(L), pre(L);
  for (auto& v : s0) v = 3.f * d(rng);
  for (auto& v : pre) v = d(rng);
  DeviceMem d_sa(L * 4), d_sb(L * 4), d_pre(L * 4);
  CUDA_OK(cudaMemcpy(d_pre.ptr, pre.data(), L * 4, cudaMemcpyHostToDevice));
  for (bool with_pre : {true, false}) {
    SCOPED_TRACE(with_pre ? "with pre_add" : "without pre_add");
    const float* pre_dev = with_pre ? static_cast<const float*>(d_pre.ptr) : nullptr;
    CUDA_OK(cudaMemcpy(d_sa.ptr, s0.data(), L * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_sb.ptr, s0.data(), L * 4, cudaMemcpyHostToDevice));
    absl::StatusOr<gpu::MoeExpertRows> rows = gpu::MoeExpertStepRows(p, nullptr);
    ASSERT_TRUE(rows.ok()) << rows.status();
    gpu::ResidualParams r;
    r.s = static_cast<float*>(d_sa.ptr);
    r.rows = 1;
    r.dim = L;
    r.pre_add = pre_dev;
    r.mix_rows = rows->rows;
    r.mix_pos = rows->pos;
    r.mix_weights = p.weights;
    r.mix_k = p.top_k;
    absl::Status st = gpu::Residual(r, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    CUDA_OK(cudaDeviceSynchronize());
    const uint64_t before = gpu::MoeExpertPathCounts().down_residual;
    absl::StatusOr<bool> taken = gpu::MoeExpertStepResidual(p, static_cast<float*>(d_sb.ptr), pre_dev, nullptr);
    ASSERT_TRUE(taken.ok()) << taken.status();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint32_t> a(L), b(L);
    CUDA_OK(cudaMemcpy(a.data(), d_sa.ptr, L * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(b.data(), d_sb.ptr, L * 4, cudaMemcpyDeviceToHost));
    if (DownResidualOff()) {
      EXPECT_FALSE(*taken) << "MOESHARD_MOE_DOWN_RESIDUAL=0, yet the update ran inside down";
      EXPECT_EQ(std::memcmp(b.data(), s0.data(), L * 4), 0) << "not taken, yet s changed";
      continue;
    }
    ASSERT_TRUE(*taken) << "one token, every expert local, repacked: the update must go inside down";
    EXPECT_EQ(gpu::MoeExpertPathCounts().down_residual, before + 1);
    int64_t wrong = 0;
    for (int64_t i = 0; i < L; ++i) {
      if (a[i] != b[i] && wrong++ < 3) ADD_FAILURE() << "s[" << i << "] differs from the residual kernel's";
    }
    EXPECT_EQ(wrong, 0);
  }
}

void RunCase(const Shape& s, WeightFormat f, ActDType act, bool norm, std::mt19937& rng) {
  const int64_t T = s.T, L = s.L, I = s.I;
  std::vector<TestWeight> tw(3 * s.E);
  std::vector<MoeRefExpert> ref(s.E);
  std::vector<gpu::MoeExpertWeights> dev(s.E);
  for (int e = 0; e < s.E; ++e) {
    MakeWeight(f, I, L, s.c0, s.aligned, rng, tw[3 * e]);
    MakeWeight(f, I, L, s.c0, s.aligned, rng, tw[3 * e + 1]);
    MakeWeight(f, L, I, s.c0, s.aligned, rng, tw[3 * e + 2]);
    ref[e] = {tw[3 * e].host, tw[3 * e + 1].host, tw[3 * e + 2].host};
    dev[e] = {tw[3 * e].dev, tw[3 * e + 1].dev, tw[3 * e + 2].dev};
  }
  // Routing: distinct experts per token; ids ≥ E become -1 (another GPU's).
  std::vector<int32_t> ids(T * s.top_k);
  std::vector<float> wts(T * s.top_k), x(T * L), want(T * L);
  std::uniform_real_distribution<float> uni(0.05f, 1.f);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all;
    for (int i = 0; i < s.E_total; ++i) {
      if (i != s.skip_expert) all.push_back(i);
    }
    std::shuffle(all.begin(), all.end(), rng);
    for (int k = 0; k < s.top_k; ++k) {
      ids[t * s.top_k + k] = all[k] < s.E ? all[k] : -1;
      wts[t * s.top_k + k] = uni(rng);
    }
  }
  for (auto& v : x) v = Bf16ToF32(F32ToBf16(normal(rng)));  // exact in both dtypes
  MoeExpertRef(ref, L, I, T, s.top_k, ids.data(), wts.data(), x.data(), norm, 1e-5f, want.data());

  const size_t act_bytes = act == ActDType::kF32 ? 4 : 2;
  std::vector<uint8_t> xdev(T * L * act_bytes);
  for (int64_t i = 0; i < T * L; ++i) {
    if (act == ActDType::kF32) {
      std::memcpy(xdev.data() + i * 4, &x[i], 4);
    } else {
      const uint16_t b = F32ToBf16(x[i]);
      std::memcpy(xdev.data() + i * 2, &b, 2);
    }
  }
  // Sized with the experts' formats: room for the wgmma path's expanded weights where it applies.
  const uint32_t hint = gpu::MoeExpertFormats(dev.data(), s.E, L, I);
  const size_t ws_bytes = gpu::MoeExpertWorkspaceBytes(s.E, L, I, T, s.top_k, hint);
  const bool wgmma_room = ws_bytes > gpu::MoeExpertWorkspaceBytes(s.E, L, I, T, s.top_k);
  DeviceMem d_experts(sizeof(gpu::MoeExpertWeights) * s.E), d_ids(ids.size() * 4 + 4), d_w(wts.size() * 4),
      d_x(xdev.size()), d_out(T * L * 4), d_ws(ws_bytes);
  CUDA_OK(cudaMemcpy(d_experts.ptr, dev.data(), sizeof(gpu::MoeExpertWeights) * s.E, cudaMemcpyHostToDevice));
  // Odd-numbered shapes read their ids one element past a 16-byte boundary: the route's scalar loads
  // (its 16-byte loads need the ids aligned).
  const std::ptrdiff_t shape_index = &s - kShapes;  // RunCase runs kShapes' entries
  int32_t* ids_dev = static_cast<int32_t*>(d_ids.ptr) + shape_index % 2;
  CUDA_OK(cudaMemcpy(ids_dev, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_w.ptr, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_x.ptr, xdev.data(), xdev.size(), cudaMemcpyHostToDevice));
  gpu::MoeExpertParams p;
  p.experts = static_cast<const gpu::MoeExpertWeights*>(d_experts.ptr);
  p.num_local_experts = s.E;
  // The layer's experts, as the worker passes them: the host's rules (item sizes, the pair step, the
  // wgmma plan) read this GPU's expected rows from it.
  p.num_total_experts = s.E_total;
  p.width = L;
  p.inter = I;
  p.num_tokens = T;
  p.top_k = s.top_k;
  p.expert_ids = ids_dev;
  p.weights = static_cast<const float*>(d_w.ptr);
  p.x = d_x.ptr;
  p.act_dtype = act;
  p.output_norm = norm;
  p.eps = 1e-5f;
  p.out = static_cast<float*>(d_out.ptr);
  p.workspace = d_ws.ptr;
  p.workspace_bytes = ws_bytes;
  std::vector<float> got(T * L), again(T * L);
  for (std::vector<float>* dst : {&got, &again}) {
    CUDA_OK(cudaMemset(d_out.ptr, 0xff, T * L * 4));  // NaN: every element must be written
    absl::Status st = gpu::MoeExpertStep(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(dst->data(), d_out.ptr, T * L * 4, cudaMemcpyDeviceToHost));
  }
  EXPECT_EQ(std::memcmp(got.data(), again.data(), T * L * 4), 0) << "two runs differ";
  // With the caller's format hint: the launches no expert needs are left out (the generic
  // ones too, when every expert is fast-eligible), and the result must not change a bit.
  // In bf16 the combine also writes the mix's bf16 copy there (out_act): each element `out` rounded
  // to nearest even, and `out` itself unchanged by it.
  const bool all_fast = (hint & gpu::kMoeAllViewsFast) != 0;
  {
    const bool with_act = act == ActDType::kBF16;
    DeviceMem d_act(with_act ? T * L * 2 : 8);
    gpu::MoeExpertParams ph = p;
    ph.expert_formats = hint;
    if (with_act) {
      ph.out_act = d_act.ptr;
      CUDA_OK(cudaMemset(d_act.ptr, 0xff, T * L * 2));
    }
    CUDA_OK(cudaMemset(d_out.ptr, 0xff, T * L * 4));
    absl::Status st = gpu::MoeExpertStep(ph, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(again.data(), d_out.ptr, T * L * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(got.data(), again.data(), T * L * 4), 0)
        << "the format hint (or the combine's bf16 copy beside it) changed the result";
    if (with_act) {
      std::vector<uint16_t> act_bits(T * L);
      CUDA_OK(cudaMemcpy(act_bits.data(), d_act.ptr, T * L * 2, cudaMemcpyDeviceToHost));
      int64_t wrong = 0;
      for (int64_t i = 0; i < T * L; ++i) wrong += act_bits[i] != F32ToBf16(got[i]);
      EXPECT_EQ(wrong, 0) << "out_act is not out rounded to bf16";
    }
  }

  // NVFP4 with bf16 activations on the tensor-core path, and MXFP4 and Q8_0 where the streaming
  // layouts take the shape (L and I multiples of 256, the window on the 32-column grid): the same
  // step on weights repacked by MoeRepackNvfp4 / MoeRepackMxfp4 / MoeRepackQ8 (the streaming
  // kernels) must meet the same tolerance and repeat run to run bit for bit.
  std::vector<std::vector<float>> results = {got};
  const bool grid256 = L % 256 == 0 && I % 256 == 0 && s.c0 % 32 == 0;
  const bool mx_repack = f == WeightFormat::kMXFP4 && grid256;
  const bool q8_repack = f == WeightFormat::kQ8_0 && grid256;
  if ((f == WeightFormat::kNVFP4 || mx_repack || q8_repack) && act == ActDType::kBF16 && all_fast) {
    std::vector<std::unique_ptr<DeviceMem>> keep;
    std::vector<gpu::MoeExpertWeights> rdev = dev;
    for (auto& ew : rdev) {
      for (WeightRef* v : {&ew.gate, &ew.up, &ew.down}) {
        keep.push_back(std::make_unique<DeviceMem>(v->rows * v->cols / (q8_repack ? 1 : 2)));
        keep.push_back(std::make_unique<DeviceMem>(v->rows * v->cols / 16));
        if (mx_repack) {  // the test's weights are quantized from normal values: scales in range
          auto ok = gpu::MoeMxfp4Repackable(v, 1, nullptr);
          ASSERT_TRUE(ok.ok()) << ok.status();
          ASSERT_TRUE(*ok) << "MXFP4 scales out of the repack's range";
        }
        void* data = keep[keep.size() - 2]->ptr;
        auto r = mx_repack   ? gpu::MoeRepackMxfp4(*v, data, keep.back()->ptr, nullptr)
                 : q8_repack ? gpu::MoeRepackQ8(*v, data, keep.back()->ptr, nullptr)
                             : gpu::MoeRepackNvfp4(*v, data, keep.back()->ptr, nullptr);
        ASSERT_TRUE(r.ok()) << r.status();
        *v = *r;
      }
    }
    DeviceMem d_rexperts(sizeof(gpu::MoeExpertWeights) * s.E);
    CUDA_OK(cudaMemcpy(d_rexperts.ptr, rdev.data(), sizeof(gpu::MoeExpertWeights) * s.E, cudaMemcpyHostToDevice));
    gpu::MoeExpertParams pr = p;
    pr.experts = static_cast<const gpu::MoeExpertWeights*>(d_rexperts.ptr);
    // The repacked views are NVFP4-format views: the hint says so, as the worker's does.
    pr.expert_formats = gpu::MoeExpertFormats(rdev.data(), s.E, L, I) | gpu::kMoeNvfp4Repacked |
                        (mx_repack ? gpu::kMoeMxfp4Repacked : 0u) | (q8_repack ? gpu::kMoeQ8Repacked : 0u);
    const uint64_t direct_before = gpu::MoeExpertPathCounts().stream_direct;
    for (std::vector<float>* dst : {&got, &again}) {
      CUDA_OK(cudaMemset(d_out.ptr, 0xff, T * L * 4));
      absl::Status st = gpu::MoeExpertStep(pr, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      CUDA_OK(cudaDeviceSynchronize());
      CUDA_OK(cudaMemcpy(dst->data(), d_out.ptr, T * L * 4, cudaMemcpyDeviceToHost));
    }
    EXPECT_EQ(std::memcmp(got.data(), again.data(), T * L * 4), 0) << "two repacked runs differ";
    // When that step took the direct GEMV: its two forms (moe_stream_direct.cu's block a unit,
    // moe_stream_direct_warp.cu's warp a unit; down, gate/up, both; a unit one pair's or all of an
    // expert's pairs), the warp form also on a grid of two blocks so that each warp walks several
    // units, must give the same bits as the run above, whichever form it took. The workspace (h, y,
    // pos) is poisoned too, so that a row a form leaves unwritten shows.
    if (gpu::MoeExpertPathCounts().stream_direct > direct_before) {
      // mask (MOESHARD_MOE_DIRECT_WARP: 1 down, 2 gate/up, 4 an expert's pairs a unit — 4 alone: the
      // block form's units grouped, 5 and 6 each form grouped in one launch), grid cap
      constexpr int kForms[][2] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {3, 2}, {4, 0}, {5, 0}, {6, 0}, {7, 0}, {7, 2}};
      for (const auto& [mask, max_blocks] : kForms) {
        CUDA_OK(cudaMemset(d_out.ptr, 0xff, T * L * 4));
        CUDA_OK(cudaMemset(d_ws.ptr, 0xff, ws_bytes));
        gpu::SetMoeDirectWarpFormForTest(mask, max_blocks);
        absl::Status st = gpu::MoeExpertStep(pr, nullptr);
        gpu::SetMoeDirectWarpFormForTest(-1);
        ASSERT_TRUE(st.ok()) << st;
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(again.data(), d_out.ptr, T * L * 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(std::memcmp(got.data(), again.data(), T * L * 4), 0)
            << "the direct GEMV's forms differ (MOESHARD_MOE_DIRECT_WARP=" << mask << ", grid cap " << max_blocks
            << ")";
      }
      g_direct_forms_compared.insert(s.name);
      if (T == 1 && s.E == s.E_total && !norm) {
        CompareDownResidual(pr, rng);
        g_down_residual_compared.insert(s.name);
      }
    }
    results.push_back(got);
  }

  double worst = 0;
  int64_t bad = 0;
  for (size_t which = 0; which < results.size(); ++which) {
    for (int64_t t = 0; t < T; ++t) {
      const float* g = results[which].data() + t * L;
      const float* r = want.data() + t * L;
      double max_ref = 0, max_err = 0, ss_ref = 0, ss_err = 0;
      bool nan = false;
      for (int64_t i = 0; i < L; ++i) {
        nan |= std::isnan(g[i]);
        max_ref = std::max(max_ref, std::fabs(double(r[i])));
        max_err = std::max(max_err, std::fabs(double(g[i]) - r[i]));
        ss_ref += double(r[i]) * r[i];
        ss_err += (double(g[i]) - r[i]) * (double(g[i]) - r[i]);
      }
      double err;
      bool ok;
      if (max_ref == 0) {  // no local expert: exact zeros
        err = max_err;
        ok = !nan && max_err == 0;
      } else if (act == ActDType::kF32) {
        err = max_err / max_ref;
        ok = !nan && err <= 2e-5;
      } else {
        err = std::sqrt(ss_err / ss_ref);
        ok = !nan && err <= 2e-2;
      }
      worst = std::max(worst, nan ? INFINITY : err);
      if (!ok && bad++ < 3) {
        ADD_FAILURE() << (which ? "repacked: " : "") << "token " << t << ": error " << err << (nan ? " (NaN)" : "");
      }
    }
  }
  EXPECT_EQ(bad, 0);
  const int repacked = results.size() > 1;
  std::printf("  %-16s %-5s act=%-4s norm=%d all_fast=%d repacked=%d wgmma=%d  worst row error %.3g\n", s.name,
              WeightFormatName(f), act == ActDType::kF32 ? "f32" : "bf16", int(norm), int(all_fast), int(repacked),
              int(wgmma_room && act == ActDType::kBF16), worst);
}

class MoeExpertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(MoeExpertTest, MatchesCpuReference) {
  std::mt19937 rng(5);
  for (const Shape& s : kShapes) {
    for (WeightFormat f : kFormats) {
      for (ActDType act : {ActDType::kF32, ActDType::kBF16}) {
        for (bool norm : {false, true}) {
          SCOPED_TRACE(std::string(s.name) + " " + WeightFormatName(f) + (act == ActDType::kF32 ? " f32" : " bf16") +
                       (norm ? " norm" : ""));
          RunCase(s, f, act, norm, rng);
        }
      }
    }
  }
  // The paths the shapes above are there for ran (the counts are the dispatcher's own): the
  // streaming kernels over repacked experts, the wgmma GEMMs, the direct GEMV over stored blocks,
  // the direct GEMV over the repacked layouts — never with MOESHARD_MOE_STREAM_DIRECT=0
  // (moe_expert_test_no_stream_direct).
  const gpu::MoePathCounts n = gpu::MoeExpertPathCounts();
  std::printf(
      "  paths: %llu steps, %llu repacked (%llu direct, %llu wgmma, %llu of them paired, %llu split), %llu direct "
      "stored, %llu wgmma (%llu from repacked), %llu generic\n",
      static_cast<unsigned long long>(n.steps), static_cast<unsigned long long>(n.stream),
      static_cast<unsigned long long>(n.stream_direct), static_cast<unsigned long long>(n.stream_wgmma),
      static_cast<unsigned long long>(n.stream_wgmma_pair), static_cast<unsigned long long>(n.stream_split),
      static_cast<unsigned long long>(n.direct), static_cast<unsigned long long>(n.wgmma),
      static_cast<unsigned long long>(n.wgmma_repacked), static_cast<unsigned long long>(n.generic));
  EXPECT_GT(n.stream, 0u);
  EXPECT_GT(n.direct, 0u);
  EXPECT_GT(n.wgmma, 0u);
  EXPECT_GT(n.generic, 0u);
  // MOESHARD_MOE_WGMMA_REPACKED=1 (moe_expert_test_wgmma_repacked): the prefill shapes' repacked
  // MXFP4 and Q8_0 experts through the wgmma GEMMs.
  const char* wr = std::getenv("MOESHARD_MOE_WGMMA_REPACKED");
  if (wr != nullptr && std::string(wr) == "1") {
    EXPECT_GT(n.wgmma_repacked, 0u) << "MOESHARD_MOE_WGMMA_REPACKED=1, yet no step expanded repacked experts";
  } else {
    EXPECT_EQ(n.wgmma_repacked, 0u);
  }
  // The prefill shapes' repacked NVFP4 / MXFP4 experts through the wgmma GEMMs over decoded
  // registers (moe_stream_wgmma.cu) on Hopper, never with MOESHARD_MOE_STREAM_WGMMA=0.
  const char* sw = std::getenv("MOESHARD_MOE_STREAM_WGMMA");
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  // Below the rows that send every expert there, each expert by its own rows (a split step; off by
  // default): ctest's moe_expert_test_stream_split puts the all-threshold out of reach and splits at
  // 48 rows, so "stream wgmma"'s ~50 rows an expert fill both sides and every prefill shape splits.
  // Never at the defaults, with MOESHARD_MOE_SW_SPLIT_ROWS=0, or when
  // MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 sends every step there.
  const char* split_rows = std::getenv("MOESHARD_MOE_SW_SPLIT_ROWS");
  const char* min_rows = std::getenv("MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS");
  const bool split_expected = split_rows != nullptr && *split_rows && std::atoi(split_rows) > 0 &&
                              !(min_rows != nullptr && *min_rows && std::atoll(min_rows) <= 1);
  // The pair step (the two-CTA 32-token kernel beside the 128-token one, MoeWork::sw_pair; by the
  // rule at the defaults): ctest's moe_expert_test_stream_wgmma_pair forces it at every wgmma size
  // (MOESHARD_MOE_SW_PAIR=3, or 4 with the 128-token kernel first, and
  // MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1), so every prefill shape takes
  // it and those with experts past 32 rows ("prefill", "many tiles") fill its second kernel. Never
  // with MOESHARD_MOE_SW_PAIR=0 or an item size forced (MOESHARD_MOE_SW_TOK); by the rule (1, 2; 2 the
  // default) only where it expects at most 32 rows an expert, which none of these shapes need hit.
  const char* pair = std::getenv("MOESHARD_MOE_SW_PAIR");
  const char* tok = std::getenv("MOESHARD_MOE_SW_TOK");
  const int pair_mode = pair != nullptr && *pair ? std::atoi(pair) : 2;
  const bool pair_off = pair_mode == 0 || (tok != nullptr && *tok && std::atoi(tok) != 0);
  const bool all_rows = min_rows != nullptr && *min_rows && std::atoll(min_rows) == 1;
  if ((sw != nullptr && std::string(sw) == "0") || prop.major != 9) {
    EXPECT_EQ(n.stream_wgmma, 0u);
    EXPECT_EQ(n.stream_split, 0u);
    EXPECT_EQ(n.stream_wgmma_pair, 0u);
  } else {
    if (pair_off) {
      EXPECT_EQ(n.stream_wgmma_pair, 0u) << "the pair step is off, yet a step took it";
    } else if (all_rows && pair_mode >= 3) {
      EXPECT_GT(n.stream_wgmma_pair, 0u) << "the pair step forced, yet no step took the two-CTA 32-token kernel";
    } else if (all_rows && (pair_mode == 1 || pair_mode == 2)) {
      // By the rule: "tp window" (148 pairs over 12 experts, ~12 rows an expert, past the direct
      // GEMV's 64 pairs) expects at most 32 rows an expert once every step is on the wgmma GEMMs.
      EXPECT_GT(n.stream_wgmma_pair, 0u) << "the rule expects <= 32 rows an expert for \"tp window\", yet no step "
                                            "took the pair step";
    }
    const bool all_out_of_reach = min_rows != nullptr && *min_rows && std::atoll(min_rows) >= 1000000;
    if (all_out_of_reach) {
      EXPECT_EQ(n.stream_wgmma, 0u);
    } else {
      EXPECT_GT(n.stream_wgmma, 0u) << "no step took the wgmma GEMMs over repacked experts";
    }
    if (split_expected) {
      EXPECT_GT(n.stream_split, 0u) << "no step split its experts between the streaming kernels and wgmma";
    } else {
      EXPECT_EQ(n.stream_split, 0u) << "the split is off, yet a step split its experts";
    }
  }
  const char* sd = std::getenv("MOESHARD_MOE_STREAM_DIRECT");
  if (sd != nullptr && std::string(sd) == "0") {
    EXPECT_EQ(n.stream_direct, 0u)
        << "MOESHARD_MOE_STREAM_DIRECT=0, yet a step took the direct GEMV over repacked experts";
  } else {
    EXPECT_GT(n.stream_direct, 0u) << "no step took the direct GEMV over repacked experts";
    for (const char* name : {"repacked decode", "qwen decode", "crowded decode", "crowded part", "latent decode"}) {
      EXPECT_EQ(g_direct_forms_compared.count(name), 1u)
          << "\"" << name << "\" did not compare the direct GEMV's forms";
    }
    for (const char* name : {"one token", "qwen one token"}) {
      EXPECT_EQ(g_down_residual_compared.count(name), 1u)
          << "\"" << name << "\" did not compare the residual update inside down";
    }
    if (!DownResidualOff()) {
      EXPECT_GT(n.down_residual, 0u) << "no step took the residual update inside down";
    }
  }
}

// The route's grouping, checked directly (every other case checks it only through the results): at
// 20,800 (token, slot) pairs — each of the route's warps walks more than one 1,024-pair round — every
// pair of a local expert lands at its expert's offset plus its rank among that expert's pairs in pair
// order, experts in order from row 0, and every other pair at -1; with the ids 16-byte aligned (the
// route's vector loads) and one element past (its scalar loads).
TEST_F(MoeExpertTest, RouteGroupsEveryPairInOrder) {
  std::mt19937 rng(11);
  const int E = 8, E_total = 64, top_k = 8;
  const int64_t T = 2600, L = 256, I = 256, pairs = T * top_k;
  std::vector<TestWeight> tw(3 * E);
  std::vector<gpu::MoeExpertWeights> dev(E);
  for (int e = 0; e < E; ++e) {
    MakeWeight(WeightFormat::kBF16, I, L, 0, true, rng, tw[3 * e]);
    MakeWeight(WeightFormat::kBF16, I, L, 0, true, rng, tw[3 * e + 1]);
    MakeWeight(WeightFormat::kBF16, L, I, 0, true, rng, tw[3 * e + 2]);
    dev[e] = {tw[3 * e].dev, tw[3 * e + 1].dev, tw[3 * e + 2].dev};
  }
  std::vector<int32_t> ids(pairs);
  std::vector<float> wts(pairs, 0.5f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(E_total);
    for (int i = 0; i < E_total; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    for (int k = 0; k < top_k; ++k) ids[t * top_k + k] = all[k] < E ? all[k] : -1;
  }
  // The expected positions: experts in order, each expert's pairs in pair order.
  std::vector<int32_t> count(E, 0), offset(E + 1, 0), want(pairs, -1);
  for (int32_t id : ids) {
    if (id >= 0) ++count[id];
  }
  for (int e = 0; e < E; ++e) offset[e + 1] = offset[e] + count[e];
  std::vector<int32_t> next(offset.begin(), offset.end() - 1);
  for (int64_t i = 0; i < pairs; ++i) {
    if (ids[i] >= 0) want[i] = next[ids[i]]++;
  }
  ASSERT_GT(offset[E], 0) << "no local pair drawn";
  std::vector<uint16_t> x(T * L);
  for (auto& v : x) v = F32ToBf16(std::normal_distribution<float>(0.f, 1.f)(rng));
  const uint32_t hint = gpu::MoeExpertFormats(dev.data(), E, L, I);
  const size_t ws_bytes = gpu::MoeExpertWorkspaceBytes(E, L, I, T, top_k, hint);
  DeviceMem d_experts(sizeof(gpu::MoeExpertWeights) * E), d_ids(pairs * 4 + 4), d_w(pairs * 4), d_x(T * L * 2),
      d_out(T * L * 4), d_ws(ws_bytes);
  CUDA_OK(cudaMemcpy(d_experts.ptr, dev.data(), sizeof(gpu::MoeExpertWeights) * E, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_w.ptr, wts.data(), pairs * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_x.ptr, x.data(), T * L * 2, cudaMemcpyHostToDevice));
  for (int shift : {0, 1}) {
    SCOPED_TRACE(shift ? "ids one element past a 16-byte boundary" : "ids 16-byte aligned");
    int32_t* ids_dev = static_cast<int32_t*>(d_ids.ptr) + shift;
    CUDA_OK(cudaMemcpy(ids_dev, ids.data(), pairs * 4, cudaMemcpyHostToDevice));
    gpu::MoeExpertParams p;
    p.experts = static_cast<const gpu::MoeExpertWeights*>(d_experts.ptr);
    p.num_local_experts = E;
    p.num_total_experts = E_total;
    p.width = L;
    p.inter = I;
    p.num_tokens = T;
    p.top_k = top_k;
    p.expert_ids = ids_dev;
    p.weights = static_cast<const float*>(d_w.ptr);
    p.x = d_x.ptr;
    p.act_dtype = ActDType::kBF16;
    p.out = static_cast<float*>(d_out.ptr);  // not written without the combine
    p.workspace = d_ws.ptr;
    p.workspace_bytes = ws_bytes;
    p.expert_formats = hint;
    CUDA_OK(cudaMemset(d_ws.ptr, 0x7f, ws_bytes));  // positions the route leaves unwritten show
    absl::StatusOr<gpu::MoeExpertRows> rows = gpu::MoeExpertStepRows(p, nullptr);
    ASSERT_TRUE(rows.ok()) << rows.status();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<int32_t> got(pairs);
    CUDA_OK(cudaMemcpy(got.data(), rows->pos, pairs * 4, cudaMemcpyDeviceToHost));
    int64_t wrong = 0;
    for (int64_t i = 0; i < pairs; ++i) {
      if (got[i] != want[i] && wrong++ < 5) ADD_FAILURE() << "pair " << i << ": at " << got[i] << ", want " << want[i];
    }
    EXPECT_EQ(wrong, 0) << "pairs out of place";
  }
}

}  // namespace
}  // namespace moeshard
