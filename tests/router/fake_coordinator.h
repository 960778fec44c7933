// A fake moeshard.v1.Coordinator for router tests: GetStatus answers from its options,
// Generate echoes deterministic tokens (the prompt's non-special tokens, cycled) one per
// update, honours max_tokens, stop_token_ids, EOS and cancellation, and counts it all.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "proto/moeshard.grpc.pb.h"

namespace moeshard::router::testing {

class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  struct Options {
    bool ready = true;
    int64_t max_model_len = 4096;
    int64_t outstanding_tokens = 0;
    int token_delay_ms = 0;
    int32_t eos_id = 301;
    int32_t eos_after = -1;          // emit EOS as token number eos_after (0-based); -1 = never
    int32_t cached_tokens = 0;       // reported on the first update
    bool fail_generate = false;      // Generate fails with UNAVAILABLE before any token
    int32_t abort_after = -1;        // after this many tokens, finish with "abort" (its group lost a worker)
    bool queue_full = false;         // Generate refuses with RESOURCE_EXHAUSTED; GetStatus says queue_full
    int32_t first_special_id = 300;  // prompt tokens from here on are not echoed
  };

  FakeCoordinator() = default;
  ~FakeCoordinator() override;

  // Serves on 127.0.0.1 at a free port; returns "127.0.0.1:PORT".
  std::string Start();
  void Stop();

  void set_options(const Options& o);
  Options options();

  grpc::Status GetStatus(grpc::ServerContext*, const v1::StatusRequest*, v1::StatusReply* reply) override;
  grpc::Status Generate(grpc::ServerContext* context, const v1::SeqRequest* request,
                        grpc::ServerWriter<v1::SeqUpdate>* writer) override;
  grpc::Status StoreSet(grpc::ServerContext*, const v1::StoreSetRequest*, v1::StoreSetReply*) override;
  grpc::Status StoreGet(grpc::ServerContext*, const v1::StoreGetRequest*, v1::StoreGetReply*) override;

  int num_generate_calls() const { return num_calls_; }
  int num_cancelled() const { return num_cancelled_; }
  int num_running() const { return num_running_; }
  int64_t tokens_sent() const { return tokens_sent_; }
  v1::SeqRequest last_request();
  // Waits until num_cancelled() >= n; false on timeout.
  bool WaitCancelled(int n, int timeout_ms);
  // Waits until no Generate call runs; false on timeout.
  bool WaitIdle(int timeout_ms);

 private:
  void Notify();

  std::mutex mu_;
  std::condition_variable cv_;
  Options options_;
  v1::SeqRequest last_request_;
  std::atomic<int> num_calls_{0}, num_cancelled_{0}, num_running_{0};
  std::atomic<int64_t> tokens_sent_{0};
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace moeshard::router::testing
