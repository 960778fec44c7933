// Multi-rank test helpers: a group of communicators of either implementation, and one
// thread per rank. Both implementations must meet the same contract (communicator.h).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/comm/communicator.h"
#include "common/comm/gloo_communicator.h"
#include "common/comm/kv_store.h"
#include "common/comm/local_communicator.h"

#define EXPECT_OK(expr)                   \
  do {                                    \
    const absl::Status status_ = (expr);  \
    EXPECT_TRUE(status_.ok()) << status_; \
  } while (0)
#define ASSERT_OK(expr)                   \
  do {                                    \
    const absl::Status status_ = (expr);  \
    ASSERT_TRUE(status_.ok()) << status_; \
  } while (0)

namespace moeshard::testing {

enum class Impl { kLocal, kGloo };

inline std::string ImplName(Impl impl) { return impl == Impl::kLocal ? "Local" : "Gloo"; }

// Calls fn(rank) on one thread per rank and joins them all.
template <typename Fn>
void RunRanks(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

// A fresh group of `size` ranks with the given per-operation timeout; empty on failure.
// Gloo ranks rendezvous concurrently over loopback through one InMemoryKvStore, each
// group under its own prefix.
inline std::vector<std::unique_ptr<Communicator>> MakeGroup(Impl impl, int size,
                                                            std::chrono::milliseconds timeout) {
  std::vector<std::unique_ptr<Communicator>> comms(size);
  if (impl == Impl::kLocal) {
    std::shared_ptr<LocalGroup> group = LocalGroup::Create(size);
    for (int r = 0; r < size; ++r) {
      comms[r] = group->Rank(r);
      comms[r]->set_timeout(timeout);
    }
    return comms;
  }
  static std::atomic<int> num_groups{0};
  const std::string prefix = absl::StrCat("test_group_", num_groups++);
  InMemoryKvStore store;
  std::vector<absl::Status> errors(size);
  RunRanks(size, [&](int r) {
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        CreateGlooCommunicator(&store, prefix, r, size, "127.0.0.1", timeout);
    if (comm.ok()) {
      comms[r] = std::move(*comm);
    } else {
      errors[r] = comm.status();
    }
  });
  for (int r = 0; r < size; ++r) {
    if (!errors[r].ok()) {
      ADD_FAILURE() << "rank " << r << ": " << errors[r];
      return {};
    }
  }
  return comms;
}

inline double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace moeshard::testing
