// moeshard's GGUF quantizers against llama.cpp's own: tests/testdata/ggml-quant holds rows of
// float32 (random blocks from 1e-30 to 1e30, rounding ties, E2M1 midpoints, saturation) and the
// bytes that gguf-py's numpy quantizers (bit-exact with ggml-quants.c) made of them
// (make_vectors.py). QuantizeRowQ8_0 and QuantizeRowMxfp4 must give the same bytes, block for
// block: a quantizer checked only against itself would pass a shared mistake.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/formats/gguf_quant.h"
#include "gtest/gtest.h"
#include "tests/testdata/testdata_dir.h"

namespace moeshard {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void ExpectSameBytes(const std::string& name, void (*quantize)(const float*, int64_t, std::string*),
                     size_t block_bytes) {
  const std::string dir = test::TestDataDir() + "/ggml-quant/";
  const std::string raw = ReadAll(dir + "input.f32");
  const std::string want = ReadAll(dir + name);
  ASSERT_EQ(raw.size() % (kGgufBlock * sizeof(float)), 0u);
  const size_t num_blocks = raw.size() / (kGgufBlock * sizeof(float));
  ASSERT_GT(num_blocks, 100u);
  ASSERT_EQ(want.size(), num_blocks * block_bytes) << name;
  std::vector<float> x(num_blocks * kGgufBlock);
  std::memcpy(x.data(), raw.data(), raw.size());
  int bad = 0;
  for (size_t b = 0; b < num_blocks; ++b) {
    std::string got;
    quantize(x.data() + b * kGgufBlock, kGgufBlock, &got);
    if (got != want.substr(b * block_bytes, block_bytes)) {
      ADD_FAILURE() << name << ": block " << b << " (first value " << x[b * kGgufBlock] << ") differs from gguf-py";
      if (++bad == 5) return;
    }
  }
  // The whole input as one row gives the blocks in order.
  std::string row;
  quantize(x.data(), static_cast<int64_t>(x.size()), &row);
  EXPECT_EQ(row == want, bad == 0);
}

TEST(GgufQuantRefTest, Q8_0MatchesLlamaCppGgufPy) { ExpectSameBytes("q8_0.bin", QuantizeRowQ8_0, kQ8_0BlockBytes); }

TEST(GgufQuantRefTest, Mxfp4MatchesLlamaCppGgufPy) { ExpectSameBytes("mxfp4.bin", QuantizeRowMxfp4, kMxfp4BlockBytes); }

}  // namespace
}  // namespace moeshard
