// A Communicator decorator that counts time and bytes per operation into Prometheus:
// <prefix>communicator_seconds_total{op} and <prefix>communicator_bytes_total{op}.
#pragma once

#include <memory>

#include "common/comm/communicator.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace moeshard {

class InstrumentedCommunicator : public Communicator {
 public:
  InstrumentedCommunicator(std::unique_ptr<Communicator> inner, prometheus::Registry& registry);
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status AllGather(const float* in, size_t count, float* out) override;
  absl::Status Send(const void* data, size_t bytes, int dst) override;
  absl::Status Recv(void* data, size_t bytes, int src) override;
  absl::Status Barrier() override;
  void Abort() override { inner_->Abort(); }
  bool device_memory() const override { return inner_->device_memory(); }
  void set_stream(void* stream) override { inner_->set_stream(stream); }

 private:
  struct Op {
    prometheus::Counter* seconds;
    prometheus::Counter* bytes;
    prometheus::Counter* errors;
  };
  template <typename F>
  absl::Status Timed(Op& op, size_t bytes, F&& f);
  std::unique_ptr<Communicator> inner_;
  Op all_reduce_, all_gather_, send_, recv_, barrier_;
};

}  // namespace moeshard
