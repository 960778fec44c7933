// `moeshard up`'s secrets: the cluster credential its processes share (made fresh for each
// cluster unless one is given) and the router's API key. Both reach the children through
// the environment, which only the same user can read, never through argv, which `ps`
// shows to every user of the machine.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/flags/args.h"

namespace moeshard {

// Sets $MOESHARD_CLUSTER_TOKEN (from the environment, --cluster-token-file, or a new random
// token) for the children this process starts.
absl::Status ExportClusterToken(const Args& a);

// Sets $MOESHARD_API_KEY from --api-key-file (or --api-key, with a warning: argv is public),
// for the router alone: called just before it starts.
absl::Status ExportApiKey(const Args& a);

// The mutual-TLS flags of `up` to pass on to each internal process (paths, not secrets).
std::vector<std::string> InternalTlsArgs(const Args& a);

}  // namespace moeshard
