// Helpers shared by the BlockManager tests (block_manager_test.cc, block_manager_sliding_test.cc).
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace moeshard::testing_blocks {

// begin, begin + 1, ..., end - 1.
inline std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> v(end - begin);
  std::iota(v.begin(), v.end(), begin);
  return v;
}

}  // namespace moeshard::testing_blocks

// Every BlockManager invariant holds (BlockManager::CheckIntegrity), with its error on failure.
#define EXPECT_INTEGRITY(bm) EXPECT_TRUE((bm).CheckIntegrity().ok()) << (bm).CheckIntegrity()
