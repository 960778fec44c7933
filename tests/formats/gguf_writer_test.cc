// GgufWriter read back by GgufFile (values, shapes, alignment, llama.cpp's sequential
// offsets) and the Q8_0 / MXFP4 row quantizers on blocks whose bytes are worked out by hand
// from ggml's reference rules (rounding half away from zero, ties toward zero in MXFP4,
// saturation at 6, all-zero blocks).
#include "common/formats/gguf_writer.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/formats/gguf.h"
#include "common/formats/gguf_quant.h"
#include "gtest/gtest.h"
#include "tests/formats/format_test_util.h"

namespace moeshard {
namespace {

using test::TempDir;

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), 4 * v.size());
}

TEST(GgufWriterTest, RoundTripsThroughTheReader) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  GgufWriter w;
  w.AddString("general.architecture", "qwen3moe");
  w.AddU32("qwen3moe.block_count", 3);
  w.AddF32("qwen3moe.rope.freq_base", 1e6f);
  w.AddBool("tokenizer.ggml.add_bos_token", false);
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "Ġb", ""});
  w.AddI32Array("tokenizer.ggml.token_type", {1, 3, -5});
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(w.AddTensor("a.weight", GgmlType::kF32, {2, 3}, FloatBytes(a)).ok());
  std::string q;
  std::vector<float> row(64, 0.25f);
  QuantizeRowQ8_0(row.data(), 64, &q);
  QuantizeRowQ8_0(row.data(), 64, &q);
  QuantizeRowQ8_0(row.data(), 64, &q);
  ASSERT_TRUE(w.AddTensor("blk.0.ffn_up_exps.weight", GgmlType::kQ8_0, {3, 1, 64}, q).ok());
  const std::string path = dir.Path("w.gguf");
  ASSERT_TRUE(w.Write(path).ok());

  auto g = GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->version(), 3u);
  EXPECT_EQ(*(*g)->GetInt("general.alignment"), 32);
  EXPECT_EQ(*(*g)->GetString("general.architecture"), "qwen3moe");
  EXPECT_EQ(*(*g)->GetInt("qwen3moe.block_count"), 3);
  EXPECT_FLOAT_EQ(*(*g)->GetFloat("qwen3moe.rope.freq_base"), 1e6f);
  EXPECT_FALSE(*(*g)->GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(**(*g)->GetStringArray("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "Ġb", ""}));
  EXPECT_EQ(**(*g)->GetIntArray("tokenizer.ggml.token_type"), (std::vector<int64_t>{1, 3, -5}));
  const TensorInfo* ta = (*g)->Find("a.weight");
  const TensorInfo* tq = (*g)->Find("blk.0.ffn_up_exps.weight");
  ASSERT_NE(ta, nullptr);
  ASSERT_NE(tq, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(tq->shape, (std::vector<int64_t>{3, 1, 64}));
  EXPECT_EQ(tq->dtype, DType::kQ8_0);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(ta->data), ta->nbytes), FloatBytes(a));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(tq->data), tq->nbytes), q);
  // llama.cpp's gguf.cpp: tensor i starts where tensor i-1 ends, padded to the alignment.
  EXPECT_EQ(tq->data - ta->data, 32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta->data) % 32, 0u);
}

TEST(GgufWriterTest, RefusesBadTensorsAndDuplicateKeys) {
  GgufWriter w;
  EXPECT_FALSE(w.AddTensor("x", GgmlType::kQ8_0, {2, 48}, std::string(2 * 51, '\0')).ok());  // 48 % 32 != 0
  EXPECT_FALSE(w.AddTensor("x", GgmlType::kF32, {2, 2}, std::string(12, '\0')).ok());        // 16 bytes needed
  EXPECT_FALSE(w.AddTensor(std::string(64, 'n'), GgmlType::kF32, {1}, std::string(4, '\0')).ok());
  EXPECT_FALSE(w.AddTensor("x", GgmlType::kF32, {1, 1, 1, 1, 1}, std::string(4, '\0')).ok());
  ASSERT_TRUE(w.AddTensor("x", GgmlType::kF32, {1}, std::string(4, '\0')).ok());
  EXPECT_FALSE(w.AddTensor("x", GgmlType::kF32, {1}, std::string(4, '\0')).ok());
  w.AddU32("general.alignment", 64);  // the writer already set it
  TempDir dir;
  EXPECT_FALSE(w.Write(dir.Path("bad.gguf")).ok());
}

TEST(GgufQuantTest, Q8_0RoundsHalfAwayFromZero) {
  std::vector<float> x(32, 0.f);
  x[0] = 127.f;  // amax 127: d = 1 exactly
  x[1] = -63.5f;
  x[2] = 0.5f;
  x[3] = -0.5f;
  x[4] = 2.5f;
  x[5] = 1.49f;
  std::string b;
  QuantizeRowQ8_0(x.data(), 32, &b);
  ASSERT_EQ(b.size(), 34u);
  uint16_t d;
  std::memcpy(&d, b.data(), 2);
  EXPECT_EQ(d, 0x3C00);  // f16 1.0
  const int8_t* q = reinterpret_cast<const int8_t*>(b.data() + 2);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);
  EXPECT_EQ(q[2], 1);
  EXPECT_EQ(q[3], -1);
  EXPECT_EQ(q[4], 3);
  EXPECT_EQ(q[5], 1);
  EXPECT_EQ(q[6], 0);
  // A zero block: d = 0 and all codes 0.
  std::string z;
  std::vector<float> zeros(32, 0.f);
  QuantizeRowQ8_0(zeros.data(), 32, &z);
  EXPECT_EQ(z, std::string(34, '\0'));
}

TEST(GgufQuantTest, Mxfp4PicksNearestCodeTiesTowardZeroAndSaturates) {
  std::vector<float> x(32, 0.f);
  x[0] = 7.5f;    // amax: floor(log2 7.5) = 2 -> e = 127 (scale 1); 7.5 saturates to 6 (code 7)
  x[1] = 5.f;     // tie 4 / 6 -> 4 (code 6)
  x[2] = -1.25f;  // tie -1 / -1.5 -> -1 (code 10)
  x[3] = 0.25f;   // tie 0 / 0.5 -> 0 (code 0)
  x[4] = 2.5f;    // tie 2 / 3 -> 2 (code 4)
  x[5] = -0.1f;   // nearest 0 (code 0, never -0)
  x[16] = -3.2f;  // -3 (code 13), high nibble of byte 0
  x[17] = 1.3f;   // 1.5 (code 3)
  std::string b;
  QuantizeRowMxfp4(x.data(), 32, &b);
  ASSERT_EQ(b.size(), 17u);
  EXPECT_EQ(static_cast<uint8_t>(b[0]), 127);
  auto code = [&](int j) { return j < 16 ? b[1 + j] & 0xf : (static_cast<uint8_t>(b[1 + j - 16]) >> 4); };
  EXPECT_EQ(code(0), 7);
  EXPECT_EQ(code(1), 6);
  EXPECT_EQ(code(2), 10);
  EXPECT_EQ(code(3), 0);
  EXPECT_EQ(code(4), 4);
  EXPECT_EQ(code(5), 0);
  EXPECT_EQ(code(16), 13);
  EXPECT_EQ(code(17), 3);
  EXPECT_EQ(Mxfp4Exponent(0.f), 0);
  EXPECT_EQ(Mxfp4Exponent(1.f), 125);      // 1 = 4 * 2^-2
  EXPECT_EQ(Mxfp4Exponent(0.0625f), 121);  // 2^-4 = 4 * 2^-6
  std::string z;
  std::vector<float> zeros(32, 0.f);
  QuantizeRowMxfp4(zeros.data(), 32, &z);
  EXPECT_EQ(z, std::string(17, '\0'));
}

}  // namespace
}  // namespace moeshard
