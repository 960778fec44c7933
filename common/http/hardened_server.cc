#include "common/http/hardened_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace moeshard {
namespace {

using Clock = std::chrono::steady_clock;
thread_local bool t_probe_thread = false;                     // a spare thread
thread_local const std::set<std::string>* t_probe_only = nullptr;  // this connection: only these paths

// Milliseconds until `deadline`, at least 0.
int MsUntil(Clock::time_point deadline) {
  return static_cast<int>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
}

bool WaitFor(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  int r;
  do {
    r = poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  return r > 0 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
}

// A connection's byte stream (plain or TLS) with a deadline on reads: a request's bytes
// must all arrive before it, however slowly they trickle.
class DeadlineStream : public httplib::Stream {
 public:
  DeadlineStream(int fd, SSL* ssl, int write_timeout_s) : fd_(fd), ssl_(ssl), write_timeout_ms_(write_timeout_s * 1000) {}
  void set_read_deadline(Clock::time_point d) { read_deadline_ = d; }
  bool Buffered() const { return begin_ < end_ || (ssl_ != nullptr && SSL_pending(ssl_) > 0); }

  bool is_readable() const override { return Buffered() || WaitFor(fd_, POLLIN, MsUntil(read_deadline_)); }
  bool is_writable() const override { return WaitFor(fd_, POLLOUT, write_timeout_ms_); }
  ssize_t read(char* ptr, size_t size) override {
    if (begin_ == end_) {
      if (!is_readable()) return -1;
      const ssize_t n = ssl_ != nullptr ? SSL_read(ssl_, buf_, sizeof(buf_)) : recv(fd_, buf_, sizeof(buf_), 0);
      if (n <= 0) return n < 0 && ssl_ == nullptr ? -1 : 0;
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - begin_);
    std::memcpy(ptr, buf_ + begin_, n);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    if (ssl_ != nullptr) return SSL_write(ssl_, ptr, static_cast<int>(std::min<size_t>(size, 1 << 30)));
    return send(fd_, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { Address(true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { Address(false, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  void Address(bool remote, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ip.clear();
    port = 0;
    if ((remote ? getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) : getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len)) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
      port = ntohs(a->sin6_port);
    }
    ip = text;
  }

  int fd_;
  SSL* ssl_;
  int write_timeout_ms_;
  Clock::time_point read_deadline_ = Clock::now();
  char buf_[4096];
  size_t begin_ = 0, end_ = 0;
};

// Worker threads take connections in order; when every worker holds (or has been handed) a
// connection, a free probe thread takes the next one instead (it serves probes only), so that
// /health answers under any load. Counts are of connections handed out, not of threads seen
// waiting: a thread that has not started yet, or has not woken for its job, is still counted
// right.
class AdmissionQueue : public httplib::TaskQueue {
 public:
  AdmissionQueue(int num_threads, int num_probe_threads)
      : num_workers_(num_threads), num_probes_(num_probe_threads) {
    for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Run(false); });
    for (int i = 0; i < num_probe_threads; ++i) threads_.emplace_back([this] { Run(true); });
  }
  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      const bool to_probe = busy_workers_ >= num_workers_ && busy_probes_ < num_probes_;
      ++(to_probe ? busy_probes_ : busy_workers_);
      (to_probe ? probe_jobs_ : jobs_).push_back(std::move(fn));
    }
    cv_.notify_all();
  }
  void shutdown() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void Run(bool probe) {
    t_probe_thread = probe;
    std::deque<std::function<void()>>& queue = probe ? probe_jobs_ : jobs_;
    int& busy = probe ? busy_probes_ : busy_workers_;
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !queue.empty(); });
        if (queue.empty()) return;
        fn = std::move(queue.front());
        queue.pop_front();
      }
      fn();
      std::lock_guard<std::mutex> l(mu_);
      --busy;
    }
  }

  const int num_workers_, num_probes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_, probe_jobs_;
  int busy_workers_ = 0, busy_probes_ = 0;  // connections handed to each kind, queued or running
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

class HardenedServer : public httplib::Server {
 public:
  HardenedServer(ConnectionLimits limits, SSL_CTX* ctx) : limits_(std::move(limits)), ctx_(ctx) {
    new_task_queue = [n = limits_.num_threads, p = limits_.num_probe_threads] { return new AdmissionQueue(n, p); };
    // httplib applies these options to the listening socket only, before its bind and listen.
    // SO_REUSEADDR alone: httplib's default, SO_REUSEPORT, let a second server bind a port in
    // use and take half of its connections (a second cluster started on a router's port, say).
    // The socket is remembered so that BindHardenedServer can raise its backlog afterwards.
    set_socket_options([this](socket_t sock) {
      const int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      listen_fd_ = sock;
    });
  }
  ~HardenedServer() override {
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
  }
  int listen_fd() const { return listen_fd_; }

 private:
  // Counts a connection of `ip` in: true when it is within the limits (probe-only otherwise).
  bool Admit(const std::string& ip) {
    std::lock_guard<std::mutex> l(mu_);
    if (total_ >= limits_.max_connections || per_client_[ip] >= limits_.max_per_client) {
      if (per_client_[ip] == 0) per_client_.erase(ip);
      return false;
    }
    ++total_;
    ++per_client_[ip];
    return true;
  }
  void Release(const std::string& ip) {
    std::lock_guard<std::mutex> l(mu_);
    --total_;
    if (--per_client_[ip] == 0) per_client_.erase(ip);
  }

  bool process_and_close_socket(socket_t sock) override {
    std::string ip;
    int port = 0;
    DeadlineStream(sock, nullptr, 1).get_remote_ip_and_port(ip, port);
    const bool admitted = Admit(ip);
    const bool ok = Serve(sock, !admitted || t_probe_thread);
    if (admitted) Release(ip);
    shutdown(sock, SHUT_RDWR);
    close(sock);
    return ok;
  }

  bool Serve(int sock, bool probe_only) {
    const auto read_timeout = probe_only ? std::chrono::milliseconds(limits_.probe_read_timeout_ms)
                                         : std::chrono::milliseconds(limits_.request_read_timeout_s * 1000);
    SSL* ssl = nullptr;
    if (ctx_ != nullptr) {
      // The handshake under the same deadline, through socket timeouts.
      timeval tv{static_cast<time_t>(read_timeout.count() / 1000), static_cast<suseconds_t>(read_timeout.count() % 1000 * 1000)};
      setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      ssl = SSL_new(ctx_);
      if (ssl == nullptr || SSL_set_fd(ssl, sock) != 1 || SSL_accept(ssl) != 1) {
        if (ssl != nullptr) SSL_free(ssl);
        ERR_clear_error();
        return false;
      }
    }
    DeadlineStream strm(sock, ssl, static_cast<int>(write_timeout_sec_));
    t_probe_only = probe_only ? &limits_.probe_paths : nullptr;
    bool ok = true;
    for (size_t count = 0; ok && count < keep_alive_max_count_; ++count) {
      // The first request gets the read timeout to start; later ones the keep-alive timeout.
      strm.set_read_deadline(Clock::now() + (count == 0 ? read_timeout : std::chrono::milliseconds(limits_.keep_alive_timeout_s * 1000)));
      if (!strm.is_readable()) break;
      strm.set_read_deadline(Clock::now() + read_timeout);
      bool connection_closed = false;
      const bool last = probe_only || count + 1 == keep_alive_max_count_;
      ok = process_request(strm, last, connection_closed, nullptr);
      if (connection_closed || last) break;
    }
    if (ssl != nullptr) {
      SSL_shutdown(ssl);
      SSL_free(ssl);
    }
    t_probe_only = nullptr;
    return ok;
  }

  const ConnectionLimits limits_;
  SSL_CTX* ctx_;
  int listen_fd_ = -1;
  std::mutex mu_;
  int total_ = 0;
  std::map<std::string, int> per_client_;
};

}  // namespace

bool RefuseOutsideProbes(const httplib::Request& req, httplib::Response& res) {
  if (t_probe_only == nullptr || t_probe_only->count(req.path) != 0) return false;
  res.status = 503;
  res.set_header("Retry-After", "1");
  res.set_content(R"({"error":{"message":"the server is busy: too many connections","type":"server_error","code":503}})",
                  "application/json");
  return true;
}

absl::StatusOr<std::unique_ptr<httplib::Server>> MakeHardenedServer(const ConnectionLimits& limits) {
  SSL_CTX* ctx = nullptr;
  if (!limits.tls_cert_file.empty()) {
    ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == nullptr) return absl::InternalError("TLS: cannot make an OpenSSL context");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (SSL_CTX_use_certificate_chain_file(ctx, limits.tls_cert_file.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, limits.tls_key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      SSL_CTX_free(ctx);
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat("TLS: cannot load the certificate ", limits.tls_cert_file,
                                                     " with the key ", limits.tls_key_file));
    }
  }
  return std::unique_ptr<httplib::Server>(new HardenedServer(limits, ctx));
}

absl::StatusOr<int> BindHardenedServer(httplib::Server& server, const std::string& host, int port) {
  const int bound = port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) return absl::UnavailableError(absl::StrCat("cannot bind ", host, ":", port));
  auto* hs = dynamic_cast<HardenedServer*>(&server);
  if (hs == nullptr || hs->listen_fd() < 0) return absl::InternalError("BindHardenedServer: not a hardened server");
  // listen() on a listening socket sets its backlog anew (Linux; nothing else changes).
  if (listen(hs->listen_fd(), kListenBacklog) != 0) {
    return absl::InternalError(absl::StrCat("listen backlog: ", std::strerror(errno)));
  }
  return bound;
}

}  // namespace moeshard
