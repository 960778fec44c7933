// The CPU communicator: ranks in different processes (or threads) exchange data over TCP
// through Gloo. The group bootstraps through a KvStore: each rank publishes its address
// under `prefix` and connects to every other rank (a full mesh of TCP pairs).
// Gloo's headers stay inside gloo_communicator.cc; link moeshard_comm_gloo to use this.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/comm/communicator.h"
#include "common/comm/kv_store.h"

namespace moeshard {

// Joins rank `rank` of a group of `size` ranks; blocks until every rank has joined, or
// returns DeadlineExceeded after `timeout` (which also becomes the communicator's
// per-operation timeout). All ranks pass the same store, prefix and size; the prefix
// namespaces the keys, so several groups can bootstrap through one store. `store` is used
// only during this call (the caller keeps ownership). `hostname` is the address this rank
// listens on and advertises (e.g. "127.0.0.1"). A group of size 1 never touches the
// network or the store.
//
// The communicator follows communicator.h: calls come from one thread, except Abort(),
// which any thread may call while a call is pending. Send blocks until the peer has posted
// the matching Recv (rendezvous, as in NCCL), so ranks must not all Send to each other
// before receiving. After a timeout or an I/O error the communicator is aborted: every
// later call returns Aborted, and peers blocked on this rank fail fast.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    KvStore* store, const std::string& prefix, int rank, int size, const std::string& hostname,
    std::chrono::milliseconds timeout);

}  // namespace moeshard
