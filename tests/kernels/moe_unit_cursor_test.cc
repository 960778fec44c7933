// The direct decode GEMV's walk over its units (kernels/moe/moe_unit_cursor.h), on the CPU: every
// block's cursor, advanced chunk by chunk as moe_stream_direct.cu advances it, must give the
// sequence the definition gives — block b's k-th unit u = b + k · grid is local pair u / R's row tile
// u % R, each nch chunks long — and over all blocks every local pair's row tile exactly once, no
// pair of another GPU's expert ever.
#include "kernels/moe/moe_unit_cursor.h"

#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace moeshard::gpu {
namespace {

struct Visit {
  int pair, rt, j, row;
  bool operator==(const Visit& o) const { return std::tie(pair, rt, j, row) == std::tie(o.pair, o.rt, o.j, o.row); }
};

// The cursor's sequence for block b, as the kernel's loop walks it (Seek once, then Next a chunk).
template <bool kGateUp>
std::vector<Visit> Walk(const std::vector<int32_t>& local, int R, int top_k, int nch, int b, int grid) {
  const int units = static_cast<int>(local.size()) * R;
  const int total = UnitsOfBlock(units, b, grid) * nch;
  std::vector<Visit> out;
  UnitCursor c{b};
  if (total > 0) c.Seek<kGateUp>(local.data(), R, top_k);
  for (int i = 0; i < total; ++i) {
    out.push_back({c.pair, c.rt, c.j, c.row});
    c.Next<kGateUp>(local.data(), R, top_k, nch, units, grid);
  }
  return out;
}

// The definition.
template <bool kGateUp>
std::vector<Visit> Expected(const std::vector<int32_t>& local, int R, int top_k, int nch, int b, int grid) {
  const int units = static_cast<int>(local.size()) * R;
  std::vector<Visit> out;
  for (int u = b; u < units; u += grid) {
    const int pair = local[u / R];
    for (int j = 0; j < nch; ++j) out.push_back({pair, u % R, j, kGateUp ? pair / top_k : pair});
  }
  return out;
}

template <bool kGateUp>
void CheckAll(const std::vector<bool>& here, int R, int top_k, int nch, int grid) {
  std::vector<int32_t> local;
  for (int p = 0; p < static_cast<int>(here.size()); ++p) {
    if (here[p]) local.push_back(p);
  }
  std::set<std::pair<int, int>> seen;
  for (int b = 0; b < grid; ++b) {
    const std::vector<Visit> got = Walk<kGateUp>(local, R, top_k, nch, b, grid);
    ASSERT_EQ(got, (Expected<kGateUp>(local, R, top_k, nch, b, grid)))
        << "block " << b << " of " << grid << ", R " << R << ", nch " << nch << ", " << local.size() << " local pairs";
    for (const Visit& v : got) {
      ASSERT_TRUE(here[v.pair]) << "pair " << v.pair << " is another GPU's";
      if (v.j == 0)
        ASSERT_TRUE(seen.insert({v.pair, v.rt}).second) << "pair " << v.pair << " tile " << v.rt << " twice";
    }
  }
  EXPECT_EQ(seen.size(), local.size() * R) << "some local row tile was never visited";
}

TEST(MoeUnitCursorTest, WalksEveryLocalRowTileOnceAndNoRemoteOne) {
  std::mt19937 rng(7);
  for (const int pairs : {1, 2, 8, 31, 64}) {
    for (const double p_local : {0.0, 0.125, 0.5, 1.0}) {
      std::bernoulli_distribution coin(p_local);
      std::vector<bool> here(pairs);
      for (int i = 0; i < pairs; ++i) here[i] = coin(rng);
      for (const int R : {1, 3, 48, 256}) {
        for (const int nch : {1, 2, 4}) {
          for (const int grid : {1, 7, 132, 528}) {
            CheckAll<true>(here, R, 8, nch, grid);
            CheckAll<false>(here, R, 8, nch, grid);
          }
        }
      }
    }
  }
}

TEST(MoeUnitCursorTest, UnitsOfBlockSplitsTheUnitsOverTheGrid) {
  for (const int units : {0, 1, 5, 384, 2048}) {
    for (const int grid : {1, 3, 528}) {
      int sum = 0;
      for (int b = 0; b < grid; ++b) {
        const int n = UnitsOfBlock(units, b, grid);
        EXPECT_EQ(n, b < units ? (units - b + grid - 1) / grid : 0) << units << " units, block " << b << " of " << grid;
        sum += n;
      }
      EXPECT_EQ(sum, units);
    }
  }
}

}  // namespace
}  // namespace moeshard::gpu
