// Communicators for ranks that are threads of one process (tests, and several workers
// on one host without a network). Create a LocalGroup of N ranks, then hand rank r's
// communicator to thread r. Collectives sum in rank order, so results are deterministic.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/comm/communicator.h"

namespace moeshard {

class LocalGroup : public std::enable_shared_from_this<LocalGroup> {
 public:
  static std::shared_ptr<LocalGroup> Create(int size);
  std::unique_ptr<Communicator> Rank(int r);

 private:
  friend class LocalCommunicator;
  explicit LocalGroup(int size) : size_(size), slots_(size) {}
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Collective rendezvous: generation counter and per-rank buffers.
  uint64_t arrived_ = 0, generation_ = 0, departed_ = 0;
  std::vector<std::vector<float>> slots_;
  std::vector<float> result_;
  // Point-to-point mailboxes keyed by (src, dst).
  std::map<std::pair<int, int>, std::deque<std::string>> mail_;
  bool aborted_ = false;
};

}  // namespace moeshard
