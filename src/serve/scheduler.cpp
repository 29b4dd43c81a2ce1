#include "serve/scheduler.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <random>
#include <set>

#include "model/kv_cache.h"

namespace coconut::serve {

GenerationJob::GenerationJob(GenerationRequest request) : request_(std::move(request)) {}

std::vector<GenerationEvent> GenerationJob::wait_events(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  arrived_.wait_for(lock, timeout, [&] { return woken_; });
  std::vector<GenerationEvent> events(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  woken_ = false;
  return events;
}

void GenerationJob::set_wake_on_tokens(bool wake) {
  std::lock_guard<std::mutex> lock(mutex_);
  wake_on_tokens_ = wake;
  if (wake && !events_.empty()) woken_ = true;  // tokens that came while it was off count now
}

void GenerationJob::push(GenerationEvent event) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wake = event.kind != GenerationEvent::Kind::kToken || wake_on_tokens_;
    events_.push_back(std::move(event));
    woken_ = woken_ || wake;
  }
  if (wake) arrived_.notify_all();
}

// A running request: where it is in prompt -> thoughts -> closing tokens -> decoding.
struct Scheduler::Slot {
  enum class Phase { kPrefilling, kThinking, kClosing, kDecoding };
  std::shared_ptr<GenerationJob> job;
  Phase phase = Phase::kDecoding;
  torch::Tensor last_hidden;  // [D] the newest position's state after the final norm
  int64_t prefilled = 0;  // prompt tokens in the cache so far
  int64_t thoughts_done = 0, closing_done = 0, tokens_emitted = 0;
  int64_t pending_token = -1;  // sampled this step, fed back in this step's pass
  std::mt19937_64 rng;
  std::vector<AdaptivePass> passes;  // routed passes not yet reported
  int64_t routed_passes = 0, layers_spent = 0;  // depth budget bookkeeping
  // A depth cascade: the level running, its answer's lowest token probability so far, its tokens
  // held back until the level is kept, the prompt's residual stream at its depth ([P, D], what a
  // deeper level continues from; built from `residual_chunks` as the prompt is read), and the
  // levels left behind, not yet reported.
  size_t level = 0;
  double confidence = 1.0;
  std::vector<int64_t> held;
  torch::Tensor prompt_residual;
  std::vector<torch::Tensor> residual_chunks;
  std::vector<CascadeLevelRun> levels_run;

  const DepthCascade& cascade() const { return job->request().cascade; }
  // The first layers this request runs now (0: every one; a layer-set level: every one but removed()).
  int64_t layers() const {
    return cascade().layer_sets() ? 0 : cascade().active() ? cascade().depths[level] : job->request().layers;
  }
  // The layers a layer-set cascade level leaves out (none otherwise).
  std::set<int64_t> removed() const {
    if (!cascade().layer_sets()) return {};
    return std::set<int64_t>(cascade().removed[level].begin(), cascade().removed[level].end());
  }
  // The layers the prompt's state already holds (a deeper prefix level continues from there; a
  // layer-set level starts over).
  int64_t layers_done() const { return level > 0 && !cascade().layer_sets() ? cascade().depths[level - 1] : 0; }
  // A cascade level with another after it: its answer waits for the decision.
  bool holds_tokens() const { return cascade().active() && level + 1 < cascade().levels(); }
};

// A lane's own thread: runs one task at a time for the worker, without gradients and on one
// intra-op thread; an exception comes back to the worker through wait().
class Scheduler::LaneThread {
 public:
  // Returns once the thread runs on one intra-op thread (at::set_num_threads also sets the count
  // that threads started later begin with: the Scheduler puts it back after making its lanes).
  LaneThread() : thread_([this] { loop(); }) {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return ready_; });
  }
  ~LaneThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  void start(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = std::move(task);
      done_ = false;
      error_ = nullptr;
    }
    wake_.notify_one();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop() {
    torch::NoGradGuard no_grad;
    at::set_num_threads(1);
    std::unique_lock<std::mutex> lock(mutex_);
    ready_ = true;
    finished_.notify_one();
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || task_ != nullptr; });
      if (stopping_) return;
      auto task = std::move(task_);
      task_ = nullptr;
      lock.unlock();
      std::exception_ptr error;
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      done_ = true;
      finished_.notify_one();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::function<void()> task_;
  bool ready_ = false, done_ = true, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

Scheduler::Scheduler(Llama model, SchedulerOptions options)
    : model_(std::move(model)), config_(model_->config()), options_(options),
      device_(model_->embed_tokens->weight.device()) {
  if (options_.max_batch < 1) throw std::invalid_argument("serve: max_batch must be at least 1");
  if (options_.max_queue < 0) throw std::invalid_argument("serve: max_queue must not be negative");
  context_ = options_.context > 0 ? std::min(options_.context, config_.max_position_embeddings)
                                  : config_.max_position_embeddings;
  if (options_.lanes < 1) throw std::invalid_argument("serve: lanes must be at least 1");
  model_->eval();
  lanes_ = std::min<int64_t>(options_.lanes, options_.max_batch);
  const auto cache_dtype = attention_dtype(model_->embed_tokens->weight.scalar_type(), device_);
  for (int64_t lane = 0; lane < lanes_; ++lane) {
    const int64_t rows = (options_.max_batch - lane + lanes_ - 1) / lanes_;  // slots lane, lane + lanes, ...
    caches_.push_back(std::make_unique<KVCache>(KVCache::per_row(config_, rows, context_, cache_dtype, device_)));
  }
  const int threads = at::get_num_threads();
  for (int64_t lane = 1; lane < lanes_; ++lane) lane_threads_.push_back(std::make_unique<LaneThread>());
  if (lanes_ > 1) at::set_num_threads(threads);  // what the worker starts with, as without lanes
  slots_.resize(static_cast<size_t>(options_.max_batch));
  worker_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
  shutdown(std::chrono::seconds(0));
  join();
  lane_threads_.clear();
}

namespace {

// The positions a request may need: its prompt, thoughts, closing markers and every token it may write.
int64_t positions_needed(const GenerationRequest& request) {
  return static_cast<int64_t>(request.prompt.size()) + request.latent_thoughts +
         static_cast<int64_t>(request.after_latents.size()) + request.max_new_tokens;
}

}  // namespace

std::shared_ptr<GenerationJob> Scheduler::submit(GenerationRequest request) {
  auto job = std::make_shared<GenerationJob>(std::move(request));
  const int64_t cost = positions_needed(job->request());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!accepting_) throw ShuttingDown("the server is shutting down");
    if (static_cast<int64_t>(queue_.size()) >= options_.max_queue)
      throw QueueFull("the queue is full (" + std::to_string(options_.max_queue) + " requests waiting)");
    const int64_t free_slots = options_.max_batch - running_ - static_cast<int64_t>(queue_.size());
    if (free_slots <= 0) {  // it would wait: for how long, and is there room for its tokens?
      const int64_t token_bound = options_.max_queued_tokens > 0 ? options_.max_queued_tokens : options_.max_batch * context_;
      if (queued_tokens_ + cost > token_bound)
        throw QueueFull("the queue is full (" + std::to_string(queued_tokens_) + " positions waiting, room for " +
                        std::to_string(token_bound) + ")");
      // The work ahead (what the running requests may still need, and the queue) at the recent
      // rate: an upper bound on when this request would start.
      const double rate = positions_per_second_;
      if (rate > 0) {
        const double wait = static_cast<double>(running_remaining_ + queued_tokens_) / rate;
        if (wait > options_.max_queue_wait_seconds) {
          const int retry = static_cast<int>(std::clamp(std::ceil(wait - options_.max_queue_wait_seconds), 1.0, 60.0));
          throw QueueFull("the work ahead would keep this request queued about " + std::to_string(static_cast<int>(wait)) +
                              " s, more than the server's queue wait of " +
                              std::to_string(static_cast<int>(options_.max_queue_wait_seconds)) + " s",
                          retry);
        }
      }
    }
    job->enqueued_at = std::chrono::steady_clock::now();
    queue_.push_back(job);
    queued_tokens_ += cost;
    ++accepted_;
  }
  work_.notify_one();
  return job;
}

void Scheduler::shutdown(std::chrono::steady_clock::duration grace) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_ || std::chrono::steady_clock::now() + grace < deadline_)
      deadline_ = std::chrono::steady_clock::now() + grace;
    accepting_ = false;
    stopping_ = true;
  }
  work_.notify_one();
}

void Scheduler::join() {
  if (worker_.joinable()) worker_.join();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats stats;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats.queued = static_cast<int64_t>(queue_.size());
  }
  stats.accepted = accepted_;
  stats.running = running_;
  stats.max_batch = options_.max_batch;
  stats.steps = steps_;
  stats.step_rows = step_rows_;
  stats.prompt_tokens = prompt_tokens_;
  stats.generated_tokens = generated_tokens_;
  stats.latent_thoughts = latent_thoughts_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats.queued_tokens = queued_tokens_;
  }
  stats.positions_per_second = positions_per_second_;
  return stats;
}

void Scheduler::run() {
  torch::NoGradGuard no_grad;  // thread-local: the worker's own
  narrow_threads_ = at::get_num_threads();
  const auto any_running = [&] {
    return std::any_of(slots_.begin(), slots_.end(), [](const auto& slot) { return slot != nullptr; });
  };
  while (true) {
    // Step boundary: cancelled requests leave, the queue is pruned, free slots take new requests.
    for (size_t slot = 0; slot < slots_.size(); ++slot)
      if (slots_[slot] && slots_[slot]->job->cancelled()) free_slot(static_cast<int64_t>(slot), FinishReason::kCancelled);
    std::vector<std::shared_ptr<GenerationJob>> admitted;
    bool past_deadline = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_.wait(lock, [&] { return stopping_ || !queue_.empty() || any_running(); });
      const auto now = std::chrono::steady_clock::now();
      past_deadline = stopping_ && now >= deadline_;
      for (auto it = queue_.begin(); it != queue_.end();) {
        const double waited = std::chrono::duration<double>(now - (*it)->enqueued_at).count();
        if ((*it)->cancelled() || past_deadline || waited > options_.max_queue_wait_seconds) {
          GenerationEvent event;
          event.kind = GenerationEvent::Kind::kFinished;
          event.reason = (*it)->cancelled() ? FinishReason::kCancelled : FinishReason::kRejected;
          event.message = past_deadline ? "the server stopped before this request started"
                                        : "waited " + std::to_string(waited) + " s in the queue";
          (*it)->push(std::move(event));
          queued_tokens_ -= positions_needed((*it)->request());
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      for (size_t slot = 0; slot < slots_.size() && !queue_.empty(); ++slot)
        if (!slots_[slot]) {
          admitted.push_back(queue_.front());
          queued_tokens_ -= positions_needed(queue_.front()->request());
          queue_.pop_front();
        }
      if (stopping_ && queue_.empty() && admitted.empty() && !any_running()) return;
    }
    size_t next = 0;
    for (size_t slot = 0; slot < slots_.size() && next < admitted.size(); ++slot)
      if (!slots_[slot]) admit(static_cast<int64_t>(slot), admitted[next++]);
    if (past_deadline) {
      for (size_t slot = 0; slot < slots_.size(); ++slot)
        if (slots_[slot]) free_slot(static_cast<int64_t>(slot), FinishReason::kFailed, "the server stopped before this request finished");
      continue;
    }
    // The rate positions are processed at (prompt chunks and step rows), for admission.
    const auto step_started = std::chrono::steady_clock::now();
    const int64_t done_before = prompt_tokens_ + step_rows_;
    try {
      step();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_started).count();
      const int64_t done = prompt_tokens_ + step_rows_ - done_before;
      if (done > 0 && seconds > 0) {
        const double rate = static_cast<double>(done) / seconds, previous = positions_per_second_;
        positions_per_second_ = previous > 0 ? 0.9 * previous + 0.1 * rate : rate;
      }
      int64_t remaining = 0;
      for (const auto& slot : slots_)
        if (slot) {
          const auto& request = slot->job->request();
          remaining += positions_needed(request) - slot->prefilled - slot->thoughts_done - slot->closing_done - slot->tokens_emitted;
        }
      running_remaining_ = std::max<int64_t>(0, remaining);
    } catch (const std::exception& error) {  // no request may take the server down: fail the batch
      for (size_t slot = 0; slot < slots_.size(); ++slot)
        if (slots_[slot]) free_slot(static_cast<int64_t>(slot), FinishReason::kFailed, error.what());
    }
  }
}

void Scheduler::free_slot(int64_t slot, FinishReason reason, const std::string& message) {
  auto& entry = slots_[static_cast<size_t>(slot)];
  GenerationEvent event;
  event.kind = GenerationEvent::Kind::kFinished;
  event.reason = reason;
  event.message = message;
  event.passes = std::move(entry->passes);
  event.cascade_levels = std::move(entry->levels_run);
  entry->job->push(std::move(event));
  entry.reset();
  --running_;
}

void Scheduler::admit(int64_t slot, std::shared_ptr<GenerationJob> job) {
  const auto& request = job->request();
  const auto length = static_cast<int64_t>(request.prompt.size());
  const int64_t needed = positions_needed(request);
  if (length < 1 || needed > context_) {
    GenerationEvent event;
    event.kind = GenerationEvent::Kind::kFinished;
    event.reason = FinishReason::kFailed;
    event.message = "the request needs " + std::to_string(needed) + " positions, the context holds " + std::to_string(context_);
    job->push(std::move(event));
    return;
  }
  auto entry = std::make_unique<Slot>();
  entry->job = job;
  entry->rng.seed(request.sampling.seed);
  entry->phase = Slot::Phase::kPrefilling;
  caches_[static_cast<size_t>(lane_of(slot))]->reset_row(row_of(slot));
  slots_[static_cast<size_t>(slot)] = std::move(entry);
  ++running_;
  job->push(GenerationEvent{});  // kStarted
}

void Scheduler::use_threads_for(int64_t positions) {
  // Lanes side by side: one thread each. Otherwise a wide pass on every thread asked for, a
  // narrow one on the usual count (SchedulerOptions).
  if (concurrent_lanes_) {
    if (at::get_num_threads() != 1) at::set_num_threads(1);
    return;
  }
  if (options_.wide_step_threads <= 0) return;
  const int threads = positions >= options_.wide_step_rows ? options_.wide_step_threads : narrow_threads_;
  if (threads != at::get_num_threads()) at::set_num_threads(threads);
}

void Scheduler::prefill_chunk(int64_t slot) {
  auto& entry = *slots_[static_cast<size_t>(slot)];
  const auto& request = entry.job->request();
  const auto length = static_cast<int64_t>(request.prompt.size());
  // A tail shorter than a quarter of a chunk joins the chunk before it (a 65-token prompt is one
  // pass, not 64 + 1: a pass costs its per-layer overhead however few positions it reads).
  const int64_t left = length - entry.prefilled;
  const int64_t chunk = options_.prefill_chunk > 0 && left - options_.prefill_chunk >= std::max<int64_t>(1, options_.prefill_chunk / 4)
                            ? options_.prefill_chunk
                            : left;
  KVCache& cache = *caches_[static_cast<size_t>(lane_of(slot))];
  cache.select_rows(row_of(slot), 1);
  use_threads_for(chunk);  // a chunk of a prompt is as wide as its positions
  ForwardOptions every_layer;
  every_layer.depth = DepthPolicy::every_layer();  // the prompt runs every layer, as in generate()
  if (entry.layers() > 0) every_layer.end_layer = entry.layers();  // or the request's prefix
  every_layer.skip_layers = entry.removed();                        // or its level's layer set
  // A deeper cascade level reads the prompt's state where the last one stopped; the K/V of the
  // layers below are still in the row's columns [0, length).
  every_layer.first_layer = entry.layers_done();
  every_layer.return_residuals = entry.holds_tokens() && !entry.cascade().layer_sets();
  const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
  torch::Tensor inputs;  // [1, C, D]
  if (every_layer.first_layer > 0) {
    inputs = entry.prompt_residual.narrow(0, entry.prefilled, chunk).unsqueeze(0);
  } else {
    auto ids = torch::tensor(std::vector<int64_t>(request.prompt.begin() + entry.prefilled,
                                                  request.prompt.begin() + entry.prefilled + chunk), int64)
                   .to(device_).view({1, chunk});  // [1, C]
    inputs = model_->embed(ids);
  }
  auto positions = torch::arange(entry.prefilled, entry.prefilled + chunk, int64).to(device_).view({1, chunk});  // [1, C]
  // Only the chunk's last column is read (the prompt's last, once every chunk ran): the last layer
  // runs there alone, as in generate(), where it does (cuts_last_layer).
  if (cuts_last_layer(device_)) every_layer.first_output_column = chunk - 1;
  const auto pass = model_->forward(inputs, positions, &cache, every_layer);
  const auto& hidden = pass.hidden;  // [1, 1, D] on the CPU, else [1, C, D]
  if (every_layer.return_residuals) entry.residual_chunks.push_back(pass.residuals.back()[0]);  // [C, D]
  entry.prefilled += chunk;
  prompt_tokens_ += chunk;
  if (entry.prefilled < length) return;
  if (!entry.residual_chunks.empty()) {
    entry.prompt_residual = torch::cat(entry.residual_chunks, 0);  // [P, D]
    entry.residual_chunks.clear();
  }
  entry.last_hidden = hidden[0][hidden.size(1) - 1];  // [D]
  entry.phase = request.latent_thoughts > 0        ? Slot::Phase::kThinking
                : !request.after_latents.empty() ? Slot::Phase::kClosing
                                                 : Slot::Phase::kDecoding;
}

void Scheduler::deepen(int64_t slot) {
  auto& entry = *slots_[static_cast<size_t>(slot)];
  entry.levels_run.push_back(CascadeLevelRun{entry.cascade().level_layers(entry.level, config_.num_hidden_layers),
                                             entry.tokens_emitted, entry.confidence});
  ++entry.level;
  entry.confidence = 1.0;
  entry.held.clear();
  entry.prefilled = entry.thoughts_done = entry.closing_done = entry.tokens_emitted = 0;
  entry.pending_token = -1;
  entry.rng.seed(entry.job->request().sampling.seed);  // the level samples as a fresh run at its depth would
  entry.phase = Slot::Phase::kPrefilling;
  // The row's length goes back to 0 but its columns stay: the prompt's K/V below the level's
  // first layer are read again, every other column is written anew before it is read (a
  // layer-set level writes every layer it runs; the ones it leaves out are never read).
  caches_[static_cast<size_t>(lane_of(slot))]->reset_row(row_of(slot));
}

void Scheduler::step() {
  std::vector<int64_t> busy;  // lanes holding a request
  for (int64_t lane = 0; lane < lanes_; ++lane)
    for (int64_t slot = lane; slot < static_cast<int64_t>(slots_.size()); slot += lanes_)
      if (slots_[static_cast<size_t>(slot)]) {
        busy.push_back(lane);
        break;
      }
  concurrent_lanes_ = busy.size() > 1;
  if (!concurrent_lanes_) {
    for (int64_t lane : busy) lane_step(lane);
    return;
  }
  // Lanes touch only their own slots, cache and rows; the counters are atomic and the jobs locked.
  for (size_t i = 1; i < busy.size(); ++i)
    lane_threads_[static_cast<size_t>(busy[i] - 1)]->start([this, lane = busy[i]] { lane_step(lane); });
  std::exception_ptr error;
  try {
    lane_step(busy[0]);
  } catch (...) {
    error = std::current_exception();
  }
  for (size_t i = 1; i < busy.size(); ++i) {
    try {
      lane_threads_[static_cast<size_t>(busy[i] - 1)]->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void Scheduler::lane_step(int64_t lane) {
  using Phase = Slot::Phase;
  KVCache& cache = *caches_[static_cast<size_t>(lane)];
  const auto slot_count = static_cast<int64_t>(slots_.size());  // this lane's: lane, lane + lanes_, ...
  // 0. Prompts still being read advance by one chunk each (alone: a chunk is many positions).
  for (int64_t slot = lane; slot < slot_count; slot += lanes_) {
    if (!slots_[static_cast<size_t>(slot)] || slots_[static_cast<size_t>(slot)]->phase != Phase::kPrefilling) continue;
    try {
      prefill_chunk(slot);
    } catch (const std::exception& error) {
      free_slot(slot, FinishReason::kFailed, error.what());
    }
  }
  // 1. Decoding slots sample their next token from their newest state (one head call for all).
  std::vector<int64_t> decoding;
  for (int64_t slot = lane; slot < slot_count; slot += lanes_)
    if (slots_[static_cast<size_t>(slot)] && slots_[static_cast<size_t>(slot)]->phase == Phase::kDecoding) decoding.push_back(slot);
  if (!decoding.empty()) {
    std::vector<torch::Tensor> states;
    for (int64_t slot : decoding) states.push_back(slots_[static_cast<size_t>(slot)]->last_hidden);
    const auto logits = model_->logits(torch::stack(states));  // [n, V]
    // Greedy rows take one argmax for all (a row at a time costs a few ops each, ~10% of a step
    // at 16 rows); sampled rows draw from their own generator.
    const bool any_greedy = std::any_of(decoding.begin(), decoding.end(), [&](int64_t slot) {
      return slots_[static_cast<size_t>(slot)]->job->request().sampling.temperature <= 0.0;
    });
    const auto greedy = any_greedy ? logits.argmax(-1).to(torch::kCPU).contiguous() : torch::Tensor();  // [n]
    const int64_t* greedy_tokens = any_greedy ? greedy.data_ptr<int64_t>() : nullptr;
    const auto count = static_cast<int64_t>(decoding.size());
    std::vector<int64_t> next(decoding.size());
    for (size_t i = 0; i < decoding.size(); ++i) {
      auto& entry = *slots_[static_cast<size_t>(decoding[i])];
      const auto& request = entry.job->request();
      next[i] = request.sampling.temperature <= 0.0
                    ? greedy_tokens[i]
                    : sample_next_tokens(logits.narrow(0, static_cast<int64_t>(i), 1), request.sampling, entry.rng)[0];
    }
    // A cascade level's confidence: each token's probability under its logits, as generate()'s
    // record_probabilities (float64 softmax, temperature 1).
    const bool any_held = std::any_of(decoding.begin(), decoding.end(), [&](int64_t slot) { return slots_[static_cast<size_t>(slot)]->holds_tokens(); });
    const auto chosen = any_held ? torch::softmax(logits.to(torch::kFloat64), -1)
                                       .gather(1, torch::tensor(next, torch::kInt64).to(logits.device()).view({count, 1}))
                                       .view({count})
                                       .to(torch::kCPU)
                                       .contiguous()
                                 : torch::Tensor();  // [n]
    const auto push_token = [&logits](Slot& entry, int64_t token, int64_t row = -1) {
      GenerationEvent event;
      event.kind = GenerationEvent::Kind::kToken;
      event.token = token;
      const int64_t top = entry.job->request().top_logprobs;
      if (top >= 0 && row >= 0) {  // the row's log-softmax, in float64 as the echo's scores
        const auto log_probs = torch::log_softmax(logits[row].to(torch::kFloat64), -1).to(torch::kCPU);  // [V]
        event.logprob = log_probs[token].item<double>();
        if (top > 0) {
          const auto best = log_probs.topk(top);
          for (int64_t k = 0; k < top; ++k)
            event.top_logprobs.emplace_back(std::get<1>(best)[k].item<int64_t>(), std::get<0>(best)[k].item<double>());
        }
      }
      event.passes = std::move(entry.passes);
      entry.passes.clear();
      event.cascade_levels = std::move(entry.levels_run);
      entry.levels_run.clear();
      entry.job->push(std::move(event));
    };
    for (size_t i = 0; i < decoding.size(); ++i) {
      auto& entry = *slots_[static_cast<size_t>(decoding[i])];
      const auto& request = entry.job->request();
      const int64_t token = next[i];
      ++entry.tokens_emitted;
      ++generated_tokens_;
      const bool stop = std::find(request.stop_ids.begin(), request.stop_ids.end(), token) != request.stop_ids.end();
      const bool ends = stop || entry.tokens_emitted >= request.max_new_tokens;
      if (entry.holds_tokens()) {
        entry.held.push_back(token);
        entry.confidence = std::min(entry.confidence, chosen.data_ptr<double>()[i]);
        if (ends && entry.confidence <= request.cascade.confidence) {
          deepen(decoding[i]);
          continue;
        }
        if (ends)  // kept: its answer goes out now
          for (int64_t held : entry.held) push_token(entry, held);
      } else {
        push_token(entry, token, static_cast<int64_t>(i));
      }
      if (ends) {
        free_slot(decoding[i], stop ? FinishReason::kStopToken : FinishReason::kLength);
        continue;
      }
      entry.pending_token = token;
    }
  }

  // 2. One batched one-position pass over the lane's rows [0, rows): every slot past its prompt
  // takes part.
  int64_t rows = 0;
  for (int64_t slot = lane; slot < slot_count; slot += lanes_)
    if (slots_[static_cast<size_t>(slot)] && slots_[static_cast<size_t>(slot)]->phase != Phase::kPrefilling)
      rows = row_of(slot) + 1;
  if (rows == 0) return;
  const int64_t width = config_.hidden_size, depth = config_.num_hidden_layers;
  std::vector<int64_t> token_ids(static_cast<size_t>(rows), 0), takes_part(static_cast<size_t>(rows), 0),
      positions(static_cast<size_t>(rows), 0), max_layers(static_cast<size_t>(rows), depth), prefix(static_cast<size_t>(rows), depth);
  std::vector<uint8_t> removed(static_cast<size_t>(rows * depth), 0);  // [B, L]: a row's layer-set level leaves the layer out
  bool prefixes = false;  // a row runs only its request's first layers, or leaves a layer set out
  std::vector<double> thresholds(static_cast<size_t>(rows), 0.0);
  std::vector<bool> is_thought(static_cast<size_t>(rows), false), routed(static_cast<size_t>(rows), false);
  for (int64_t row = 0; row < rows; ++row) {
    const auto& slot = slots_[static_cast<size_t>(slot_of(lane, row))];
    if (!slot || slot->phase == Phase::kPrefilling) continue;
    const auto& request = slot->job->request();
    takes_part[row] = 1;
    positions[row] = cache.row_length(row);
    if (slot->layers() > 0) {
      prefix[row] = slot->layers();
      prefixes = true;
    }
    for (int64_t layer : slot->removed()) {
      removed[static_cast<size_t>(row * depth + layer)] = 1;
      prefixes = true;
    }
    switch (slot->phase) {
      case Phase::kThinking:
        is_thought[row] = true;
        routed[row] = true;
        break;
      case Phase::kClosing:
        token_ids[row] = request.after_latents[static_cast<size_t>(slot->closing_done)];
        break;  // every layer (threshold 0)
      case Phase::kDecoding:
        token_ids[row] = slot->pending_token;
        routed[row] = true;
        break;
      case Phase::kPrefilling:
        break;
    }
    if (routed[row]) {
      thresholds[row] = request.router_threshold;
      if (request.depth_budget > 0) {
        const auto allowed = static_cast<int64_t>(std::floor(request.depth_budget * static_cast<double>(slot->routed_passes + 1) + 1e-9));
        max_layers[row] = std::clamp(allowed - slot->layers_spent, config_.depth_router_first_layer, depth);
      }
    }
  }
  const auto int64 = torch::TensorOptions().dtype(torch::kInt64).device(device_);
  // Inputs [B, D]: a thought feeds back the newest state, every other row embeds its token.
  auto inputs = model_->embed(torch::tensor(token_ids, torch::kInt64).to(device_));  // [B, D]
  for (int64_t row = 0; row < rows; ++row)
    if (is_thought[row]) inputs[row].copy_(model_->thought_input(slots_[static_cast<size_t>(slot_of(lane, row))]->last_hidden));
  ForwardOptions options;
  options.attention_mask = torch::tensor(takes_part, torch::kInt64).to(device_).view({rows, 1});  // [B, 1]
  if (config_.depth_router) {
    options.router_thresholds = torch::tensor(thresholds, torch::kFloat64);
    options.router_max_layers = torch::tensor(max_layers, torch::kInt64);
  }
  if (prefixes) {  // [1, L] < [B, 1] -> [B, L]: row b keeps its first prefix[b] layers, less its removed ones
    const auto left_out = torch::from_blob(removed.data(), {rows, depth}, torch::kUInt8).to(device_).to(torch::kBool);  // [B, L]
    options.layer_keep = (torch::arange(depth, int64).view({1, depth}) < torch::tensor(prefix, torch::kInt64).to(device_).view({rows, 1})) &
                         left_out.logical_not();
  }
  cache.select_rows(0, rows);
  use_threads_for(rows);
  // [B, D] -> [B, 1, D]: one new position per row, at the row's own next column.
  const auto result = model_->forward(inputs.view({rows, 1, width}), torch::tensor(positions, int64).view({rows, 1}),
                                      &cache, options);
  ++steps_;
  const auto hidden = result.hidden.select(1, 0);  // [B, 1, D] -> [B, D]
  const auto skipped = result.layers_skipped.defined() ? result.layers_skipped.cpu() : torch::Tensor();  // [B, L] bool
  for (int64_t row = 0; row < rows; ++row) {
    auto& slot = slots_[static_cast<size_t>(slot_of(lane, row))];
    if (!slot || takes_part[row] == 0) continue;
    ++step_rows_;
    slot->last_hidden = hidden[row];
    if (routed[row] && skipped.defined()) {
      AdaptivePass pass;
      pass.context = positions[row] + 1;
      const auto skipped_rows = skipped.accessor<bool, 2>();
      for (int64_t layer = 0; layer < depth; ++layer)
        if (skipped_rows[row][layer]) pass.skipped_layers.push_back(layer);
      pass.layers_run = depth - static_cast<int64_t>(pass.skipped_layers.size());
      ++slot->routed_passes;
      slot->layers_spent += pass.layers_run;
      slot->passes.push_back(std::move(pass));
    }
    const auto& request = slot->job->request();
    if (slot->phase == Phase::kThinking && ++slot->thoughts_done == request.latent_thoughts) {
      latent_thoughts_ += request.latent_thoughts;
      if (request.latent_bottleneck) cache.hide_row_prefix(row, static_cast<int64_t>(request.prompt.size()) - 1);
      slot->phase = request.after_latents.empty() ? Phase::kDecoding : Phase::kClosing;
    } else if (slot->phase == Phase::kClosing &&
               ++slot->closing_done == static_cast<int64_t>(request.after_latents.size())) {
      slot->phase = Phase::kDecoding;
    }
  }
}

}  // namespace coconut::serve
