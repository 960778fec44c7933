#include "worker/service/instrumented_communicator.h"

#include <chrono>

#include "common/metrics/metrics.h"

namespace moeshard {

InstrumentedCommunicator::InstrumentedCommunicator(std::unique_ptr<Communicator> inner, prometheus::Registry& r)
    : inner_(std::move(inner)) {
  set_timeout(inner_->timeout());
  auto& secs = prometheus::BuildCounter().Name(MetricName("communicator_seconds_total"))
                   .Help("Time spent in communicator operations, by operation").Register(r);
  auto& bytes = prometheus::BuildCounter().Name(MetricName("communicator_bytes_total"))
                    .Help("Bytes moved by communicator operations (this rank's payload), by operation").Register(r);
  auto& errs = prometheus::BuildCounter().Name(MetricName("communicator_errors_total"))
                   .Help("Communicator operations that failed (timeouts included), by operation").Register(r);
  auto make = [&](const char* op) { return Op{&secs.Add({{"op", op}}), &bytes.Add({{"op", op}}), &errs.Add({{"op", op}})}; };
  all_reduce_ = make("all_reduce");
  all_gather_ = make("all_gather");
  send_ = make("send");
  recv_ = make("recv");
  barrier_ = make("barrier");
}

template <typename F>
absl::Status InstrumentedCommunicator::Timed(Op& op, size_t bytes, F&& f) {
  inner_->set_timeout(timeout());
  auto t0 = std::chrono::steady_clock::now();
  absl::Status st = f();
  op.seconds->Increment(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  op.bytes->Increment(static_cast<double>(bytes));
  if (!st.ok()) op.errors->Increment();
  return st;
}

absl::Status InstrumentedCommunicator::AllReduceSum(float* data, size_t count) {
  return Timed(all_reduce_, count * 4, [&] { return inner_->AllReduceSum(data, count); });
}
absl::Status InstrumentedCommunicator::AllGather(const float* in, size_t count, float* out) {
  return Timed(all_gather_, count * 4, [&] { return inner_->AllGather(in, count, out); });
}
absl::Status InstrumentedCommunicator::Send(const void* data, size_t bytes, int dst) {
  return Timed(send_, bytes, [&] { return inner_->Send(data, bytes, dst); });
}
absl::Status InstrumentedCommunicator::Recv(void* data, size_t bytes, int src) {
  return Timed(recv_, bytes, [&] { return inner_->Recv(data, bytes, src); });
}
absl::Status InstrumentedCommunicator::Barrier() {
  return Timed(barrier_, 0, [&] { return inner_->Barrier(); });
}

}  // namespace moeshard
