// The server's front: connections wait in one event loop (epoll), costing a file descriptor and a
// buffer, until a whole request has arrived; only then does a worker thread take it, and
// cpp-httplib parses, routes and answers it from the bytes already read. A client that sends half a
// request and waits ("slowloris"), or keeps an idle keep-alive connection, therefore holds no
// thread: it is closed at its deadline, and normal requests go straight past it.
//
// cpp-httplib's accept loop stays (its listening socket, its backlog): its task queue runs the
// per-connection job inline in the accept thread, and GatedHttpServer's override of that job hands
// the socket to the gate instead of reading from it. After an answer, a keep-alive connection goes
// back to the gate to wait for its next request.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace coconut::serve {

struct GateOptions {
  size_t max_connections = 4096;        // open connections at once (the rest get 503 and are closed)
  double first_byte_seconds = 5;        // a new connection's first byte, or an idle keep-alive one's next request
  double request_seconds = 10;          // from the first byte to the whole request (head and body)
  size_t max_head_bytes = 64 * 1024;    // request line and headers
  size_t max_body_bytes = 1 << 20;      // Content-Length (or chunked total)
  size_t workers = 16;                  // threads that answer complete requests (streams hold one each)
  size_t max_ready = 64;                // complete requests waiting for a worker (beyond: 503)
  int retry_after_seconds = 1;
};

// Whether `buffer` holds a whole HTTP/1.x request: the head up to its blank line and the body its
// Content-Length or chunked encoding says. `request_bytes` is then its length (bytes after it are
// the next, pipelined, request).
enum class Framing { kIncomplete, kComplete, kHeadTooLarge, kBodyTooLarge, kMalformed };
Framing frame_request(const std::string& buffer, size_t max_head_bytes, size_t max_body_bytes, size_t* request_bytes);

// What the gate has done, for /metrics and the load benchmark.
struct GateStats {
  int64_t open = 0;                     // connections held (waiting in the gate or being answered)
  int64_t waiting = 0;                  // ... of which in the gate (partial requests, idle keep-alive)
  int64_t answered = 0;                 // requests handed to a worker
  int64_t timed_out = 0;                // closed at a deadline
  int64_t refused = 0;                  // 503: too many connections or complete requests waiting
  int64_t rejected = 0;                 // 400 / 413: malformed or too large
};

class ConnectionGate;

// httplib::Server whose connections go through a ConnectionGate.
class GatedHttpServer : public httplib::Server {
 public:
  explicit GatedHttpServer(const GateOptions& options);
  ~GatedHttpServer() override;

  GateStats gate_stats() const;

 private:
  friend class ConnectionGate;
  bool process_and_close_socket(socket_t sock) override;  // httplib's per-connection job: to the gate
  // A worker's part: answer the request in `buffered` (and what follows on the socket); returns
  // true when the connection stays open for another request, whose bytes already read go to `next`.
  bool answer(int fd, std::string buffered, std::string* next);

  GateOptions options_;
  std::unique_ptr<ConnectionGate> gate_;
};

}  // namespace coconut::serve
