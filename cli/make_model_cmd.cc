// `moeshard make-model`: random weights with the real tensor names, any size, written as
// a Hugging Face model folder (config.json, model.safetensors, tokenizer.json,
// generation_config.json) or, with --format gguf (qwen3_moe only), as one GGUF file that
// llama.cpp also loads (see random_model_gguf.h). Tests and benchmarks build their models with it.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/flags/args.h"
#include "cli/commands.h"
#include "eval/random_model.h"
#include "eval/random_model_gguf.h"
#include "common/status.h"

namespace moeshard {
namespace {

// The real Qwen3 tokenizer, beside the repository (see ../shared/testdata/README.md).
constexpr char kQwen3Tokenizer[] = "../shared/testdata/qwen3moe-tok";

}  // namespace

int MakeModelCommand(const std::vector<std::string>& argv) {
  auto args = Args::Parse(argv, {"arch", "preset", "out", "seed", "layers", "vocab", "hidden", "experts", "top-k",
                                 "heads", "kv-heads", "head-dim", "intermediate", "latent", "window", "format",
                                 "expert-type", "dense-type", "tokenizer", "threads"},
                          {"nvfp4", "synthetic", "help"});
  if (!args.ok() || args->Flag("help")) {
    std::fprintf(stderr,
                 "usage: moeshard make-model --arch muse_spark|qwen3_moe --preset tiny|small|full-layer|full --out DIR\n"
                 "       [--nvfp4] [--seed S] [--layers N] [--vocab V] [--hidden H] [--experts E] [--top-k K]\n"
                 "       [--heads N] [--kv-heads N] [--head-dim D] [--intermediate I] [--latent L] [--window W]\n"
                 "       [--format safetensors|gguf]   gguf: --arch qwen3_moe, --out FILE.gguf\n"
                 "       [--expert-type q8_0|mxfp4] [--dense-type bf16|f16|q8_0] [--tokenizer DIR]\n"
                 "       [--synthetic [--threads N]]\n"
                 "       (--tokenizer: a folder with tokenizer.json; default: the byte-level one, or for\n"
                 "        --preset full ../shared/testdata/qwen3moe-tok when present)\n"
                 "       (--synthetic: random codes written straight into the GGUF types, streamed by N threads\n"
                 "        (default: every core); any size. --preset full (qwen3_moe: Qwen3-30B-A3B) implies it)\n%s\n",
                 args.ok() ? "" : std::string(args.status().message()).c_str());
    return args.ok() ? 0 : 2;
  }
  RandomModelSpec spec;
  spec.arch = args->Get("arch", "muse_spark");
  spec.preset = args->Get("preset", "tiny");
  spec.nvfp4 = args->Flag("nvfp4");
  auto st = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(int64_t seed, args->GetInt("seed", 1));
    spec.seed = seed;
    for (const char* k : {"layers", "vocab", "hidden", "experts", "top-k", "heads", "kv-heads", "head-dim",
                          "intermediate", "latent", "window"}) {
      ASSIGN_OR_RETURN(int64_t v, args->GetInt(k, 0));
      if (v < 0) return absl::InvalidArgumentError(absl::StrCat("--", k, " must be positive"));
      if (v > 0) spec.overrides[k] = v;
    }
    ASSIGN_OR_RETURN(std::string out, args->Required("out"));
    const std::string format = args->Get("format", "safetensors");
    if (format == "safetensors") {
      if (spec.preset == "full") return absl::InvalidArgumentError("--preset full is written as --format gguf");
      for (const char* k : {"expert-type", "dense-type", "tokenizer", "synthetic", "threads"}) {
        if (args->Has(k)) return absl::InvalidArgumentError(absl::StrCat("--", k, " goes with --format gguf"));
      }
      return WriteRandomModel(spec, out);
    }
    if (format != "gguf") {
      return absl::InvalidArgumentError(absl::StrCat("--format '", format, "' (safetensors, gguf)"));
    }
    GgufExportOptions o;
    ASSIGN_OR_RETURN(o.expert_type, ParseExpertType(args->Get("expert-type", "q8_0")));
    ASSIGN_OR_RETURN(o.dense_type, ParseDenseType(args->Get("dense-type", "bf16")));
    o.tokenizer_dir = args->Get("tokenizer");
    const bool whole = spec.preset == "full";
    if (whole && o.tokenizer_dir.empty() && std::filesystem::exists(kQwen3Tokenizer + std::string("/tokenizer.json"))) {
      o.tokenizer_dir = kQwen3Tokenizer;
    }
    if (!whole && !args->Flag("synthetic")) {
      if (args->Has("threads")) return absl::InvalidArgumentError("--threads goes with --synthetic");
      return WriteRandomGguf(spec, o, out);
    }
    ASSIGN_OR_RETURN(int64_t threads, args->GetInt("threads", std::max(1u, std::thread::hardware_concurrency())));
    if (threads < 1 || threads > 1024) return absl::InvalidArgumentError("--threads must be in 1..1024");
    return WriteSyntheticGguf(spec, o, out, static_cast<int>(threads));
  }();
  if (!st.ok()) {
    std::fprintf(stderr, "make-model: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "make-model: wrote %s\n", args->Get("out").c_str());
  return 0;
}

}  // namespace moeshard
