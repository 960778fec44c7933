// `moeshard check`: runs a goldens file against a model and exits non-zero outside the
// tolerance (../shared/testdata/README.md). The tolerance defaults to fp32, or q8_0 when
// the checkpoint holds Q8_0 tensors.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/golden_check.h"
#include "common/status.h"

namespace moeshard {

int CheckCommand(const std::vector<std::string>& argv) {
  auto a = Args::Parse(argv, {"model", "goldens", "tolerance"}, {"help"});
  if (!a.ok() || a->Flag("help") || !a->Has("model") || !a->Has("goldens")) {
    std::fprintf(stderr, "usage: moeshard check --model PATH --goldens FILE [--tolerance fp32|q8_0|bf16]\n%s\n",
                 a.ok() ? "" : std::string(a.status().message()).c_str());
    return (a.ok() && a->Flag("help")) ? 0 : 2;
  }
  auto m = LoadModel(a->Get("model"), /*load_tokenizer=*/false);
  if (!m.ok()) {
    std::fprintf(stderr, "check: %s\n", std::string(m.status().message()).c_str());
    return 1;
  }
  Tolerance tol = Tolerance::kFp32;
  if (a->Has("tolerance")) {
    auto t = ParseTolerance(a->Get("tolerance"));
    if (!t.ok()) {
      std::fprintf(stderr, "check: %s\n", std::string(t.status().message()).c_str());
      return 2;
    }
    tol = *t;
  } else {
    for (const auto& name : m->source->Names()) {
      if (m->source->Find(name)->dtype == DType::kQ8_0) tol = Tolerance::kQ8_0;
    }
  }
  auto rep = CheckModel(*m, a->Get("goldens"), tol);
  if (!rep.ok()) {
    std::fprintf(stderr, "check: %s\n", std::string(rep.status().message()).c_str());
    return 1;
  }
  std::printf("model %s, tolerance %s\n%s", a->Get("model").c_str(),
              tol == Tolerance::kFp32 ? "fp32" : tol == Tolerance::kQ8_0 ? "q8_0" : "bf16", rep->Format().c_str());
  return rep->pass() ? 0 : 1;
}

}  // namespace moeshard
