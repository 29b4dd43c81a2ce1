#include "serve/connection_gate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace coconut::serve {

using Clock = std::chrono::steady_clock;

namespace {

bool equals_ignoring_case(const std::string& a, const char* b) {
  const size_t n = std::strlen(b);
  if (a.size() != n) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::string trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r") - begin + 1);
}

// Chunked body starting at `at`: complete (its end in *end), incomplete, or too large / malformed.
Framing frame_chunked(const std::string& buffer, size_t at, size_t max_body_bytes, size_t* end) {
  size_t total = 0;
  while (true) {
    const size_t line_end = buffer.find('\n', at);
    if (line_end == std::string::npos) return buffer.size() - at > 64 ? Framing::kMalformed : Framing::kIncomplete;
    std::string size_text = trim(buffer.substr(at, line_end - at));
    size_text = size_text.substr(0, size_text.find(';'));  // chunk extensions
    if (size_text.empty() || size_text.size() > 15 || size_text.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
      return Framing::kMalformed;
    const size_t size = std::stoull(size_text, nullptr, 16);
    at = line_end + 1;
    if (size == 0) {  // trailers, then a blank line
      while (true) {
        const size_t trailer_end = buffer.find('\n', at);
        if (trailer_end == std::string::npos) return Framing::kIncomplete;
        const bool blank = trim(buffer.substr(at, trailer_end - at)).empty();
        at = trailer_end + 1;
        if (blank) {
          *end = at;
          return Framing::kComplete;
        }
      }
    }
    total += size;
    if (total > max_body_bytes) return Framing::kBodyTooLarge;
    if (buffer.size() < at + size + 1) return Framing::kIncomplete;
    at += size;
    if (buffer[at] == '\r') ++at;
    if (at >= buffer.size()) return Framing::kIncomplete;
    if (buffer[at] != '\n') return Framing::kMalformed;
    ++at;
  }
}

// A short answer written by the gate itself (best effort: the socket is non-blocking), then the
// connection closed. The body has the shape of the server's own errors.
void answer_and_close(int fd, int status, const char* reason, const std::string& message, int retry_after) {
  const std::string type = status == 503 ? "server_overloaded" : "invalid_request_error";
  const std::string body = "{\"error\":{\"message\":\"" + message + "\",\"type\":\"" + type + "\",\"param\":null,\"code\":" +
                           std::to_string(status) + "}}";
  std::string response = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: application/json\r\n";
  if (status == 503) response += "Retry-After: " + std::to_string(retry_after) + "\r\n";
  response += "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  (void)::send(fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd, SHUT_WR);
  ::close(fd);
}

void set_blocking(int fd, bool blocking) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, blocking ? flags & ~O_NONBLOCK : flags | O_NONBLOCK);
}

// httplib's view of a connection: the bytes the gate already read, then the socket itself.
class GateStream : public httplib::Stream {
 public:
  GateStream(int fd, std::string buffered, int read_timeout_ms, int write_timeout_ms)
      : fd_(fd), buffered_(std::move(buffered)), read_timeout_ms_(read_timeout_ms), write_timeout_ms_(write_timeout_ms) {}

  bool is_readable() const override { return position_ < buffered_.size() || wait(POLLIN, read_timeout_ms_); }
  bool is_writable() const override { return wait(POLLOUT, write_timeout_ms_); }
  ssize_t read(char* ptr, size_t size) override {
    if (position_ < buffered_.size()) {
      const size_t n = std::min(size, buffered_.size() - position_);
      std::memcpy(ptr, buffered_.data() + position_, n);
      position_ += n;
      return static_cast<ssize_t>(n);
    }
    if (!wait(POLLIN, read_timeout_ms_)) return -1;
    return ::recv(fd_, ptr, size, 0);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!wait(POLLOUT, write_timeout_ms_)) return -1;
    return ::send(fd_, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { address(true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address(false, ip, port); }
  socket_t socket() const override { return fd_; }
  // Bytes read ahead that the answered request did not use (a pipelined next request).
  std::string unread() const { return buffered_.substr(position_); }

 private:
  bool wait(short events, int timeout_ms) const {
    pollfd entry{fd_, events, 0};
    int ready;
    do ready = ::poll(&entry, 1, timeout_ms);
    while (ready < 0 && errno == EINTR);
    return ready > 0 && !(entry.revents & (POLLERR | POLLNVAL));
  }
  void address(bool remote, std::string& ip, int& port) const {
    sockaddr_storage storage{};
    socklen_t length = sizeof(storage);
    auto* generic = reinterpret_cast<sockaddr*>(&storage);
    if ((remote ? ::getpeername(fd_, generic, &length) : ::getsockname(fd_, generic, &length)) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (storage.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<sockaddr_in*>(&storage);
      ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
      port = ntohs(in->sin_port);
    } else if (storage.ss_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
      ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
      port = ntohs(in6->sin6_port);
    }
    ip = text;
  }

  int fd_;
  std::string buffered_;
  size_t position_ = 0;
  int read_timeout_ms_, write_timeout_ms_;
};

// Removes an "Expect: 100-continue" line from a complete head in `buffer`; true if there was one.
// The gate answers it (the client then sends its body), so cpp-httplib must not answer it again.
bool take_expect_continue(std::string& buffer) {
  const size_t head_end = buffer.find("\r\n\r\n");
  if (head_end == std::string::npos) return false;
  size_t at = buffer.find("\r\n");
  while (at < head_end) {
    const size_t line_begin = at + 2, line_end = buffer.find("\r\n", line_begin);
    std::string line = buffer.substr(line_begin, line_end - line_begin);
    std::transform(line.begin(), line.end(), line.begin(), [](unsigned char c) { return std::tolower(c); });
    line.erase(std::remove(line.begin(), line.end(), ' '), line.end());
    if (line == "expect:100-continue") {
      buffer.erase(line_begin, line_end + 2 - line_begin);
      return true;
    }
    at = line_end;
  }
  return false;
}

}  // namespace

Framing frame_request(const std::string& buffer, size_t max_head_bytes, size_t max_body_bytes, size_t* request_bytes) {
  // The head: lines up to the first empty one ("\r\n" or "\n" line ends).
  size_t at = 0, head_end = std::string::npos;
  std::vector<std::string> lines;
  while (true) {
    const size_t line_end = buffer.find('\n', at);
    if (line_end == std::string::npos) break;
    std::string line = buffer.substr(at, line_end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    at = line_end + 1;
    if (line.empty()) {
      if (lines.empty()) continue;  // blank lines before a request line are skipped (RFC 9112 2.2)
      head_end = at;
      break;
    }
    lines.push_back(std::move(line));
    if (at > max_head_bytes) return Framing::kHeadTooLarge;
  }
  if (head_end == std::string::npos) return buffer.size() > max_head_bytes ? Framing::kHeadTooLarge : Framing::kIncomplete;
  if (head_end > max_head_bytes) return Framing::kHeadTooLarge;
  if (lines.front().find(' ') == std::string::npos) return Framing::kMalformed;
  bool chunked = false, has_length = false;
  size_t length = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) return Framing::kMalformed;
    const std::string name = trim(lines[i].substr(0, colon)), value = trim(lines[i].substr(colon + 1));
    if (equals_ignoring_case(name, "Content-Length")) {
      if (value.empty() || value.size() > 15 || value.find_first_not_of("0123456789") != std::string::npos) return Framing::kMalformed;
      const size_t parsed = std::stoull(value);
      if (has_length && parsed != length) return Framing::kMalformed;
      has_length = true;
      length = parsed;
    } else if (equals_ignoring_case(name, "Transfer-Encoding")) {
      std::string lower = value;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
      chunked = lower.find("chunked") != std::string::npos;
    }
  }
  if (chunked && has_length) return Framing::kMalformed;  // request smuggling's favourite ambiguity
  if (chunked) return frame_chunked(buffer, head_end, max_body_bytes, request_bytes);
  if (length > max_body_bytes) return Framing::kBodyTooLarge;
  if (buffer.size() < head_end + length) return Framing::kIncomplete;
  *request_bytes = head_end + length;
  return Framing::kComplete;
}

// ---------------------------------------------------------------------------------------------

class ConnectionGate {
 public:
  ConnectionGate(GatedHttpServer& server, const GateOptions& options) : server_(server), options_(options) {
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_ < 0 || wake_ < 0) throw std::runtime_error("serve: cannot create the connection gate's event loop");
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = wake_;
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &event);
    loop_ = std::thread([this] { loop(); });
    for (size_t i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { work(); });
  }

  ~ConnectionGate() {
    stop();
    ::close(epoll_);
    ::close(wake_);
  }

  // A connection to wait on: new (from the accept thread) or answered and kept alive (from a worker,
  // with any bytes of its next request already read).
  void admit(int fd) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!loop_running_) {
        ::close(fd);
        return;
      }
      incoming_.push_back({fd, {}, true});
    }
    wake();
  }

  // Stops taking requests once those handed to workers are answered: connections waiting in the
  // gate are closed, workers finish what they hold, every thread is joined. Idempotent.
  void stop() {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stopped_) return;
      draining_ = true;
      drained_.wait(lock, [this] { return ready_.empty() && busy_workers_ == 0; });
      loop_running_ = false;
      workers_stop_ = true;
      stopped_ = true;
    }
    wake();
    work_ready_.notify_all();
    if (loop_.joinable()) loop_.join();
    for (auto& worker : workers_)
      if (worker.joinable()) worker.join();
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& entry : incoming_) {
      ::close(entry.fd);
      if (!entry.fresh) --open_;
    }
    incoming_.clear();
  }

  GateStats stats() const {
    GateStats stats;
    stats.open = open_.load();
    stats.waiting = waiting_count_.load();
    stats.answered = answered_.load();
    stats.timed_out = timed_out_.load();
    stats.refused = refused_.load();
    stats.rejected = rejected_.load();
    return stats;
  }

 private:
  struct Incoming {
    int fd;
    std::string buffered;  // bytes of its next request already read
    bool fresh;            // just accepted (else answered and kept alive: already counted open)
  };

  struct Waiting {
    std::string buffer;        // empty until its first byte has arrived
    Clock::time_point deadline;
    bool expect_checked = false;  // its head was looked at for "Expect: 100-continue"
  };

  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof(one));
  }

  Clock::duration seconds(double value) const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(value));
  }

  void close_waiting(int fd) {
    ::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    waiting_.erase(fd);
    --open_;
  }

  void take_incoming() {
    std::vector<Incoming> batch;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      batch.swap(incoming_);
    }
    for (auto& [fd, buffered, fresh] : batch) {
      if (fresh && static_cast<size_t>(open_.load()) >= options_.max_connections) {
        answer_and_close(fd, 503, "Service Unavailable", "too many open connections", options_.retry_after_seconds);
        ++refused_;
        continue;
      }
      if (fresh) ++open_;
      set_blocking(fd, false);
      epoll_event event{};
      event.events = EPOLLIN | EPOLLRDHUP;
      event.data.fd = fd;
      if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &event) != 0) {
        ::close(fd);
        --open_;
        continue;
      }
      Waiting& waiting = waiting_[fd];
      waiting.buffer = std::move(buffered);
      const bool started = !waiting.buffer.empty();
      waiting.deadline = Clock::now() + seconds(started ? options_.request_seconds : options_.first_byte_seconds);
      if (started) try_frame(fd);
    }
  }

  // Reads what the socket has; hands a complete request to the workers.
  void on_readable(int fd) {
    auto found = waiting_.find(fd);
    if (found == waiting_.end()) return;
    Waiting& waiting = found->second;
    const size_t cap = options_.max_head_bytes + options_.max_body_bytes + 64 * 1024;
    char chunk[16384];
    while (true) {
      const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
      if (n > 0) {
        if (waiting.buffer.empty()) waiting.deadline = Clock::now() + seconds(options_.request_seconds);  // its first byte
        waiting.buffer.append(chunk, static_cast<size_t>(n));
        if (waiting.buffer.size() > cap) break;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0 && errno == EINTR) continue;
      close_waiting(fd);  // the peer closed, or an error
      return;
    }
    try_frame(fd);
  }

  void try_frame(int fd) {
    Waiting& waiting = waiting_.at(fd);
    size_t request_bytes = 0;
    // A client that asks before sending its body gets its "100 Continue" here (once).
    if (!waiting.expect_checked && waiting.buffer.find("\r\n\r\n") != std::string::npos) {
      waiting.expect_checked = true;
      if (take_expect_continue(waiting.buffer) &&
          frame_request(waiting.buffer, options_.max_head_bytes, options_.max_body_bytes, &request_bytes) == Framing::kIncomplete) {
        static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
        (void)::send(fd, kContinue, sizeof(kContinue) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      }
    }
    switch (frame_request(waiting.buffer, options_.max_head_bytes, options_.max_body_bytes, &request_bytes)) {
      case Framing::kIncomplete:
        return;
      case Framing::kComplete:
        break;
      case Framing::kHeadTooLarge:
        reject(fd, 431, "Request Header Fields Too Large", "the request head is larger than " + std::to_string(options_.max_head_bytes) + " bytes");
        return;
      case Framing::kBodyTooLarge:
        reject(fd, 413, "Payload Too Large", "the request body is larger than " + std::to_string(options_.max_body_bytes) + " bytes");
        return;
      case Framing::kMalformed:
        reject(fd, 400, "Bad Request", "malformed HTTP request");
        return;
    }
    std::string buffer = std::move(waiting.buffer);
    ::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
    waiting_.erase(fd);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (ready_.size() < options_.max_ready && !draining_) {
        set_blocking(fd, true);
        ready_.push_back({fd, std::move(buffer)});
        ++answered_;
        work_ready_.notify_one();
        return;
      }
    }
    answer_and_close(fd, 503, "Service Unavailable", draining_ ? "shutting down" : "too many requests waiting for a worker",
                     options_.retry_after_seconds);
    --open_;
    ++refused_;
  }

  void reject(int fd, int status, const char* reason, const std::string& message) {
    ::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
    waiting_.erase(fd);
    answer_and_close(fd, status, reason, message, options_.retry_after_seconds);
    --open_;
    ++rejected_;
  }

  void expire(Clock::time_point now) {
    std::vector<int> expired;
    for (const auto& [fd, waiting] : waiting_)
      if (waiting.deadline <= now) expired.push_back(fd);
    for (int fd : expired) {
      const bool partial = !waiting_.at(fd).buffer.empty();
      ::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
      waiting_.erase(fd);
      if (partial) {
        answer_and_close(fd, 408, "Request Timeout", "the request did not arrive in time", options_.retry_after_seconds);
      } else {
        ::close(fd);
      }
      --open_;
      ++timed_out_;
    }
  }

  void loop() {
    std::vector<epoll_event> events(512);
    auto last_sweep = Clock::now();
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!loop_running_) break;
      }
      const int n = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), 100);
      for (int i = 0; i < n; ++i) {
        const int fd = events[static_cast<size_t>(i)].data.fd;
        if (fd == wake_) {
          uint64_t count;
          while (::read(wake_, &count, sizeof(count)) > 0) {
          }
          take_incoming();
        } else {
          on_readable(fd);
        }
      }
      const auto now = Clock::now();
      if (now - last_sweep >= std::chrono::milliseconds(100)) {
        expire(now);
        last_sweep = now;
      }
      waiting_count_ = static_cast<int64_t>(waiting_.size());
    }
    for (const auto& [fd, waiting] : waiting_) {
      ::close(fd);
      --open_;
    }
    waiting_.clear();
  }

  void work() {
    while (true) {
      std::pair<int, std::string> item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_ready_.wait(lock, [this] { return workers_stop_ || !ready_.empty(); });
        if (ready_.empty()) return;  // stopping, nothing left
        item = std::move(ready_.front());
        ready_.pop_front();
        ++busy_workers_;
      }
      const int fd = item.first;
      std::string next;
      bool keep = false;
      try {
        keep = server_.answer(fd, std::move(item.second), &next);
      } catch (...) {
        keep = false;
      }
      bool kept = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (keep && !draining_ && loop_running_) {
          incoming_.push_back({fd, std::move(next), false});
          kept = true;
        }
      }
      if (kept) {
        wake();
      } else {
        ::shutdown(fd, SHUT_RDWR);
        ::close(fd);
        --open_;
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --busy_workers_;
      }
      drained_.notify_all();
    }
  }

  GatedHttpServer& server_;
  GateOptions options_;
  int epoll_ = -1, wake_ = -1;
  std::thread loop_;
  std::vector<std::thread> workers_;

  std::mutex mutex_;
  std::condition_variable work_ready_, drained_;
  std::vector<Incoming> incoming_;
  std::deque<std::pair<int, std::string>> ready_;
  size_t busy_workers_ = 0;
  bool loop_running_ = true, draining_ = false, workers_stop_ = false, stopped_ = false;

  // The loop thread's own.
  std::unordered_map<int, Waiting> waiting_;

  std::atomic<int64_t> open_{0}, waiting_count_{0}, answered_{0}, timed_out_{0}, refused_{0}, rejected_{0};
};

// ---------------------------------------------------------------------------------------------

namespace {

// httplib's task queue for the accept loop: the job (process_and_close_socket) runs at once in the
// accept thread, where GatedHttpServer's override only hands the socket to the gate.
class InlineQueue : public httplib::TaskQueue {
 public:
  explicit InlineQueue(ConnectionGate& gate) : gate_(gate) {}
  void enqueue(std::function<void()> job) override { job(); }
  void shutdown() override { gate_.stop(); }

 private:
  ConnectionGate& gate_;
};

}  // namespace

GatedHttpServer::GatedHttpServer(const GateOptions& options) : options_(options) {
  // Never more connections than file descriptors: keep 128 for the model, logs and the rest.
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    if (limit.rlim_cur < limit.rlim_max) {  // raise the soft limit as far as allowed
      limit.rlim_cur = limit.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &limit);
      ::getrlimit(RLIMIT_NOFILE, &limit);
    }
    if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur > 256)
      options_.max_connections = std::min<size_t>(options_.max_connections, static_cast<size_t>(limit.rlim_cur) - 128);
  }
  gate_ = std::make_unique<ConnectionGate>(*this, options_);
  new_task_queue = [this] { return new InlineQueue(*gate_); };
}

GatedHttpServer::~GatedHttpServer() { gate_->stop(); }

GateStats GatedHttpServer::gate_stats() const { return gate_->stats(); }

bool GatedHttpServer::process_and_close_socket(socket_t sock) {
  gate_->admit(sock);
  return true;
}

bool GatedHttpServer::answer(int fd, std::string buffered, std::string* next) {
  const auto milliseconds = [](time_t seconds, time_t microseconds) {
    return static_cast<int>(seconds * 1000 + microseconds / 1000);
  };
  GateStream stream(fd, std::move(buffered), milliseconds(read_timeout_sec_, read_timeout_usec_),
                    milliseconds(write_timeout_sec_, write_timeout_usec_));
  bool closed = false;
  const bool answered = process_request(stream, /*close_connection=*/false, closed, nullptr);
  *next = stream.unread();
  return answered && !closed;
}

}  // namespace coconut::serve
