// Child processes for `moeshard up`: started with a pipe on stdout whose first line
// announces the ports the child bound; killed with their parent (PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace moeshard {

class ChildProcess {
 public:
  // Starts argv[0] with the arguments; waits up to `timeout_s` for the first stdout line.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::vector<std::string>& argv, double timeout_s);
  ~ChildProcess();
  const std::string& first_line() const { return first_line_; }
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  // Sends SIGTERM, then SIGKILL after `grace_s`; reaps the child.
  void Stop(double grace_s = 5.0);
  bool exited() const { return exited_; }
  // Non-blocking: true (and the exit status) if the child has exited.
  bool Poll(int* status);

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool exited_ = false;
  std::string name_, first_line_;
  std::thread drain_;
};

// The directory of the running executable (sibling binaries live there).
std::string SelfDir();
// Parses "name: grpc HOST:PORT ..." / "name: http://HOST:PORT ..." announcement lines.
absl::StatusOr<std::string> FieldAfter(const std::string& line, const std::string& key);

}  // namespace moeshard
