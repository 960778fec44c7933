// Generation correctness: the goldens' greedy continuations token for token; the
// in-process engine's greedy outputs for prompts of many lengths; and 16 concurrent
// streams of mixed lengths, half of them started while the others decode, each equal
// to the same request run alone.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/itest/suite.h"
#include "common/formats/safetensors.h"
#include "common/status.h"

namespace moeshard::itest {
namespace {

absl::StatusOr<std::vector<int32_t>> ReadI32(const SafetensorsCheckpoint& f, const std::string& name) {
  const TensorInfo* t = f.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("goldens: no '", name, "'"));
  if (t->dtype != DType::kI32) return absl::InvalidArgumentError(absl::StrCat("goldens: '", name, "' is not int32"));
  std::vector<int32_t> v(t->numel());
  if (t->nbytes != v.size() * sizeof(int32_t))
    return absl::InvalidArgumentError(absl::StrCat("goldens: '", name, "' size"));
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}

absl::Status Goldens(Context& ctx) {
  if (ctx.opts.goldens.empty()) return Skip("no --goldens");
  ASSIGN_OR_RETURN(auto f, SafetensorsCheckpoint::OpenFile(ctx.opts.goldens));
  int k = 0;
  for (;; ++k) {
    const std::string p = absl::StrCat("gen", k, ".");
    if (f->Find(p + "prompt") == nullptr) break;
    GenRequest r;
    ASSIGN_OR_RETURN(r.prompt_ids, ReadI32(*f, p + "prompt"));
    ASSIGN_OR_RETURN(auto want, ReadI32(*f, p + "greedy"));
    r.max_tokens = want.size();
    ASSIGN_OR_RETURN(GenResult g, ctx.api->Complete(r));
    RETURN_IF_ERROR(SameGreedy(ctx, r.prompt_ids, want, g.token_ids, absl::StrCat("gen", k)));
  }
  if (k == 0) return absl::NotFoundError("goldens: no gen0.prompt");
  return absl::OkStatus();
}

absl::Status MatchesReference(Context& ctx) {
  if (ctx.reference == nullptr) return Skip("needs --model");
  std::vector<std::string> bad;
  const int64_t lengths[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 48, 64, 65, 99, 100};
  for (size_t i = 0; i < std::size(lengths); ++i) {
    GenRequest r;
    r.prompt_ids = MakePrompt(lengths[i], 100 + i, ctx.prompt_vocab);
    r.max_tokens = i % 3 == 0 ? 34 : 10;  // some decodes cross a block boundary
    ASSIGN_OR_RETURN(GenResult g, ctx.api->Complete(r));
    ASSIGN_OR_RETURN(auto want, ctx.Reference(r.prompt_ids, r.max_tokens));
    absl::Status same = SameGreedy(ctx, r.prompt_ids, want, g.token_ids, absl::StrCat("prompt length ", lengths[i]));
    if (!same.ok()) bad.emplace_back(same.message());
  }
  if (!bad.empty())
    return absl::InternalError(
        absl::StrCat(bad.size(), " of ", std::size(lengths), " differ; ", absl::StrJoin(bad, "; ")));
  return absl::OkStatus();
}

// A latch: late requests wait until early ones are decoding.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Wait(double timeout_s) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::duration<double>(timeout_s), [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

absl::Status Concurrent(Context& ctx) {
  constexpr int kNum = 16, kEarly = 8;
  std::vector<GenRequest> reqs(kNum);
  for (int i = 0; i < kNum; ++i) {
    reqs[i].prompt_ids = MakePrompt(1 + (i * 37) % 97, 200 + i, ctx.prompt_vocab);
    // Early requests decode long enough for the late ones to arrive meanwhile.
    reqs[i].max_tokens = i < kEarly ? 40 + (i * 7) % 25 : 4 + (i * 11) % 29;
  }
  // Each request alone (non-streaming) first.
  std::vector<GenResult> alone(kNum);
  for (int i = 0; i < kNum; ++i) {
    ASSIGN_OR_RETURN(alone[i], ctx.api->Complete(reqs[i]));
  }
  std::vector<absl::StatusOr<GenResult>> got(kNum, absl::UnknownError("not run"));
  std::vector<double> start_s(kNum), end_s(kNum);
  std::vector<Gate> decoding(kEarly);
  const auto t0 = std::chrono::steady_clock::now();
  auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::vector<std::thread> threads;
  for (int i = 0; i < kNum; ++i) {
    threads.emplace_back([&, i] {
      if (i >= kEarly) decoding[i - kEarly].Wait(60);  // its partner has streamed 2 chunks
      start_s[i] = now();
      got[i] = ctx.api->CompleteStream(reqs[i], [&, i](int64_t chunks) {
        if (i < kEarly && chunks == 2) decoding[i].Open();
        return true;
      });
      if (i < kEarly) decoding[i].Open();
      end_s[i] = now();
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::string> bad;
  for (int i = 0; i < kNum; ++i) {
    if (!got[i].ok()) {
      bad.push_back(absl::StrCat("request ", i, ": ", got[i].status().message()));
    } else if (absl::Status same = SameGreedy(ctx, reqs[i].prompt_ids, alone[i].token_ids, got[i]->token_ids,
                                              absl::StrCat("request ", i, " (prompt ", reqs[i].prompt_ids.size(),
                                                           ", max_tokens ", reqs[i].max_tokens, ")"));
               !same.ok()) {
      bad.emplace_back(same.message());
    } else if (got[i]->token_ids == alone[i].token_ids && got[i]->text != alone[i].text) {
      bad.push_back(absl::StrCat("request ", i, ": streamed text differs from the non-streamed text"));
    }
  }
  if (!bad.empty())
    return absl::InternalError(
        absl::StrCat(bad.size(), " of ", kNum, " differ from their solo run; ", absl::StrJoin(bad, "; ")));
  // The late requests must really have overlapped the early ones' decoding.
  int overlapped = 0;
  for (int i = kEarly; i < kNum; ++i) overlapped += start_s[i] < end_s[i - kEarly];
  if (overlapped == 0)
    return absl::InternalError("no late request arrived while an early one was decoding (too fast to test?)");
  return absl::OkStatus();
}

}  // namespace

void RunGenerationChecks(Context& ctx, Suite& suite) {
  suite.Run("goldens: gen0 greedy tokens via return_token_ids", [&] { return Goldens(ctx); });
  suite.Run("reference: greedy equals the in-process engine, prompt lengths 1..100",
            [&] { return MatchesReference(ctx); });
  suite.Run("concurrency: 16 streams of mixed lengths equal their solo runs", [&] { return Concurrent(ctx); });
}

}  // namespace moeshard::itest
