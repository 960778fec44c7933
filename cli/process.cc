#include "cli/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace moeshard {

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, n);
  return p.substr(0, p.rfind('/'));
}

absl::StatusOr<std::string> FieldAfter(const std::string& line, const std::string& key) {
  size_t k = line.find(key);
  if (k == std::string::npos) return absl::NotFoundError(absl::StrCat("'", key, "' not in '", line, "'"));
  size_t b = k + key.size();
  while (b < line.size() && line[b] == ' ') ++b;
  size_t e = line.find(' ', b);
  return line.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(const std::vector<std::string>& argv, double timeout_s) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    dup2(fds[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "moeshard up: cannot exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  auto c = std::unique_ptr<ChildProcess>(new ChildProcess());
  c->pid_ = pid;
  c->out_fd_ = fds[0];
  c->name_ = argv[0].substr(argv[0].rfind('/') + 1);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string line;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      c->Stop(1);
      return absl::DeadlineExceededError(absl::StrCat(c->name_, " did not announce its ports in time"));
    }
    pollfd p{c->out_fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 200))) <= 0) continue;
    char ch;
    ssize_t n = read(c->out_fd_, &ch, 1);
    if (n <= 0) {
      c->Stop(1);
      return absl::UnavailableError(absl::StrCat(c->name_, " exited before announcing its ports"));
    }
    if (ch == '\n') break;
    line += ch;
  }
  c->first_line_ = line;
  int fd = c->out_fd_;
  c->drain_ = std::thread([fd] {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
      if (write(STDERR_FILENO, buf, n) < 0) break;
    }
  });
  return c;
}

bool ChildProcess::Poll(int* status) {
  if (exited_) return true;
  pid_t r = waitpid(pid_, status, WNOHANG);
  if (r == pid_) exited_ = true;
  return exited_;
}

void ChildProcess::Stop(double grace_s) {
  if (!exited_ && pid_ > 0) {
    kill(pid_, SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    int st;
    while (!Poll(&st) && std::chrono::steady_clock::now() < deadline) usleep(20000);
    if (!exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &st, 0);
      exited_ = true;
    }
  }
  if (drain_.joinable()) drain_.join();
  if (out_fd_ >= 0) close(out_fd_);
  out_fd_ = -1;
}

ChildProcess::~ChildProcess() { Stop(2); }

}  // namespace moeshard
