// `moeshard bench-model`: prefill and decode throughput of a random-weight model on a GPU
// (worker/model_bench.h). The shape comes from make-model's presets and overrides, e.g. a
// Qwen3-30B-A3B-shaped model: --arch qwen3_moe --preset full-layer --layers 48.
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/flags/args.h"
#include "cli/commands.h"
#include "eval/random_model.h"
#include "worker/runner_flags.h"
#include "common/status.h"
#include "worker/model_bench.h"

namespace moeshard {
namespace {

constexpr char kBenchModelUsage[] =
    "usage: moeshard bench-model --arch muse_spark|qwen3_moe [--preset tiny|small|full-layer] [--layers N]\n"
    "       [--experts E] [--top-k K] [--hidden H] [--vocab V] [--expert-format nvfp4|mxfp4|q8_0|bf16]\n"
    "       [--dense-format bf16|q8_0]\n"
    "       [--prompt-len 4096] [--decode-steps 32] [--streams 1,4] [--gpu N] [--dtype bfloat16|float32]\n"
    "       [--kv-dtype auto|bfloat16|fp8] [--expert-layout auto|stream|stored] [--seed S]\n"
    "  weights are random and made on the GPU; prints a table of each phase against its floor\n";

absl::StatusOr<WeightFormat> ParseFormat(const std::string& s) {
  if (s == "nvfp4") return WeightFormat::kNVFP4;
  if (s == "mxfp4") return WeightFormat::kMXFP4;
  if (s == "q8_0") return WeightFormat::kQ8_0;
  if (s == "bf16") return WeightFormat::kBF16;
  return absl::InvalidArgumentError("--expert-format must be nvfp4, mxfp4, q8_0 or bf16");
}

absl::Status RunBenchModel(const Args& a) {
  RandomModelSpec spec;
  spec.arch = a.Get("arch", "muse_spark");
  spec.preset = a.Get("preset", "full-layer");
  for (const char* k : {"layers", "vocab", "hidden", "experts", "top-k", "intermediate", "latent"}) {
    ASSIGN_OR_RETURN(int64_t v, a.GetInt(k, 0));
    if (v < 0) return absl::InvalidArgumentError(absl::StrCat("--", k, " must be positive"));
    if (v > 0) spec.overrides[k] = v;
  }
  ASSIGN_OR_RETURN(auto hf, RandomModelConfig(spec));
  ASSIGN_OR_RETURN(ModelConfig config, ParseHfConfig(hf));
  ModelBenchOptions o;
  RunnerOptions base;
  base.device = Device::kCuda;
  ASSIGN_OR_RETURN(o.runner, ParseRunnerFlags(a, base));
  ASSIGN_OR_RETURN(o.expert_format, ParseFormat(a.Get("expert-format", "nvfp4")));
  const std::string dense = a.Get("dense-format", "bf16");
  if (dense != "bf16" && dense != "q8_0") return absl::InvalidArgumentError("--dense-format must be bf16 or q8_0");
  o.dense_format = dense == "q8_0" ? WeightFormat::kQ8_0 : WeightFormat::kBF16;
  ASSIGN_OR_RETURN(o.prompt_len, a.GetInt("prompt-len", 4096));
  ASSIGN_OR_RETURN(o.decode_steps, a.GetInt("decode-steps", 32));
  ASSIGN_OR_RETURN(int64_t seed, a.GetInt("seed", 1));
  o.seed = static_cast<uint64_t>(seed);
  if (o.prompt_len < 1 || o.decode_steps < 2) return absl::InvalidArgumentError("--prompt-len must be >= 1 and --decode-steps >= 2");
  if (a.Has("streams")) {
    o.streams.clear();
    for (auto piece : absl::StrSplit(a.Get("streams"), ',', absl::SkipEmpty())) {
      int64_t s;
      if (!absl::SimpleAtoi(piece, &s) || s < 1) return absl::InvalidArgumentError("--streams needs positive integers");
      o.streams.push_back(s);
    }
    if (o.streams.empty()) return absl::InvalidArgumentError("--streams is empty");
  }
  ASSIGN_OR_RETURN(std::string report, RunModelBench(config, o));
  std::fputs(report.c_str(), stdout);
  return absl::OkStatus();
}

}  // namespace

int BenchModelCommand(const std::vector<std::string>& argv) {
  auto a = Args::Parse(argv,
                       {"arch", "preset", "layers", "vocab", "hidden", "experts", "top-k", "intermediate", "latent",
                        "expert-format", "dense-format", "prompt-len", "decode-steps", "streams", "seed", "device", "gpu", "dtype",
                        "kv-dtype", "expert-layout", "max-batch-tokens"},
                       {"help"});
  if (!a.ok() || a->Flag("help")) {
    std::fprintf(stderr, "%s%s\n", kBenchModelUsage, a.ok() ? "" : std::string(a.status().message()).c_str());
    return a.ok() ? 0 : 2;
  }
  absl::Status st = RunBenchModel(*a);
  if (!st.ok()) {
    std::fprintf(stderr, "bench-model: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace moeshard
