// GlooCommunicator: the collectives are built here from Gloo's unbound-buffer send/recv
// rather than taken from gloo::allreduce, so that every wait is ours: Abort() can
// interrupt it (closing Gloo's connections does not wake a local wait), and a timeout
// names the peer this rank was waiting for.
//
// Slots. Gloo matches a send on one rank with a recv on its peer by (pair, slot); sends
// and recvs are matched separately, so both directions of a pair may use one slot.
//   slot = kind:4 | seq:12 | step:8 | bytes:40
// Collectives (kind 1): seq counts collectives, which every rank issues in the same
// order, and step is the round within one. Point to point (kind 2): seq counts messages
// from this rank to dst (Send) or from src to this rank (Recv), so the n-th Send to a peer
// matches that peer's n-th Recv and consecutive messages stay in order. Each rank has at
// most one transfer in flight per pair, so 12 bits of seq never wrap onto a live slot.
// The byte count is in the slot because Gloo kills the process (an uncaught exception in
// its event loop) when a message is longer than the recv posted for it; with it, a size
// mismatch between ranks never matches and both sides time out with the sizes named.
// AllReduceSum of up to kSmallAllReduceBytes (all ranks' values together) is latency
// bound: every rank sends its values to every other rank at once (one step: size-1 sends and
// size-1 recvs in flight; the ring's size-1 steps cost a wake-up of each process per step,
// 0.6 ms each with four ranks on two cores) and each rank sums them in rank order. Larger ones use the
// bandwidth-optimal ring: the buffer is cut into `size` chunks; in size-1 reduce-scatter steps rank r sends chunk r-s
// to its right neighbour and adds chunk r-s-1 from its left, after which it holds the full sum of chunk r+1; in size-1
// all-gather steps those sums travel once round the ring. Either way every element is summed in one order, so all ranks
// end with bitwise identical results. AllGather is the same one-step exchange up to kSmallAllReduceBytes and a ring of
// size-1 steps above it. Barrier is a dissemination barrier: in round k, send a byte to rank+2^k and receive one from
// rank-2^k.
#include "common/comm/gloo_communicator.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <pthread.h>
#include <signal.h>

#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/comm/gloo_store_adapter.h"

namespace moeshard {
namespace {

using Clock = std::chrono::steady_clock;
using gloo::transport::UnboundBuffer;
using std::chrono::milliseconds;

constexpr uint64_t kCollectiveSlot = 1;
constexpr uint64_t kPointToPointSlot = 2;
constexpr size_t kSmallAllReduceBytes = 64 << 10;
constexpr uint64_t kMaxTransferBytes = uint64_t{1} << 40;

uint64_t MakeSlot(uint64_t kind, uint64_t seq, uint64_t step, uint64_t bytes) {
  return kind << 60 | (seq & 0xfff) << 48 | (step & 0xff) << 40 | bytes;
}

// Gloo writes to sockets without MSG_NOSIGNAL, so writing to a peer that has gone away
// raises SIGPIPE, whose default action ends the process. While alive, this blocks SIGPIPE
// in the calling thread (threads started meanwhile inherit that, so Gloo's event loop keeps
// it blocked for good); on exit it discards a SIGPIPE raised meanwhile and restores the
// mask. The failed write itself returns EPIPE, which Gloo reports as an exception.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&sigpipe_);
    sigaddset(&sigpipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigpipe_, &old_mask_);
  }
  ~ScopedSigpipeBlock() {
    if (sigismember(&old_mask_, SIGPIPE)) return;  // blocked before us: leave it so
    sigset_t pending;
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
      const timespec no_wait = {0, 0};
      sigtimedwait(&sigpipe_, nullptr, &no_wait);
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }

 private:
  sigset_t sigpipe_;
  sigset_t old_mask_;
};

class GlooCommunicator : public Communicator {
 public:
  // `context` is connected, or null when size == 1.
  GlooCommunicator(int rank, int size, std::shared_ptr<gloo::rendezvous::Context> context,
                   milliseconds timeout)
      : rank_(rank), size_(size), context_(std::move(context)), send_seq_(size), recv_seq_(size) {
    set_timeout(timeout);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduceSum(float* data, size_t count) override {
    return Run("AllReduceSum", [&](Clock::time_point deadline) -> absl::Status {
      if (size_ == 1 || count == 0) return absl::OkStatus();
      const uint64_t seq = collective_seq_++;
      if (count * size_ * sizeof(float) <= kSmallAllReduceBytes) {
        scratch_.resize(count * size_);
        std::memcpy(scratch_.data() + rank_ * count, data, count * sizeof(float));
        absl::Status status = DirectGather(scratch_.data(), count, seq, deadline);
        if (!status.ok()) return status;
        for (size_t i = 0; i < count; ++i) {
          float sum = 0.f;
          for (int q = 0; q < size_; ++q) sum += scratch_[q * count + i];
          data[i] = sum;
        }
        return absl::OkStatus();
      }
      auto begin = [&](int chunk) { return count * chunk / size_; };
      auto bytes = [&](int chunk) { return (begin(chunk + 1) - begin(chunk)) * sizeof(float); };
      scratch_.resize(count / size_ + 1);
      uint64_t step = 0;
      for (int s = 0; s < size_ - 1; ++s, ++step) {  // reduce-scatter
        const int send_chunk = Mod(rank_ - s), recv_chunk = Mod(rank_ - s - 1);
        absl::Status status =
            Transfer(Right(), data + begin(send_chunk), bytes(send_chunk), Left(), scratch_.data(),
                     bytes(recv_chunk), kCollectiveSlot, seq, step, deadline);
        if (!status.ok()) return status;
        float* acc = data + begin(recv_chunk);
        for (size_t i = 0; i < bytes(recv_chunk) / sizeof(float); ++i) acc[i] += scratch_[i];
      }
      for (int s = 0; s < size_ - 1; ++s, ++step) {  // all-gather of the summed chunks
        const int send_chunk = Mod(rank_ + 1 - s), recv_chunk = Mod(rank_ - s);
        absl::Status status = Transfer(Right(), data + begin(send_chunk), bytes(send_chunk), Left(),
                                       data + begin(recv_chunk), bytes(recv_chunk), kCollectiveSlot,
                                       seq, step, deadline);
        if (!status.ok()) return status;
      }
      return absl::OkStatus();
    });
  }

  absl::Status AllGather(const float* in, size_t count, float* out) override {
    return Run("AllGather", [&](Clock::time_point deadline) -> absl::Status {
      if (count == 0) return absl::OkStatus();
      if (out + rank_ * count != in) std::memcpy(out + rank_ * count, in, count * sizeof(float));
      if (size_ == 1) return absl::OkStatus();
      const uint64_t seq = collective_seq_++;
      if (count * size_ * sizeof(float) <= kSmallAllReduceBytes) return DirectGather(out, count, seq, deadline);
      return RingGather(out, count, seq, deadline);
    });
  }

  absl::Status Barrier() override {
    return Run("Barrier", [&](Clock::time_point deadline) -> absl::Status {
      if (size_ == 1) return absl::OkStatus();
      const uint64_t seq = collective_seq_++;
      uint64_t round = 0;
      for (int dist = 1; dist < size_; dist *= 2, ++round) {
        char token_out = 0, token_in = 0;
        absl::Status status = Transfer(Mod(rank_ + dist), &token_out, 1, Mod(rank_ - dist),
                                       &token_in, 1, kCollectiveSlot, seq, round, deadline);
        if (!status.ok()) return status;
      }
      return absl::OkStatus();
    });
  }

  absl::Status Send(const void* data, size_t bytes, int dst) override {
    if (dst < 0 || dst >= size_) {
      return absl::InvalidArgumentError(absl::StrCat(Where("Send"), ": no rank ", dst));
    }
    return Run("Send", [&](Clock::time_point deadline) -> absl::Status {
      if (dst == rank_) {
        self_mail_.emplace_back(bytes > 0 ? static_cast<const char*>(data) : "", bytes);
        return absl::OkStatus();
      }
      const uint64_t seq = send_seq_[dst]++;
      return Transfer(dst, data, bytes, -1, nullptr, 0, kPointToPointSlot, seq, 0, deadline);
    });
  }

  absl::Status Recv(void* data, size_t bytes, int src) override {
    if (src < 0 || src >= size_) {
      return absl::InvalidArgumentError(absl::StrCat(Where("Recv"), ": no rank ", src));
    }
    return Run("Recv", [&](Clock::time_point deadline) -> absl::Status {
      if (src == rank_) {
        if (self_mail_.empty()) {
          return absl::FailedPreconditionError(
              absl::StrCat(Where("Recv"), ": nothing sent to self"));
        }
        if (self_mail_.front().size() != bytes) {
          return absl::InvalidArgumentError(absl::StrCat(Where("Recv"), ": expected ", bytes,
                                                         " bytes, self sent ",
                                                         self_mail_.front().size()));
        }
        if (bytes > 0) std::memcpy(data, self_mail_.front().data(), bytes);
        self_mail_.pop_front();
        return absl::OkStatus();
      }
      const uint64_t seq = recv_seq_[src]++;
      return Transfer(-1, nullptr, 0, src, data, bytes, kPointToPointSlot, seq, 0, deadline);
    });
  }

  void Abort() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_) {
        aborted_ = true;
        abort_reason_ = "communicator aborted";
      }
    }
    // Close first: once the connections are down no byte lands in a buffer we release.
    CloseConnections();
    std::lock_guard<std::mutex> lock(mu_);
    for (UnboundBuffer* buf : in_flight_) {
      buf->abortWaitRecv();
      buf->abortWaitSend();
    }
  }

 private:
  int Mod(int i) const { return ((i % size_) + size_) % size_; }
  int Right() const { return Mod(rank_ + 1); }
  int Left() const { return Mod(rank_ - 1); }
  std::string Where(const char* op) const {
    return absl::StrCat("gloo communicator: ", op, " on rank ", rank_, " of ", size_);
  }

  // Fills out[size * count], whose block `rank_` holds this rank's values: in step s each
  // rank passes block rank-s to its right neighbour and receives block rank-s-1.
  absl::Status RingGather(float* out, size_t count, uint64_t seq, Clock::time_point deadline) {
    const size_t bytes = count * sizeof(float);
    for (int s = 0; s < size_ - 1; ++s) {
      absl::Status status =
          Transfer(Right(), out + Mod(rank_ - s) * count, bytes, Left(),
                   out + Mod(rank_ - s - 1) * count, bytes, kCollectiveSlot, seq, s, deadline);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  // Fills out[size * count], whose block `rank_` holds this rank's values, in one step: this
  // rank's block goes to every peer and every peer's block comes in, all in flight at once.
  absl::Status DirectGather(float* out, size_t count, uint64_t seq, Clock::time_point deadline) {
    const size_t bytes = count * sizeof(float);
    std::vector<Op> sends, recvs;
    for (int d = 1; d < size_; ++d) {
      sends.push_back({Mod(rank_ + d), out + rank_ * count, bytes});
      recvs.push_back({Mod(rank_ - d), out + Mod(rank_ - d) * count, bytes});
    }
    return Exchange(sends, recvs, kCollectiveSlot, seq, 0, deadline);
  }

  // Runs `body` as operation `op` with one deadline for the whole operation: refuses when
  // aborted, turns every exception into a status, and aborts the communicator on failure.
  template <typename Body>
  absl::Status Run(const char* op, Body body) {
    ScopedSigpipeBlock no_sigpipe;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) return absl::AbortedError(absl::StrCat(Where(op), ": ", abort_reason_));
    }
    const Clock::time_point deadline = Clock::now() + timeout();
    waiting_for_.clear();
    std::string error;
    try {
      absl::Status status = body(deadline);
      if (status.ok() || !absl::IsAborted(status)) return status;
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown exception";
    }
    absl::Status status = Failure(op, deadline, error);
    Poison(status);
    return status;
  }

  absl::Status Failure(const char* op, Clock::time_point deadline, const std::string& error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) return absl::AbortedError(absl::StrCat(Where(op), ": ", abort_reason_));
    }
    const std::string peer = waiting_for_.empty() ? "" : absl::StrCat(" waiting to ", waiting_for_);
    if (Clock::now() >= deadline || absl::StrContains(error, "Timed out")) {
      return absl::DeadlineExceededError(
          absl::StrCat(Where(op), " timed out after ", timeout().count(), " ms", peer));
    }
    return absl::UnavailableError(absl::StrCat(Where(op), " failed", peer, ": ", error));
  }

  // Leaves the communicator aborted after a failure; peers blocked on us fail fast.
  void Poison(const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_) {
        aborted_ = true;
        abort_reason_ = absl::StrCat("aborted by an earlier failure: ", status.message());
      }
    }
    CloseConnections();
  }

  void CloseConnections() {
    if (context_ == nullptr) return;
    std::call_once(close_once_, [this] {
      try {
        context_->closeConnections();
      } catch (...) {  // Closing is best effort; the pairs may already be in error.
      }
    });
  }

  struct Op {
    int peer;
    void* ptr;
    size_t bytes;  // 0: nothing is posted
  };

  // Posts a recv of `recv_bytes` from `recv_peer` and a send of `send_bytes` to `send_peer`
  // (either may be empty) on the slots of (kind, seq, step), then waits for both until
  // `deadline`. Returns Aborted when Abort() interrupted it; lets Gloo's exceptions through.
  absl::Status Transfer(int send_peer, const void* send_ptr, size_t send_bytes, int recv_peer,
                        void* recv_ptr, size_t recv_bytes, uint64_t kind, uint64_t seq,
                        uint64_t step, Clock::time_point deadline) {
    return Exchange({{send_peer, const_cast<void*>(send_ptr), send_bytes}}, {{recv_peer, recv_ptr, recv_bytes}}, kind,
                    seq, step, deadline);
  }

  // Posts every recv, then every send, on the slots of (kind, seq, step) — at most one of each
  // per peer — and waits for all of them until `deadline`. Returns Aborted when Abort()
  // interrupted it or a wait timed out; lets Gloo's exceptions through.
  absl::Status Exchange(const std::vector<Op>& sends, const std::vector<Op>& recvs, uint64_t kind, uint64_t seq,
                        uint64_t step, Clock::time_point deadline) {
    struct Posted {
      const Op* op;
      std::unique_ptr<UnboundBuffer> buf;
    };
    std::vector<Posted> send_bufs, recv_bufs;
    for (const auto* ops : {&sends, &recvs}) {
      for (const Op& op : *ops) {
        if (op.bytes >= kMaxTransferBytes) return absl::InvalidArgumentError("transfers are limited to 1 TiB");
        if (op.bytes == 0) continue;
        (ops == &sends ? send_bufs : recv_bufs).push_back({&op, context_->createUnboundBuffer(op.ptr, op.bytes)});
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) return absl::AbortedError(abort_reason_);
      for (const auto* posted : {&send_bufs, &recv_bufs}) {
        for (const Posted& p : *posted) in_flight_.push_back(p.buf.get());
      }
    }
    absl::Status status;
    try {
      for (Posted& r : recv_bufs) r.buf->recv(r.op->peer, MakeSlot(kind, seq, step, r.op->bytes));
      for (Posted& w : send_bufs) w.buf->send(w.op->peer, MakeSlot(kind, seq, step, w.op->bytes));
      for (Posted& r : recv_bufs) {
        waiting_for_ = absl::StrCat("recv ", r.op->bytes, " bytes from rank ", r.op->peer);
        if (!r.buf->waitRecv(nullptr, internal::TimeLeft(deadline))) {
          status = absl::AbortedError("");
          break;
        }
      }
      for (Posted& w : send_bufs) {
        if (!status.ok()) break;
        waiting_for_ = absl::StrCat("send ", w.op->bytes, " bytes to rank ", w.op->peer);
        if (!w.buf->waitSend(nullptr, internal::TimeLeft(deadline))) status = absl::AbortedError("");
      }
    } catch (...) {
      // Gloo may still hold a pending op on these buffers: stop all I/O before they go.
      CloseConnections();
      ClearInFlight();
      throw;
    }
    // A wait that gave up may leave ops pending on the buffers too (the communicator is
    // poisoned after a failure anyway).
    if (!status.ok()) CloseConnections();
    ClearInFlight();
    if (status.ok()) waiting_for_.clear();
    return status;
  }

  void ClearInFlight() {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.clear();
  }

  const int rank_;
  const int size_;
  std::shared_ptr<gloo::rendezvous::Context> context_;  // null when size_ == 1
  // Calling thread only.
  uint64_t collective_seq_ = 0;
  std::vector<uint64_t> send_seq_;  // messages sent to each rank
  std::vector<uint64_t> recv_seq_;  // messages received from each rank
  std::deque<std::string> self_mail_;
  std::vector<float> scratch_;
  std::string waiting_for_;  // the pending wait, for error messages
  // Shared with Abort(), which may run on another thread.
  std::mutex mu_;
  bool aborted_ = false;
  std::string abort_reason_;
  std::vector<UnboundBuffer*> in_flight_;  // buffers of the pending Transfer
  std::once_flag close_once_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    KvStore* store, const std::string& prefix, int rank, int size, const std::string& hostname,
    std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo communicator: rank ", rank, " of size ", size));
  }
  if (timeout <= milliseconds(0)) {
    return absl::InvalidArgumentError("gloo communicator: timeout must be positive");
  }
  if (size == 1) return std::make_unique<GlooCommunicator>(0, 1, nullptr, timeout);
  if (store == nullptr) return absl::InvalidArgumentError("gloo communicator: no store");
  internal::GlooStoreAdapter adapter(store, prefix, timeout);
  ScopedSigpipeBlock no_sigpipe;  // also for Gloo's event-loop thread, started here
  std::string stage = "creating the TCP device";
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    stage = "connecting to the other ranks";
    context->connectFullMesh(adapter, device);
    return std::make_unique<GlooCommunicator>(rank, size, std::move(context), timeout);
  } catch (const std::exception& e) {
    std::string where = absl::StrCat("gloo communicator: rank ", rank, " of ", size, " (prefix '",
                                     prefix, "', host '", hostname, "') failed ", stage, ": ");
    if (!adapter.status().ok()) {
      return absl::Status(adapter.status().code(), absl::StrCat(where, adapter.status().message()));
    }
    return absl::UnavailableError(absl::StrCat(where, e.what()));
  } catch (...) {
    return absl::UnknownError(absl::StrCat("gloo communicator: rank ", rank, " failed ", stage));
  }
}

}  // namespace moeshard
