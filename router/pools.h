// Coordinator pools and the dispatch choice. Pure functions, no I/O beyond reading the
// config file.
//
// A pool is a set of coordinators that serve the same model with the same context length
// (max_model_len). A request needs prompt_tokens + max_tokens positions; it goes to the
// smallest ready pool that holds them, and there to the ready coordinator with the least
// load (the tokens it reports outstanding plus those this router has in flight to it).
// Coordinators whose queue has room come first, in any fitting pool: only when every fitting
// coordinator reports a full queue does the request go to one of them (which then decides,
// and refuses it with 503 + Retry-After if it is still full).
// Without max_tokens the request fills the context of the pool it lands in, so it needs
// one free position to be dispatched.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace moeshard::router {

struct PoolConfig {
  std::string name;
  int64_t max_model_len = 0;              // 0 = the largest its coordinators report
  std::vector<std::string> coordinators;  // host:port
};

// {"pools": [{"name": "32k", "max_model_len": 32768, "coordinators": ["127.0.0.1:5000"]}]}
// max_model_len may be left out (or 0): then the pool's length is what its coordinators
// report in GetStatus. Errors name the offending pool: missing or mistyped keys, duplicate
// names or addresses, a negative max_model_len, no coordinators. The result is sorted by
// max_model_len.
absl::StatusOr<std::vector<PoolConfig>> ParsePoolsConfig(std::string_view json_text);
absl::StatusOr<std::vector<PoolConfig>> LoadPoolsConfig(const std::string& path);

// What the dispatcher sees of one coordinator at the moment of the choice.
struct CoordinatorView {
  bool ready = false;
  int64_t load_tokens = 0;    // reported outstanding + this router's in-flight tokens
  int64_t max_model_len = 0;  // as reported; 0 = unknown (no extra limit)
  bool queue_full = false;    // its admission queue is at its bound (as last reported)
};

struct PoolView {
  int64_t max_model_len = 0;  // 0 = unknown yet: the pool cannot take requests
  std::vector<CoordinatorView> coordinators;
};

struct DispatchChoice {
  size_t pool_idx = 0;
  size_t coordinator_idx = 0;
  int64_t max_tokens = 0;  // as asked, or what fills the chosen context
};

// Errors: InvalidArgument with error code "context_length_exceeded" when the request
// does not fit the largest known pool (the message names both counts); Unavailable when
// it fits but no fitting pool has a ready coordinator, or no pool length is known yet.
absl::StatusOr<DispatchChoice> ChooseDispatch(const std::vector<PoolView>& pools, int64_t prompt_tokens,
                                              std::optional<int64_t> max_tokens);

}  // namespace moeshard::router
