// Continuous batching: one worker thread owns the model and a per-row KV cache of `max_batch`
// slots (or one per lane: SchedulerOptions::lanes). At every step boundary it frees the slots of finished or cancelled requests and admits
// queued requests into free slots. Each step, a slot still reading its prompt runs its next chunk
// of it alone (prefill_chunk positions), then one batched one-position pass runs every slot that is
// thinking (a continuous thought), closing its thoughts (<|end-latent|>) or decoding (the token it
// just sampled). So one request's prompt, thoughts and tokens interleave with the others' decode
// steps, a long prompt delays the others by one chunk per step, and a request never waits for
// another to finish.
//
// Each request keeps its own sampling generator, router threshold and depth budget, so its output
// does not depend on which other requests share its steps (greedy: token for token, up to float32
// reordering inside a batched matrix product).
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/generate.h"
#include "model/llama.h"
#include "reasoning/layout.h"

namespace coconut::serve {

// What the worker runs for one request, in token ids.
struct GenerationRequest {
  std::vector<int64_t> prompt;          // everything before the thoughts (BOS, text, <|start-latent|>)
  int64_t latent_thoughts = 0;          // continuous thoughts after the prompt
  std::vector<int64_t> after_latents;   // tokens after the thoughts (<|end-latent|>), every layer
  int64_t max_new_tokens = 16;
  SamplingOptions sampling;
  std::vector<int64_t> stop_ids;        // a request ends after emitting one of these
  // Models with a depth router, for the thoughts and decoded tokens: the gate threshold (<= 0: every
  // layer), and a depth budget (> 0: the mean layers per thought/token stays at or below it; a
  // position may run floor(budget * passes so far) minus the layers already spent).
  double router_threshold = 0.5;
  double depth_budget = 0;
  // A model without a router: only its first `layers` layers run, for the prompt, the thoughts and
  // the answer (0: every layer); a request's depth_budget (served_model.h).
  int64_t layers = 0;
  // Or a depth cascade (reasoning/layout.h; a model without a router; `layers` unused): the request
  // runs whole at the first depth; where its answer's confidence, the lowest probability of its
  // tokens under their logits (softmax at temperature 1), is at most cascade.confidence, it runs
  // again at the next depth from its prompt's state there (the prompt's shallower layers are not
  // run again: their K/V stay in the slot), and so on. A level's tokens are held back until the
  // level is kept, so a client sees only the kept answer; the last level's stream as they come.
  DepthCascade cascade;
  // Latent bottleneck (a model trained with it): after the thoughts, the prompt but its last token
  // (<|start-latent|>) is hidden from the request's later positions (GenerationOptions).
  bool latent_bottleneck = false;
  // >= 0: each token event carries the token's log-probability under its logits (log-softmax,
  // temperature 1) and the `top_logprobs` most likely tokens there (a completion's "logprobs": k).
  // Not with a depth cascade (whose levels hold their tokens back).
  int64_t top_logprobs = -1;
};

// A level of a depth cascade that ran and was not kept (its answer was not confident enough).
struct CascadeLevelRun {
  int64_t layers = 0;
  int64_t tokens = 0;       // the answer's tokens at that level (stop token included)
  double confidence = 0;    // their lowest probability
};

enum class FinishReason {
  kLength,     // max_new_tokens reached
  kStopToken,  // emitted a stop id (EOS)
  kCancelled,  // cancelled by its handler (stop string, client gone)
  kRejected,   // never started: waited in the queue too long, or the server stopped first
  kFailed,     // the model threw (message says what)
};

struct GenerationEvent {
  enum class Kind { kStarted, kToken, kFinished };
  Kind kind = Kind::kStarted;
  int64_t token = -1;                 // kToken
  double logprob = 0;                 // kToken with GenerationRequest::top_logprobs >= 0
  std::vector<std::pair<int64_t, double>> top_logprobs;  // likewise: the best tokens, best first
  // One-position passes under the router since the previous event (thoughts before the first
  // token, then the pass that fed back the previous token); empty without a router.
  std::vector<AdaptivePass> passes;
  // A depth cascade: the levels run and left since the previous event (with the kept level's first
  // token, or its end).
  std::vector<CascadeLevelRun> cascade_levels;
  FinishReason reason = FinishReason::kLength;  // kFinished
  std::string message;                          // kFinished with kRejected / kFailed
};

// One request as both sides see it: the worker pushes events, its HTTP handler waits for them.
class GenerationJob {
 public:
  explicit GenerationJob(GenerationRequest request);
  const GenerationRequest& request() const { return request_; }

  // The events that arrived, waiting up to `timeout` for one that wakes the reader (empty when
  // none arrived). Every event wakes it, unless tokens are set not to: then only the start and the
  // end do, and the tokens that came meanwhile are returned when the timeout ends.
  std::vector<GenerationEvent> wait_events(std::chrono::milliseconds timeout);
  // Whether a token wakes a reader waiting in wait_events (default yes). A reader that wants the
  // whole answer, or a stream that writes at most every few milliseconds, turns it off: a wakeup is
  // a context switch on the worker's cores, about 10 us a token (serve benchmark, 16 streams).
  void set_wake_on_tokens(bool wake);
  // Frees the request's slot (or queue place) at the next step boundary.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  void push(GenerationEvent event);  // worker side
  std::chrono::steady_clock::time_point enqueued_at;

 private:
  GenerationRequest request_;
  std::atomic<bool> cancelled_{false};
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<GenerationEvent> events_;
  bool wake_on_tokens_ = true;  // under mutex_
  bool woken_ = false;          // an event that wakes the reader is waiting (under mutex_)
};

// submit() refusals, both answered 503 with Retry-After (QueueFull's says when to come back).
struct QueueFull : std::runtime_error {
  explicit QueueFull(const std::string& message, int retry_after = 1)
      : std::runtime_error(message), retry_after_seconds(retry_after) {}
  int retry_after_seconds;
};
struct ShuttingDown : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct SchedulerOptions {
  int64_t max_batch = 8;              // slots: requests running at once
  int64_t max_queue = 64;             // requests waiting for a slot
  int64_t context = 0;                // KV columns per slot; 0 = the model's max_position_embeddings
  double max_queue_wait_seconds = 30; // a request still queued after this is rejected, and one the
                                      // work ahead of it would keep queued longer is refused at once
  // Positions the queued requests may need in all (prompt + thoughts + max_tokens each); 0 = as
  // many as max_batch requests filling the context.
  int64_t max_queued_tokens = 0;
  int64_t prefill_chunk = 64;         // prompt tokens a slot reads per step (a tail under a quarter of it
                                      // joins the chunk before); 0 = the whole prompt at once
  // Intra-op threads for a pass over at least wide_step_rows positions: a decoding step of that
  // many rows, or a prompt chunk that long (0: the count in effect when the scheduler starts, for
  // every pass). A server runs narrow passes on fewer threads than cores, leaving one to its HTTP
  // threads; a wide pass has enough arithmetic to use them all.
  int wide_step_threads = 0;
  int64_t wide_step_rows = 8;
  // Lanes: the slots are dealt round-robin to this many lanes, each with its own KV cache; when
  // two or more lanes hold requests, each lane's step (prompt chunks, sampling, batched pass) runs
  // on its own thread with one intra-op thread, concurrently. For a small model, whose pass is
  // mostly per-operation overhead, that uses the cores better than splitting each operation
  // between them (no fork and join per operation, no thread waiting at a barrier). 1 = one cache.
  int lanes = 1;
};

// Counters for /metrics (a snapshot).
struct SchedulerStats {
  int64_t queued = 0, running = 0, max_batch = 0;
  int64_t accepted = 0;        // requests submit() took, since start
  int64_t steps = 0;           // batched one-position passes
  int64_t step_rows = 0;       // rows taking part in them, summed (step_rows / steps = occupancy)
  int64_t prompt_tokens = 0, generated_tokens = 0, latent_thoughts = 0;
  int64_t queued_tokens = 0;      // positions the queued requests may need
  double positions_per_second = 0;  // recent throughput (prompt chunks and step rows), 0 before any
};

class Scheduler {
 public:
  // Starts the worker; the model moves to it (eval mode, no gradients).
  Scheduler(Llama model, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Throws QueueFull, or ShuttingDown once shutdown() began.
  std::shared_ptr<GenerationJob> submit(GenerationRequest request);
  // Stops accepting; what is running or queued gets `grace` to finish, then is cancelled with
  // FinishReason::kRejected / kFailed. Returns at once; join() waits for the worker.
  void shutdown(std::chrono::steady_clock::duration grace);
  void join();

  int64_t context() const { return context_; }
  const LlamaConfig& config() const { return config_; }
  SchedulerStats stats() const;
  int64_t running() const { return running_; }  // requests holding a slot
  int64_t lanes() const { return lanes_; }
  int64_t wide_step_rows() const { return options_.wide_step_rows; }

 private:
  struct Slot;
  class LaneThread;
  void run();
  void admit(int64_t slot, std::shared_ptr<GenerationJob> job);
  // Slot s lives in lane s % lanes, at row s / lanes of that lane's cache.
  int64_t lane_of(int64_t slot) const { return slot % lanes_; }
  int64_t row_of(int64_t slot) const { return slot / lanes_; }
  int64_t slot_of(int64_t lane, int64_t row) const { return row * lanes_ + lane; }
  void prefill_chunk(int64_t slot);
  // A cascade level ended unconfident: the slot starts over at the next depth from its prompt's state.
  void deepen(int64_t slot);
  void use_threads_for(int64_t positions);  // intra-op threads for a pass over this many positions
  void step();                  // every lane that holds a request, concurrently when two or more do
  void lane_step(int64_t lane);  // one lane's prompt chunks, sampling and batched pass
  void free_slot(int64_t slot, FinishReason reason, const std::string& message = "");

  Llama model_{nullptr};
  LlamaConfig config_;
  SchedulerOptions options_;
  int64_t context_ = 0;
  int narrow_threads_ = 1;  // the worker's intra-op threads for a step narrower than wide_step_rows
  torch::Device device_;
  int64_t lanes_ = 1;
  std::vector<std::unique_ptr<KVCache>> caches_;  // one per lane
  std::vector<std::unique_ptr<LaneThread>> lane_threads_;  // lanes 1.. (lane 0 runs on the worker)
  bool concurrent_lanes_ = false;  // this step's lanes run side by side, one intra-op thread each
  std::vector<std::unique_ptr<Slot>> slots_;  // null = free

  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<std::shared_ptr<GenerationJob>> queue_;
  bool accepting_ = true;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::atomic<int64_t> accepted_{0}, running_{0}, steps_{0}, step_rows_{0}, prompt_tokens_{0}, generated_tokens_{0},
      latent_thoughts_{0};
  // Admission: positions the queue may need (under mutex_), what the running requests may still
  // need, and the recent rate at which positions are processed (both written by the worker).
  int64_t queued_tokens_ = 0;
  std::atomic<int64_t> running_remaining_{0};
  std::atomic<double> positions_per_second_{0};
  std::thread worker_;
};

}  // namespace coconut::serve
