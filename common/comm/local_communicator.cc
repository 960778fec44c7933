#include "common/comm/local_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace moeshard {

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size_; }

  // All ranks deposit `count` floats; `combine` builds the result from all slots.
  template <typename Combine>
  absl::Status Collective(const float* in, size_t count, Combine combine, float* out, size_t out_count) {
    std::unique_lock<std::mutex> l(g_->mu_);
    auto deadline = std::chrono::steady_clock::now() + timeout();
    // Wait until the previous collective has fully drained.
    if (!g_->cv_.wait_until(l, deadline, [&] { return g_->aborted_ || g_->departed_ == 0; })) return Timeout("collective");
    if (g_->aborted_) return Aborted();
    g_->slots_[rank_].assign(in, in + count);
    uint64_t gen = g_->generation_;
    if (++g_->arrived_ == static_cast<uint64_t>(g_->size_)) {
      g_->result_ = combine(g_->slots_);
      g_->arrived_ = 0;
      g_->departed_ = g_->size_;
      ++g_->generation_;
      g_->cv_.notify_all();
    } else if (!g_->cv_.wait_until(l, deadline, [&] { return g_->aborted_ || g_->generation_ != gen; })) {
      g_->aborted_ = true;
      g_->cv_.notify_all();
      return Timeout("collective");
    }
    if (g_->aborted_) return Aborted();
    if (g_->result_.size() != out_count) return absl::InvalidArgumentError("collective: ranks passed different counts");
    if (out_count > 0) std::memcpy(out, g_->result_.data(), out_count * sizeof(float));
    if (--g_->departed_ == 0) g_->cv_.notify_all();
    return absl::OkStatus();
  }

  absl::Status AllReduceSum(float* data, size_t count) override {
    return Collective(data, count, [count](const std::vector<std::vector<float>>& s) {
      std::vector<float> r(count, 0.f);
      for (const auto& v : s) {
        for (size_t i = 0; i < count && i < v.size(); ++i) r[i] += v[i];
      }
      return r;
    }, data, count);
  }
  absl::Status AllGather(const float* in, size_t count, float* out) override {
    return Collective(in, count, [](const std::vector<std::vector<float>>& s) {
      std::vector<float> r;
      for (const auto& v : s) r.insert(r.end(), v.begin(), v.end());
      return r;
    }, out, count * size());
  }
  absl::Status Barrier() override {
    float x = 0;
    return AllReduceSum(&x, 1);
  }
  absl::Status Send(const void* data, size_t bytes, int dst) override {
    if (dst < 0 || dst >= size()) return absl::InvalidArgumentError(absl::StrCat("send to rank ", dst));
    std::lock_guard<std::mutex> l(g_->mu_);
    if (g_->aborted_) return Aborted();
    g_->mail_[{rank_, dst}].emplace_back(static_cast<const char*>(data), bytes);
    g_->cv_.notify_all();
    return absl::OkStatus();
  }
  absl::Status Recv(void* data, size_t bytes, int src) override {
    if (src < 0 || src >= size()) return absl::InvalidArgumentError(absl::StrCat("recv from rank ", src));
    std::unique_lock<std::mutex> l(g_->mu_);
    auto& q = g_->mail_[{src, rank_}];
    if (!g_->cv_.wait_until(l, std::chrono::steady_clock::now() + timeout(),
                            [&] { return g_->aborted_ || !q.empty(); })) {
      return Timeout("recv");
    }
    if (g_->aborted_) return Aborted();
    if (q.front().size() != bytes) {
      return absl::InvalidArgumentError(absl::StrCat("recv: expected ", bytes, " bytes, peer sent ", q.front().size()));
    }
    std::memcpy(data, q.front().data(), bytes);
    q.pop_front();
    return absl::OkStatus();
  }
  void Abort() override {
    std::lock_guard<std::mutex> l(g_->mu_);
    g_->aborted_ = true;
    g_->cv_.notify_all();
  }

 private:
  absl::Status Timeout(const char* op) {
    return absl::DeadlineExceededError(absl::StrCat("local communicator: ", op, " on rank ", rank_, " timed out"));
  }
  absl::Status Aborted() { return absl::AbortedError("local communicator: group aborted"); }
  std::shared_ptr<LocalGroup> g_;
  int rank_;
};

std::shared_ptr<LocalGroup> LocalGroup::Create(int size) {
  return std::shared_ptr<LocalGroup>(new LocalGroup(size));
}

std::unique_ptr<Communicator> LocalGroup::Rank(int r) {
  return std::make_unique<LocalCommunicator>(shared_from_this(), r);
}

}  // namespace moeshard
