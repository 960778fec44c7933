// An HTTP server hardened against clients that hold connections without using them
// (slowloris), for the router's public API and every process's /metrics:
//   - a request's head and body must arrive within a deadline, however slowly they
//     trickle; an idle keep-alive connection is closed;
//   - connections are admitted per client address and in total; one past a limit is served
//     in "probe-only" mode: a short deadline, one request, and only the probe paths
//     (/health, /ready, ...) answered — anything else gets 503 — so that a prober from a
//     crowded address still gets through while an attacker's extra connections cost a thread
//     for a second at most;
//   - when every worker thread is busy, a few spare threads take new connections in
//     probe-only mode, so that the probes answer under any load.
// Optional TLS (OpenSSL) with the same limits. Built on cpp-httplib's Server: it replaces
// the per-connection loop and the task queue, and keeps httplib's parsing and routing.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "httplib.h"

namespace moeshard {

struct ConnectionLimits {
  int num_threads = 128;          // connections served at once
  int num_probe_threads = 4;      // spare threads, probe-only
  int max_connections = 256;      // fully admitted at once (served or queued)
  int max_per_client = 96;        // fully admitted at once from one address
  int request_read_timeout_s = 10;
  int probe_read_timeout_ms = 1000;
  int keep_alive_timeout_s = 5;
  std::set<std::string> probe_paths = {"/health", "/ready"};
  std::string tls_cert_file, tls_key_file;  // both: HTTPS
};

// For a pre-routing handler: true (with a 503 in `res`) when this connection is probe-only
// and `req` is not a probe.
bool RefuseOutsideProbes(const httplib::Request& req, httplib::Response& res);

// The server (routes are added by the caller); InvalidArgument when the TLS files cannot be
// loaded.
absl::StatusOr<std::unique_ptr<httplib::Server>> MakeHardenedServer(const ConnectionLimits& limits);

// Connections the kernel completes and holds for the accept loop (capped by net.core.somaxconn).
constexpr int kListenBacklog = 1024;

// Binds a server of MakeHardenedServer to host:port (any free port when port is 0) and raises
// its listen backlog to kListenBacklog: Debian's cpp-httplib listens with a backlog of 5, and 64
// clients connecting at once overflowed it (handshakes dropped, requests that died with no
// response, seconds added to others' first token). The bound port, or Unavailable.
absl::StatusOr<int> BindHardenedServer(httplib::Server& server, const std::string& host, int port);

}  // namespace moeshard
