#include "cli/up_pools.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace moeshard {
namespace {

enum class Kind { kString, kInt };
enum class Target { kSelf, kWorker, kCoordinator };
struct Key {
  const char* name;
  Kind kind;
  Target target;
  int64_t min = 0;                     // kInt: the least value
  std::vector<const char*> allowed{};  // kString: the values allowed (empty: any non-empty)
};

const std::vector<Key>& Keys() {
  static const std::vector<Key> keys = {
      {"name", Kind::kString, Target::kSelf},
      {"max_model_len", Kind::kInt, Target::kSelf, 0},
      {"replicas", Kind::kInt, Target::kSelf, 1},
      {"workers", Kind::kInt, Target::kSelf, 1},
      {"mode", Kind::kString, Target::kSelf, 0, {"layer-split", "tensor-parallel"}},
      {"layer_split", Kind::kString, Target::kSelf},
      {"kv_dtype", Kind::kString, Target::kWorker, 0, {"auto", "float32", "bfloat16", "fp8"}},
      {"expert_layout", Kind::kString, Target::kWorker, 0, {"auto", "stream", "stored"}},
      {"dtype", Kind::kString, Target::kWorker, 0, {"float32", "bfloat16"}},
      {"max_batch_tokens", Kind::kInt, Target::kWorker, 1},
      {"num_kv_blocks", Kind::kInt, Target::kCoordinator, 1},
      {"num_sliding_kv_blocks", Kind::kInt, Target::kCoordinator, 1},
      {"max_num_seqs", Kind::kInt, Target::kCoordinator, 1},
      {"max_tokens_per_step", Kind::kInt, Target::kCoordinator, 1},
  };
  return keys;
}

std::string KnownKeys() {
  std::vector<std::string> names;
  for (const Key& k : Keys()) names.push_back(k.name);
  return absl::StrJoin(names, ", ");
}

std::string Flag(const char* key) {
  std::string f = key;
  for (char& c : f) c = c == '_' ? '-' : c;
  return f;
}

absl::StatusOr<UpPool> ParsePool(const nlohmann::json& e, size_t index) {
  if (!e.is_object())
    return absl::InvalidArgumentError(absl::StrCat("pools config: pool ", index, " is not an object"));
  if (!e.contains("name") || !e["name"].is_string() || e["name"].get<std::string>().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("pools config: pool ", index, " needs a name (a non-empty string)"));
  }
  UpPool p;
  p.name = e["name"].get<std::string>();
  const std::string where = absl::StrCat("pools config: pool ", p.name, ": ");
  for (const auto& [k, v] : e.items()) {
    const Key* key = nullptr;
    for (const Key& c : Keys()) key = k == c.name ? &c : key;
    if (key == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(where, "unknown key \"", k, "\" (known: ", KnownKeys(), ")"));
    std::string value;
    int64_t n = 0;
    if (key->kind == Kind::kInt) {
      if (!v.is_number_integer()) return absl::InvalidArgumentError(absl::StrCat(where, k, " must be an integer"));
      n = v.get<int64_t>();
      if (n < key->min)
        return absl::InvalidArgumentError(absl::StrCat(where, k, " must be >= ", key->min, " (got ", n, ")"));
      value = std::to_string(n);
    } else {
      if (!v.is_string()) return absl::InvalidArgumentError(absl::StrCat(where, k, " must be a string"));
      value = v.get<std::string>();
      if (!key->allowed.empty()) {
        bool ok = false;
        for (const char* a : key->allowed) ok |= value == a;
        if (!ok) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, k, " \"", value, "\" is not one of ", absl::StrJoin(key->allowed, ", ")));
        }
      }
    }
    const std::string_view name = key->name;
    if (key->target == Target::kWorker) {
      p.worker_flags.emplace_back(Flag(key->name), value);
    } else if (key->target == Target::kCoordinator) {
      p.coordinator_flags.emplace_back(Flag(key->name), value);
    } else if (name == "max_model_len") {
      p.max_model_len = n;
    } else if (name == "replicas") {
      p.replicas = n;
    } else if (name == "workers") {
      p.workers = n;
    } else if (name == "mode") {
      p.mode = value;
    } else if (name == "layer_split") {
      p.layer_split = value;
    }
  }
  return p;
}

}  // namespace

absl::StatusOr<std::vector<UpPool>> ParseUpPools(std::string_view json) {
  const auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("pools") || !j["pools"].is_array() || j["pools"].empty()) {
    return absl::InvalidArgumentError("pools config: needs {\"pools\": [ ... ]} with at least one pool");
  }
  for (const auto& [k, v] : j.items()) {
    if (k != "pools")
      return absl::InvalidArgumentError(absl::StrCat("pools config: unknown top-level key \"", k, "\""));
  }
  std::vector<UpPool> pools;
  std::set<std::string> names;
  for (size_t i = 0; i < j["pools"].size(); ++i) {
    absl::StatusOr<UpPool> p = ParsePool(j["pools"][i], i);
    if (!p.ok()) return p.status();
    if (!names.insert(p->name).second)
      return absl::InvalidArgumentError(absl::StrCat("pools config: pool name ", p->name, " repeats"));
    pools.push_back(*std::move(p));
  }
  return pools;
}

FlagValue PoolFlag(const std::vector<std::pair<std::string, std::string>>& pool_flags, std::string_view flag,
                   FlagValue fallback) {
  for (const auto& [f, v] : pool_flags) {
    if (f == flag) return {true, v};
  }
  return fallback;
}

absl::StatusOr<FlagValue> StepTokensFlag(std::string_view pool, bool gpu, const FlagValue& step,
                                         const FlagValue& batch) {
  if (!gpu) return step;
  int64_t most = kGpuMaxBatchTokens;
  if (batch.has && (!absl::SimpleAtoi(batch.value, &most) || most < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool ", std::string(pool), ": --max-batch-tokens must be a positive count (got \"", batch.value, "\")"));
  }
  if (!step.has) return FlagValue{true, std::to_string(std::min(kGpuStepTokens, most))};
  int64_t n = 0;
  if (!absl::SimpleAtoi(step.value, &n) || n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool ", std::string(pool), ": --max-tokens-per-step must be a positive count (got \"", step.value, "\")"));
  }
  if (n > most) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool ", std::string(pool), ": --max-tokens-per-step ", n, " exceeds the GPU workers' --max-batch-tokens ", most,
        " (a GPU worker refuses a larger step): raise --max-batch-tokens or lower --max-tokens-per-step"));
  }
  return step;
}

}  // namespace moeshard
