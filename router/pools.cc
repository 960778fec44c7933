#include "router/pools.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "router/api_error.h"

namespace moeshard::router {
namespace {

using Json = nlohmann::json;

absl::StatusOr<PoolConfig> ParsePool(const Json& p, size_t idx) {
  const std::string where = absl::StrCat("pools[", idx, "]");
  if (!p.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
  PoolConfig pool;
  auto name = p.find("name");
  if (name == p.end() || !name->is_string() || name->get<std::string>().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".name must be a non-empty string"));
  }
  pool.name = name->get<std::string>();
  const std::string named = absl::StrCat("pool '", pool.name, "'");
  auto len = p.find("max_model_len");
  if (len != p.end() && !len->is_null()) {  // absent or 0: what the coordinators report
    if (!len->is_number_integer() || len->get<int64_t>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(named, ": max_model_len must be an integer >= 0"));
    }
    pool.max_model_len = len->get<int64_t>();
  }
  auto coords = p.find("coordinators");
  if (coords == p.end() || !coords->is_array() || coords->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(named, ": coordinators must be a non-empty list of host:port"));
  }
  for (const Json& c : *coords) {
    if (!c.is_string() || c.get<std::string>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(named, ": coordinators must be strings host:port"));
    }
    pool.coordinators.push_back(c.get<std::string>());
  }
  return pool;
}

}  // namespace

absl::StatusOr<std::vector<PoolConfig>> ParsePoolsConfig(std::string_view json_text) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("pools config is not valid JSON");
  if (!j.is_object() || !j.contains("pools") || !j["pools"].is_array() || j["pools"].empty()) {
    return absl::InvalidArgumentError("pools config must be {\"pools\": [ ... ]} with at least one pool");
  }
  std::vector<PoolConfig> pools;
  std::set<std::string> names, addresses;
  for (size_t i = 0; i < j["pools"].size(); ++i) {
    auto pool = ParsePool(j["pools"][i], i);
    if (!pool.ok()) return pool.status();
    if (!names.insert(pool->name).second)
      return absl::InvalidArgumentError(absl::StrCat("pool name '", pool->name, "' appears twice"));
    for (const std::string& a : pool->coordinators) {
      if (!addresses.insert(a).second)
        return absl::InvalidArgumentError(absl::StrCat("coordinator ", a, " appears twice"));
    }
    pools.push_back(*std::move(pool));
  }
  std::stable_sort(pools.begin(), pools.end(),
                   [](const PoolConfig& a, const PoolConfig& b) { return a.max_model_len < b.max_model_len; });
  return pools;
}

absl::StatusOr<std::vector<PoolConfig>> LoadPoolsConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read pools config ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto pools = ParsePoolsConfig(ss.str());
  if (!pools.ok()) return absl::Status(pools.status().code(), absl::StrCat(path, ": ", pools.status().message()));
  return pools;
}

absl::StatusOr<DispatchChoice> ChooseDispatch(const std::vector<PoolView>& pools, int64_t prompt_tokens,
                                              std::optional<int64_t> max_tokens) {
  const int64_t needed = prompt_tokens + max_tokens.value_or(1);
  int64_t largest = 0;
  for (const PoolView& p : pools) largest = std::max(largest, p.max_model_len);
  if (largest == 0) return absl::UnavailableError("no coordinator pool is ready yet");
  if (needed > largest) {
    const std::string msg =
        max_tokens
            ? absl::StrCat("This model's maximum context length is ", largest, " tokens. However, you requested ",
                           needed, " tokens (", prompt_tokens, " in the prompt, ", *max_tokens,
                           " for the completion). Please reduce the length of the prompt or the completion.")
            : absl::StrCat("This model's maximum context length is ", largest, " tokens. However, your prompt has ",
                           prompt_tokens, " tokens, which leaves no room for the completion.");
    return WithErrorCode(absl::InvalidArgumentError(msg), "context_length_exceeded");
  }
  // Pools from the smallest context up; ties keep their order.
  std::vector<size_t> order(pools.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return pools[a].max_model_len < pools[b].max_model_len; });
  for (bool with_room : {true, false}) {
    for (size_t pi : order) {
      const PoolView& pool = pools[pi];
      if (pool.max_model_len < needed) continue;
      std::optional<size_t> best;
      for (size_t ci = 0; ci < pool.coordinators.size(); ++ci) {
        const CoordinatorView& c = pool.coordinators[ci];
        if (!c.ready || (c.max_model_len > 0 && c.max_model_len < needed) || (with_room && c.queue_full)) continue;
        if (!best || c.load_tokens < pool.coordinators[*best].load_tokens) best = ci;
      }
      if (!best) continue;
      DispatchChoice choice{.pool_idx = pi, .coordinator_idx = *best};
      if (max_tokens) {
        choice.max_tokens = *max_tokens;
      } else {
        int64_t len = pool.max_model_len;
        const int64_t reported = pool.coordinators[*best].max_model_len;
        if (reported > 0) len = std::min(len, reported);
        choice.max_tokens = len - prompt_tokens;
      }
      return choice;
    }
  }
  return absl::UnavailableError(absl::StrCat("no ready coordinator pool can serve ", needed, " tokens right now"));
}

}  // namespace moeshard::router
