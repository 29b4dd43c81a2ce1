// `coconut serve`: an OpenAI-compatible HTTP server (cpp-httplib) in front of the continuous-
// batching scheduler.
//
//   POST /v1/completions       prompt, max_tokens, temperature, top_p, seed, stop, stream (SSE,
//                              one event per released piece of text, then `data: [DONE]`), and the
//                              extensions latent_thoughts, depth_budget, router_threshold,
//                              depth_cascade; usage with prompt_tokens, completion_tokens,
//                              latent_thoughts, layers_per_position and flops (and a cascade's
//                              levels, depth_cascade)
//   POST /v1/chat/completions  the same from "messages", rendered by the model's chat template
//                              (text/chat_template.h: ChatML, Llama 3); 400 for another template
//   GET  /health, /v1/models, /metrics (Prometheus text)
//
// Errors are JSON, {"error": {"message", "type", "param", "code"}}: 400 bad fields or JSON, 404
// unknown paths, 413 a body over max_body_bytes, 503 with Retry-After when the queue is full, a
// request waited too long or the server is stopping.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "serve/served_model.h"

namespace coconut::serve {

struct ServeOptions {
  std::string model_dir;
  std::string adapter_dir;              // a PEFT adapter merged in at load (empty: none)
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0 = any free port
  int64_t max_batch = 8;
  int64_t max_queue = 64;
  int64_t context = 0;                  // KV columns per slot; 0 = the model's max_position_embeddings
  double max_queue_wait_seconds = 30;
  int64_t max_queued_tokens = 0;        // positions queued requests may need in all (0 = max_batch x context)
  int64_t prefill_chunk = 64;           // prompt tokens a request reads per step (0 = all at once)
  int wide_step_threads = 0;            // threads for a pass over >= wide_step_rows positions (0 = the usual count;
                                        // `coconut serve`: -1 = every core, its default)
  int64_t wide_step_rows = 0;           // positions from which a pass is wide; 0 = automatic (default_wide_step_rows)
  // KV-cache lanes stepped side by side (SchedulerOptions::lanes); 0 = automatic: on a CPU, one
  // per wide-step thread when the weights fit in the last-level cache (a small model, whose passes
  // are mostly per-operation overhead), else 1 (see default_lanes).
  int lanes = 0;
  // While more than one request runs, a stream writes its tokens at most this often (each still
  // its own event; the first token goes at once). 0 = every token as it is made.
  int stream_interval_ms = 10;
  int64_t max_body_bytes = 1 << 20;
  int read_timeout_seconds = 10;        // a client slower than this to send its request (from its first byte) is dropped
  double first_byte_timeout_seconds = 5;  // ... or than this to start one (a new or an idle keep-alive connection)
  int64_t max_connections = 4096;       // open connections at once; more get 503 (at most the file limit less 128)
  int write_timeout_seconds = 10;       // ... or to take its answer
  double shutdown_grace_seconds = 30;   // SIGTERM: in-flight requests get this long to finish
  std::string dtype;                    // "" = the checkpoint's
  std::string weights = "auto";         // auto | dense | q8_0 | q4_0 | q4_1 (reasoning/layout.h resolve_weights)
  std::string device = "cpu";
};

class Server {
 public:
  Server(ServedModel model, const ServeOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and returns the port (the chosen one for port 0). Throws when it cannot.
  int bind();
  // Serves until shutdown() has stopped it and every in-flight request is answered.
  void listen();
  // Stops accepting connections and requests; in-flight requests get the grace to finish, then
  // are cut short. Returns at once (listen() returns when all is done). Safe from any thread.
  void shutdown();

  const ServedModel& model() const;
  int64_t context() const;
  int lanes() const;  // the lanes in use
  int64_t wide_step_rows() const;  // positions from which a pass is wide (resolved when automatic)

  struct State;  // the implementation (server.cpp)

 private:
  std::unique_ptr<State> state_;
};

// Automatic lanes: `threads` (the wide-step threads) on a CPU when the weights one step reads take
// at most `cache_bytes` (the last-level cache, model/threads.h), else 1. Two lanes read the
// weights once each per step: cheap from the cache, while each saves the fork and join of every
// operation; a model larger than the cache is better served by splitting each operation between
// the threads (bench_serve: the 1.6-2.1M shipped models 1.13-1.28x with two lanes, the random
// 27.8M 0.77x).
int default_lanes(const Llama& model, int threads, int64_t cache_bytes);

// Automatic wide passes: from one position (every pass on the wide-step threads) where a decoded
// token reads at least kWidePassWeightBytes of weights on the CPU, else from 8. Such a pass spends
// milliseconds streaming weights, which a second core nearly halves; a small model's pass is
// mostly per-operation overhead, which a thread waiting for the HTTP threads' core does not
// shorten. bench_serve, one client, the 2-core Xeon of docs/real-models.md (2026-11-30): the random
// 27.8M model (111 MB a token) 96.5 -> 207.2 tokens/s, SmolLM2-135M (540 MB) 18.6-20.0 -> 30.2-31.6;
// the shipped prontoqa-cot (6 MB) 1,385-1,799 against 1,516-1,673, within noise.
constexpr int64_t kWidePassWeightBytes = int64_t{32} << 20;
int64_t default_wide_step_rows(Llama& model);

// The subcommand: loads options.model_dir, prints the address and the model's size and cost on
// `log`, serves until SIGTERM or SIGINT, then shuts down gracefully. Returns the exit code (0).
int serve(const ServeOptions& options, std::ostream& log);

}  // namespace coconut::serve
