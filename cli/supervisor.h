// Supervision of the processes `moeshard up` runs: a dead process is restarted with backoff on
// the ports it had (so the addresses others hold stay valid), and a live process that stops
// answering its liveness probe (GET /health on the router's HTTP port, on the metrics port of
// the others) is killed and restarted the same way, as a Kubernetes liveness probe and restart
// policy would.
//
// Before the cluster has been ready once, nothing is restarted: a process that exits then
// (bad model, port taken, workers that refuse the handshake for good) fails `up` at once with
// the reason. After, restarts back off from 0.5 s doubling to 8 s; more than max_restarts
// deaths within restart_window is a crash loop and fails `up` too.
//
// Thread-compatible: one thread (up's loop) calls every method.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/process.h"

namespace moeshard {

// What a process announces on its first stdout line, and how it is restarted on the same ports.
enum class Role { kWorker, kCoordinator, kRouter };

struct SupervisorOptions {
  std::chrono::milliseconds probe_interval{1000};
  std::chrono::milliseconds probe_timeout{1000};
  int probe_failures = 3;  // consecutive failed probes that mark a process hung
  int max_restarts = 5;
  std::chrono::seconds restart_window{60};
};

class Supervisor {
 public:
  explicit Supervisor(SupervisorOptions options) : options_(options) {}
  ~Supervisor() { StopAll(); }

  // Starts a process and returns its announcement line.
  absl::StatusOr<std::string> Start(Role role, std::vector<std::string> argv, double start_timeout_s);
  // From now on deaths and hangs are healed rather than fatal.
  void MarkReady() { ready_ = true; }
  // One round: reaps and restarts (after backoff) the dead, probes the live. Errors end `up`.
  absl::Status Tick();
  // Stops every process, the last started first.
  void StopAll();
  int num_restarts() const { return num_restarts_; }
  size_t size() const { return children_.size(); }

 private:
  struct Child {
    Role role;
    std::vector<std::string> argv;  // with the ports it announced, for restarts
    double start_timeout_s = 0;
    std::unique_ptr<ChildProcess> process;  // null while waiting to restart
    std::string probe_url;                  // http://host:port, serving GET /health
    int failed_probes = 0;
    std::chrono::steady_clock::time_point next_probe, restart_at;
    std::vector<std::chrono::steady_clock::time_point> deaths;
  };
  absl::Status Announced(Child& c);  // pins the announced ports into argv, sets the probe
  absl::Status OnDeath(Child& c, const std::string& why);
  void Restart(Child& c);
  bool Probe(const Child& c) const;

  SupervisorOptions options_;
  std::vector<Child> children_;
  bool ready_ = false;
  int num_restarts_ = 0;
};

// "host:port" or "http://host:port/path" -> port; NotFound when there is none.
absl::StatusOr<std::string> PortOf(const std::string& address);
// Replaces the value of `flag` in argv, or appends the pair.
void SetFlag(std::vector<std::string>& argv, const std::string& flag, const std::string& value);

}  // namespace moeshard
