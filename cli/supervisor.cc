#include "cli/supervisor.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "httplib.h"

namespace moeshard {

absl::StatusOr<std::string> PortOf(const std::string& address) {
  std::string a = address;
  if (size_t scheme = a.find("://"); scheme != std::string::npos) a = a.substr(scheme + 3);
  if (size_t path = a.find('/'); path != std::string::npos) a = a.substr(0, path);
  size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon + 1 == a.size()) {
    return absl::NotFoundError(absl::StrCat("no port in '", address, "'"));
  }
  return a.substr(colon + 1);
}

void SetFlag(std::vector<std::string>& argv, const std::string& flag, const std::string& value) {
  auto it = std::find(argv.begin(), argv.end(), flag);
  if (it != argv.end() && it + 1 != argv.end()) {
    *(it + 1) = value;
  } else {
    argv.insert(argv.end(), {flag, value});
  }
}

absl::Status Supervisor::Announced(Child& c) {
  const std::string& line = c.process->first_line();
  // The ports each role announces, and the flags that bind them again.
  std::vector<std::pair<std::string, std::string>> ports;  // announcement key -> flag
  switch (c.role) {
    case Role::kWorker:
    case Role::kCoordinator:
      ports = {{"grpc", "--port"}, {"metrics", "--metrics-port"}};
      break;
    case Role::kRouter:
      ports = {{"moeshard-router:", "--port"}, {"grpc", "--grpc-port"}};
      break;
  }
  for (const auto& [key, flag] : ports) {
    ASSIGN_OR_RETURN(std::string address, FieldAfter(line, key));
    ASSIGN_OR_RETURN(std::string port, PortOf(address));
    SetFlag(c.argv, flag, port);
  }
  const std::string probe_key = c.role == Role::kRouter ? "moeshard-router:" : "metrics";
  ASSIGN_OR_RETURN(std::string url, FieldAfter(line, probe_key));
  if (size_t path = url.find('/', url.find("://") + 3); path != std::string::npos) url = url.substr(0, path);
  c.probe_url = url;
  c.failed_probes = 0;
  c.next_probe = std::chrono::steady_clock::now() + options_.probe_interval;
  return absl::OkStatus();
}

absl::StatusOr<std::string> Supervisor::Start(Role role, std::vector<std::string> argv, double start_timeout_s) {
  Child c;
  c.role = role;
  c.argv = std::move(argv);
  c.start_timeout_s = start_timeout_s;
  ASSIGN_OR_RETURN(c.process, ChildProcess::Start(c.argv, start_timeout_s));
  RETURN_IF_ERROR(Announced(c));
  std::string line = c.process->first_line();
  children_.push_back(std::move(c));
  return line;
}

bool Supervisor::Probe(const Child& c) const {
  httplib::Client cli(c.probe_url);
  cli.set_connection_timeout(options_.probe_timeout);
  cli.set_read_timeout(options_.probe_timeout);
  auto res = cli.Get("/health");
  return res && res->status == 200;
}

absl::Status Supervisor::OnDeath(Child& c, const std::string& why) {
  const std::string name = c.process ? c.process->name() : "process";
  c.process.reset();
  if (!ready_) return absl::AbortedError(absl::StrCat(name, " ", why, " before the cluster was ready"));
  const auto now = std::chrono::steady_clock::now();
  c.deaths.push_back(now);
  std::erase_if(c.deaths, [&](auto t) { return now - t > options_.restart_window; });
  if (static_cast<int>(c.deaths.size()) > options_.max_restarts) {
    return absl::AbortedError(absl::StrCat(name, " ", why, ": ", c.deaths.size(), " deaths within ",
                                           options_.restart_window.count(), " s, giving up"));
  }
  const auto backoff = std::chrono::milliseconds(std::min<int64_t>(8000, 500LL << (c.deaths.size() - 1)));
  c.restart_at = now + backoff;
  std::fprintf(stderr, "moeshard up: %s %s; restarting it in %.1f s\n", name.c_str(), why.c_str(),
               std::chrono::duration<double>(backoff).count());
  return absl::OkStatus();
}

void Supervisor::Restart(Child& c) {
  auto p = ChildProcess::Start(c.argv, c.start_timeout_s);
  if (!p.ok()) {
    std::fprintf(stderr, "moeshard up: restart failed: %s\n", std::string(p.status().message()).c_str());
    c.restart_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    c.deaths.push_back(std::chrono::steady_clock::now());
    return;
  }
  c.process = *std::move(p);
  ++num_restarts_;
  if (absl::Status st = Announced(c); !st.ok()) {
    std::fprintf(stderr, "moeshard up: %s\n", std::string(st.message()).c_str());
  }
  std::fprintf(stderr, "moeshard up: restarted %s (pid %d)\n", c.process->name().c_str(), c.process->pid());
}

absl::Status Supervisor::Tick() {
  const auto now = std::chrono::steady_clock::now();
  for (Child& c : children_) {
    if (!c.process) {
      if (static_cast<int>(c.deaths.size()) > options_.max_restarts) {
        return absl::AbortedError("a process cannot be restarted");
      }
      if (now >= c.restart_at) Restart(c);
      continue;
    }
    int st = 0;
    if (c.process->Poll(&st)) {
      const std::string why = WIFSIGNALED(st)
                                  ? absl::StrCat("(pid ", c.process->pid(), ") was killed by signal ", WTERMSIG(st))
                                  : absl::StrCat("(pid ", c.process->pid(), ") exited with status ", WEXITSTATUS(st));
      RETURN_IF_ERROR(OnDeath(c, why));
      continue;
    }
    if (!ready_ || now < c.next_probe) continue;
    c.next_probe = now + options_.probe_interval;
    c.failed_probes = Probe(c) ? 0 : c.failed_probes + 1;
    if (c.failed_probes >= options_.probe_failures) {
      const std::string why = absl::StrCat("(pid ", c.process->pid(), ") failed ", c.failed_probes,
                                           " liveness probes in a row (hung): killed");
      c.process->Stop(/*grace_s=*/0);
      RETURN_IF_ERROR(OnDeath(c, why));
    }
  }
  return absl::OkStatus();
}

void Supervisor::StopAll() {
  // The router goes first and drains its streams while the coordinators and workers still run.
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    if (it->process) it->process->Stop(it->role == Role::kRouter ? 15 : 5);
  }
  children_.clear();
}

}  // namespace moeshard
