#include "serve/server.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <httplib.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "eval/cost.h"
#include "model/threads.h"
#include "reasoning/layout.h"
#include "reasoning/thought_scoring.h"
#include "serve/connection_gate.h"
#include "serve/metrics.h"
#include "serve/text_stream.h"

namespace coconut::serve {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kCompletionsPath = "/v1/completions";
constexpr const char* kChatPath = "/v1/chat/completions";
constexpr int kRetryAfterSeconds = 1;
constexpr auto kDisconnectCheck = std::chrono::milliseconds(100);

// Generated text may hold bytes that are not UTF-8 (a byte-level token cut a character): they are
// replaced rather than allowed to make dump() throw.
std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string error_type(int status) {
  if (status == 404) return "not_found_error";
  if (status == 503) return "server_overloaded";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

json error_body(int status, const std::string& message, const std::string& param) {
  return {{"error",
           {{"message", message}, {"type", error_type(status)}, {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", status}}}};
}

void reply_error(httplib::Response& response, int status, const std::string& message, const std::string& param = "") {
  response.status = status;
  if (status == 503) response.set_header("Retry-After", std::to_string(kRetryAfterSeconds));
  response.set_content(dump(error_body(status, message, param)), "application/json");
}

std::string finish_reason_name(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : "stop";
}

}  // namespace

struct Server::State {
  ServedModel served;
  ServeOptions options;
  RequestLimits limits;
  std::unique_ptr<Scheduler> scheduler;
  Metrics metrics;
  std::unique_ptr<GatedHttpServer> http;
  std::atomic<int64_t> next_id{1};
  std::atomic<bool> stopping{false};
  std::atomic<int> listening_socket{-1};

  // /v1/completions, or /v1/chat/completions when `chat`.
  void handle_completion(const httplib::Request& http_request, httplib::Response& response, bool chat);
  // A completion with "echo": every prompt scored at once, outside the scheduler (one at a time).
  json score_prompts(const CompletionRequest& request);
  std::mutex scoring;
};

namespace {

// OpenAI's legacy "logprobs" object, a token at a time: the token's text, its log-probability, the
// best tokens at its position (null both for a prompt's first token, which nothing predicts) and
// its offset in the text.
class LegacyLogprobs {
 public:
  void add(const Tokenizer& tokenizer, int64_t token, std::optional<double> logprob,
           const std::vector<std::pair<int64_t, double>>& best) {
    const std::string piece = tokenizer.decode({token});
    tokens_.push_back(piece);
    text_offset_.push_back(offset_);
    offset_ += static_cast<int64_t>(piece.size());
    token_logprobs_.push_back(logprob ? json(*logprob) : json(nullptr));
    if (!logprob) {
      top_logprobs_.push_back(nullptr);
      return;
    }
    json top = json::object();
    for (const auto& [id, value] : best) top[tokenizer.decode({id})] = value;
    top_logprobs_.push_back(top);
  }
  json value() const {
    return {{"tokens", tokens_}, {"token_logprobs", token_logprobs_}, {"top_logprobs", top_logprobs_}, {"text_offset", text_offset_}};
  }

 private:
  json tokens_ = json::array(), token_logprobs_ = json::array(), top_logprobs_ = json::array(), text_offset_ = json::array();
  int64_t offset_ = 0;
};

// One prompt's echo: its text and, with "logprobs", the legacy object over its tokens, the one
// greedy token after it where max_tokens is 1. A Coconut model's thoughts run where the prompt
// holds <|start-latent|><|end-latent|> (reasoning/thought_scoring.h).
struct ScoredPrompt {
  json choice;
  int64_t prompt_tokens = 0, completion_tokens = 0, latent_thoughts = 0;
};

ScoredPrompt score_prompt(const ServedModel& served, const CompletionRequest& request, const CompletionRequest::Prompt& prompt,
                          const ThoughtSlot& slot, int64_t context) {
  const std::vector<int64_t> ids = prompt_tokens(served, prompt);
  if (ids.empty()) throw RequestError(400, "prompt", "'prompt' is empty (and the model has no BOS token to start from)");
  const int64_t thoughts = thought_slot_column(ids, slot) >= 0 ? slot.thoughts : 0;
  if (static_cast<int64_t>(ids.size()) + thoughts + request.max_tokens > context)
    throw RequestError(400, "prompt", "the prompt's " + std::to_string(ids.size()) + " tokens, " + std::to_string(thoughts) +
                                          " thoughts and max_tokens " + std::to_string(request.max_tokens) +
                                          " are longer than the context of " + std::to_string(context) + " tokens");
  torch::NoGradGuard no_grad;
  Llama model = served.model;
  const auto log_probs = torch::log_softmax(model->logits(hidden_with_thoughts(model, ids, slot)), -1).to(torch::kCPU);  // [T, V]
  std::vector<int64_t> tokens = ids;
  if (request.max_tokens == 1) tokens.push_back(log_probs[static_cast<int64_t>(ids.size()) - 1].argmax().item<int64_t>());
  std::string text = prompt.text ? *prompt.text : served.tokenizer->decode(ids);  // the echo: the prompt as sent
  if (request.max_tokens == 1) text += served.tokenizer->decode_continuation(ids, {tokens.back()});
  json logprobs = nullptr;
  if (request.logprobs) {
    LegacyLogprobs legacy;
    legacy.add(*served.tokenizer, tokens[0], std::nullopt, {});
    for (size_t t = 1; t < tokens.size(); ++t) {
      const auto row = log_probs[static_cast<int64_t>(t) - 1];  // [V]: position t - 1 predicts token t
      std::vector<std::pair<int64_t, double>> best;
      if (*request.logprobs > 0) {
        const auto [values, indices] = row.topk(*request.logprobs);
        for (int64_t k = 0; k < values.size(0); ++k) best.emplace_back(indices[k].item<int64_t>(), values[k].item<double>());
      }
      legacy.add(*served.tokenizer, tokens[t], row[tokens[t]].item<double>(), best);
    }
    logprobs = legacy.value();
  }
  ScoredPrompt scored;
  scored.prompt_tokens = static_cast<int64_t>(ids.size());
  scored.completion_tokens = request.max_tokens;
  scored.latent_thoughts = thoughts;
  scored.choice = {{"text", text}, {"logprobs", logprobs}, {"finish_reason", "length"}};
  return scored;
}

}  // namespace

json Server::State::score_prompts(const CompletionRequest& request) {
  const std::lock_guard<std::mutex> lock(scoring);
  const ThoughtSlot slot{served.special.start_latent, served.special.end_latent,
                         request_thoughts(served, request, /*pauses_think=*/false), served.latent_bottleneck};
  json choices = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0, latent_thoughts = 0;
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    auto scored = score_prompt(served, request, request.prompts[i], slot, scheduler->context());
    scored.choice["index"] = i;
    choices.push_back(std::move(scored.choice));
    prompt_tokens += scored.prompt_tokens;
    completion_tokens += scored.completion_tokens;
    latent_thoughts += scored.latent_thoughts;
  }
  return {{"id", "cmpl-" + std::to_string(next_id++)}, {"object", "text_completion"}, {"created", static_cast<int64_t>(std::time(nullptr))},
          {"model", served.id}, {"choices", choices},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens}, {"total_tokens", prompt_tokens + completion_tokens},
                     {"latent_thoughts", latent_thoughts}}}};
}

// One admitted completion, from its first event to its last byte: reads the scheduler's events,
// turns tokens into text, streams or collects it, and accounts for it.
struct CompletionSession {
  Server::State* state = nullptr;
  std::shared_ptr<GenerationJob> job;
  CompletionRequest request;
  std::string id;
  int64_t created = 0;
  int64_t prompt_tokens = 0;    // the prompt and the tokens after the thoughts (one prefill each)
  int64_t latent_thoughts = 0;
  int64_t layers = 0;           // a prefix of the model's layers (GenerationRequest::layers; 0: all)
  int64_t prompt_only = 0;      // the prompt alone (without the tokens after the thoughts)
  DepthCascade cascade;         // the depth cascade it runs (inactive: none)
  std::vector<CascadeLevelRun> cascade_levels;  // the cascade's levels run and left
  Clock::time_point arrived;
  std::unique_ptr<TextStream> text;
  std::string full_text;
  std::vector<AdaptivePass> passes;
  std::deque<GenerationEvent> pending;
  bool first_token_seen = false;
  bool role_sent = false;  // a chat stream's first delta carries the role
  std::string finish_reason;
  std::string failure;
  LegacyLogprobs logprobs;  // "logprobs": the generated tokens'

  // A completion's choice holds "text"; a chat completion's a "message", or in a stream a "delta"
  // (the first one names the role, so making one is not const).
  json choice(const std::string& piece, const json& reason) {
    if (!request.chat) return {{"text", piece}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason}};
    if (!request.stream)
      return {{"index", 0}, {"message", {{"role", "assistant"}, {"content", piece}}}, {"logprobs", nullptr}, {"finish_reason", reason}};
    json delta = json::object();
    if (!role_sent) delta["role"] = "assistant";
    if (!piece.empty() || !role_sent) delta["content"] = piece;
    role_sent = true;
    return {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", reason}};
  }
  json envelope(const json& choice_value) const {
    const char* object = !request.chat ? "text_completion" : request.stream ? "chat.completion.chunk" : "chat.completion";
    return {{"id", id}, {"object", object}, {"created", created}, {"model", state->served.id}, {"choices", json::array({choice_value})}};
  }
  const char* path() const { return request.chat ? kChatPath : kCompletionsPath; }
  json usage() const {
    const int64_t completion_tokens = text->token_count();
    const LlamaConfig& config = state->served.model->config();
    const int64_t kept_layers =
        cascade.active() ? cascade.level_layers(std::min(cascade_levels.size(), cascade.levels() - 1), config.num_hidden_layers) : 0;
    const RequestCost cost =
        cascade.active()
            ? cascade_request_cost(config, cascade, prompt_tokens, prompt_only, latent_thoughts, cascade_levels, completion_tokens)
            : request_cost(config, prompt_tokens, completion_tokens, latent_thoughts, passes, layers);
    json body = {{"prompt_tokens", prompt_tokens},
                 {"completion_tokens", completion_tokens},
                 {"total_tokens", prompt_tokens + completion_tokens},
                 {"latent_thoughts", latent_thoughts},
                 {"layers_per_position", cost.layers_per_position},
                 {"flops", cost.flops}};
    if (cascade.active()) {  // each level run: the ones left, then the kept one
      json levels = json::array();
      for (const auto& level : cascade_levels)
        levels.push_back({{"layers", level.layers}, {"completion_tokens", level.tokens}, {"confidence", level.confidence}, {"kept", false}});
      levels.push_back({{"layers", kept_layers}, {"completion_tokens", completion_tokens}, {"kept", true}});
      body["depth_cascade"] = levels;
    }
    return body;
  }
  // Server-sent events are gathered and written together: every event that arrived while this
  // thread waited for the CPU goes out in one chunk (one system call) instead of one per token.
  static void add_event(std::string& outgoing, const std::string& data) { outgoing += "data: " + data + "\n\n"; }
  static bool flush(httplib::DataSink& sink, std::string& outgoing) {
    if (outgoing.empty()) return true;
    const bool written = sink.write(outgoing.data(), outgoing.size());
    outgoing.clear();
    return written;
  }
  bool client_left() {
    job->cancel();
    state->metrics.count_request(path(), 499);
    return false;
  }

  // How long to wait for events. A whole answer is wanted at its end. A stream that wrote less
  // than its interval ago, while other requests run, waits out the interval and then writes what
  // came meanwhile; otherwise (its first token, or after a pause) a token is written when it comes.
  std::chrono::milliseconds next_wait(Clock::time_point last_write) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(
        last_write + std::chrono::milliseconds(state->options.stream_interval_ms) - Clock::now());
    const bool paced = !request.stream || (first_token_seen && left.count() > 0 && state->scheduler->running() > 1);
    job->set_wake_on_tokens(!paced);
    return request.stream && paced ? std::min(left, kDisconnectCheck) : kDisconnectCheck;
  }

  // Returns false when the client is gone (the job is cancelled: its slot frees at the next step).
  bool run(httplib::DataSink& sink) {
    auto last_check = Clock::now(), last_write = Clock::now();
    bool done = false;
    std::string outgoing;
    while (!done) {
      if (pending.empty())
        for (auto& event : job->wait_events(next_wait(last_write))) pending.push_back(std::move(event));
      if (pending.empty() || Clock::now() - last_check > kDisconnectCheck) {
        last_check = Clock::now();
        if (!sink.is_writable()) return client_left();
      }
      while (!pending.empty() && !done) {
        GenerationEvent event = std::move(pending.front());
        pending.pop_front();
        passes.insert(passes.end(), event.passes.begin(), event.passes.end());
        cascade_levels.insert(cascade_levels.end(), event.cascade_levels.begin(), event.cascade_levels.end());
        if (event.kind == GenerationEvent::Kind::kToken) {
          if (!first_token_seen) {
            first_token_seen = true;
            state->metrics.observe_time_to_first_token(seconds_since(arrived));
          }
          state->metrics.count_completion_tokens(1);
          if (request.logprobs) logprobs.add(*state->served.tokenizer, event.token, event.logprob, event.top_logprobs);
          const std::string piece = text->add(event.token);
          full_text += piece;
          if (request.stream && !piece.empty()) add_event(outgoing, dump(envelope(choice(piece, nullptr))));
          if (text->stopped()) {  // a stop string: the rest is not wanted
            job->cancel();
            finish_reason = "stop";
            done = true;
          }
        } else if (event.kind == GenerationEvent::Kind::kFinished) {
          if (event.reason == FinishReason::kLength || event.reason == FinishReason::kStopToken)
            finish_reason = finish_reason_name(event.reason);
          else
            failure = event.message.empty() ? "the request was cut short" : event.message;
          done = true;
        }
      }
      if (!done && !outgoing.empty()) {
        if (!flush(sink, outgoing)) return client_left();
        last_write = Clock::now();
      }
    }
    const std::string tail = text->finish();
    full_text += tail;
    bool written = true;
    if (request.stream) {
      if (!tail.empty()) add_event(outgoing, dump(envelope(choice(tail, nullptr))));
      if (!failure.empty()) add_event(outgoing, dump(error_body(500, failure, "")));
      auto last = envelope(choice("", failure.empty() ? json(finish_reason) : json("error")));
      last["usage"] = usage();
      add_event(outgoing, dump(last));
      add_event(outgoing, "[DONE]");
      written = flush(sink, outgoing);
    } else {
      json body = failure.empty() ? envelope(choice(full_text, finish_reason)) : error_body(500, failure, "");
      if (failure.empty() && request.logprobs) body["choices"][0]["logprobs"] = logprobs.value();
      body["usage"] = usage();
      const std::string text_body = dump(body);
      written = sink.write(text_body.data(), text_body.size());
    }
    if (!written) return client_left();
    // Counted before the last chunk, so a client that has its whole answer finds it counted.
    state->metrics.count_request(path(), failure.empty() ? 200 : 500);
    state->metrics.observe_request_seconds(seconds_since(arrived));
    sink.done();
    return true;
  }
};

void Server::State::handle_completion(const httplib::Request& http_request, httplib::Response& response, bool chat) {
  const auto arrived = Clock::now();
  const char* const path = chat ? kChatPath : kCompletionsPath;
  auto session = std::make_shared<CompletionSession>();
  GenerationRequest generation;
  try {
    session->request = chat ? parse_chat_request(http_request.body, limits) : parse_completion_request(http_request.body, limits);
    if (session->request.echo) {  // scoring: answered here, at once (streamed: as one event, then [DONE])
      const std::string scored = dump(score_prompts(session->request));
      if (session->request.stream)
        response.set_content("data: " + scored + "\n\ndata: [DONE]\n\n", "text/event-stream");
      else
        response.set_content(scored, "application/json");
      metrics.count_request(path, 200);
      return;
    }
    generation = prepare_generation(served, session->request, scheduler->context());
  } catch (const RequestError& error) {
    reply_error(response, error.status, error.what(), error.param);
    metrics.count_request(path, error.status);
    return;
  }
  try {
    session->job = scheduler->submit(generation);
  } catch (const QueueFull& error) {
    reply_error(response, 503, error.what());
    response.headers.erase("Retry-After");
    response.set_header("Retry-After", std::to_string(error.retry_after_seconds));
    metrics.count_request(path, 503);
    return;
  } catch (const ShuttingDown& error) {
    reply_error(response, 503, error.what());
    metrics.count_request(path, 503);
    return;
  }
  // Wait until it holds a slot: a request refused in the queue still gets its status code.
  while (session->pending.empty())
    for (auto& event : session->job->wait_events(std::chrono::milliseconds(200))) session->pending.push_back(std::move(event));
  const GenerationEvent& first = session->pending.front();
  if (first.kind == GenerationEvent::Kind::kFinished) {
    const int status = first.reason == FinishReason::kRejected ? 503 : 500;
    reply_error(response, status, first.message);
    metrics.count_request(path, status);
    return;
  }
  session->state = this;
  session->id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
  session->created = static_cast<int64_t>(std::time(nullptr));
  session->prompt_tokens = static_cast<int64_t>(generation.prompt.size() + generation.after_latents.size());
  session->latent_thoughts = generation.latent_thoughts;
  session->layers = generation.layers;
  session->prompt_only = static_cast<int64_t>(generation.prompt.size());
  session->cascade = generation.cascade;
  session->arrived = arrived;
  std::optional<int64_t> preceding;  // the prompt's last token, when the answer continues it
  if (!chat && generation.latent_thoughts == 0 && generation.after_latents.empty() && !generation.prompt.empty())
    preceding = generation.prompt.back();
  session->text = std::make_unique<TextStream>(*served.tokenizer, session->request.stop, preceding);
  if (!session->request.stream) {
    // A whole answer is collected here and sent with its final status: a chunked response would
    // commit "200" with its first byte, so a request that fails after its first token (cut short
    // by a shutdown's grace) would come back as 200 with an error body. The price: a client that
    // leaves before its answer is done keeps its slot until the answer ends (max_tokens bounds it).
    std::string body;
    httplib::DataSink collected;
    collected.write = [&body](const char* data, size_t size) {
      body.append(data, size);
      return true;
    };
    collected.is_writable = [] { return true; };
    collected.done = [] {};
    session->run(collected);
    response.status = session->failure.empty() ? 200 : 500;
    response.set_content(body, "application/json");
    return;
  }
  response.set_chunked_content_provider(
      session->request.stream ? "text/event-stream" : "application/json",
      [session](size_t, httplib::DataSink& sink) { return session->run(sink); },
      [session](bool success) {
        if (!success) session->job->cancel();
      });
}

int default_lanes(const Llama& model, int threads, int64_t cache_bytes) {
  const auto& weight = model->embed_tokens->weight;
  if (threads <= 1 || !weight.device().is_cpu()) return 1;
  return weight_bytes_per_decoded_token(model->config(), weight.scalar_type()) <= cache_bytes ? threads : 1;
}

int64_t default_wide_step_rows(Llama& model) {
  if (!model->embed_tokens->weight.device().is_cpu()) return 8;
  return weight_bytes_per_decoded_token(model) >= kWidePassWeightBytes ? 1 : 8;
}

Server::Server(ServedModel model, const ServeOptions& options) : state_(std::make_unique<State>()) {
  State& state = *state_;
  state.served = std::move(model);
  state.options = options;
  SchedulerOptions scheduling;
  scheduling.max_batch = options.max_batch;
  scheduling.max_queue = options.max_queue;
  scheduling.context = options.context;
  scheduling.max_queue_wait_seconds = options.max_queue_wait_seconds;
  scheduling.max_queued_tokens = options.max_queued_tokens;
  scheduling.prefill_chunk = options.prefill_chunk;
  scheduling.wide_step_threads = options.wide_step_threads;
  scheduling.wide_step_rows = options.wide_step_rows > 0 ? options.wide_step_rows : default_wide_step_rows(state.served.model);
  scheduling.lanes = options.lanes > 0 ? options.lanes
                                       : default_lanes(state.served.model, options.wide_step_threads, last_level_cache_bytes());
  state.scheduler = std::make_unique<Scheduler>(state.served.model, scheduling);
  state.limits.max_tokens = state.scheduler->context();

  // Connections wait in the gate (no thread) until a whole request has arrived; every running or
  // queued request then holds a worker while it waits, and a few more answer /health and /metrics
  // (and 503s) meanwhile.
  GateOptions gate;
  gate.max_connections = static_cast<size_t>(options.max_connections);
  gate.first_byte_seconds = options.first_byte_timeout_seconds;
  gate.request_seconds = options.read_timeout_seconds;
  gate.max_body_bytes = static_cast<size_t>(options.max_body_bytes);
  gate.workers = static_cast<size_t>(options.max_batch + options.max_queue + 8);
  gate.max_ready = static_cast<size_t>(options.max_batch + options.max_queue);
  gate.retry_after_seconds = kRetryAfterSeconds;
  state.http = std::make_unique<GatedHttpServer>(gate);
  auto& http = *state.http;
  http.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  http.set_read_timeout(options.read_timeout_seconds, 0);
  http.set_write_timeout(options.write_timeout_seconds, 0);
  http.set_tcp_nodelay(true);
  // The listening socket, kept so that shutdown() can close it alone: httplib's own stop() would
  // also end every response still being streamed (its writers check for the stop).
  http.set_socket_options([this](socket_t socket) {
    const int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    state_->listening_socket = socket;
  });
  http.set_error_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return;
    std::string message = "HTTP error " + std::to_string(response.status);
    if (response.status == 400) message = "malformed HTTP request";
    if (response.status == 404) message = "no such endpoint: " + request.method + " " + request.path;
    if (response.status == 413)
      message = "the request body is larger than " + std::to_string(state_->options.max_body_bytes) + " bytes";
    reply_error(response, response.status, message);
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& response, std::exception_ptr error) {
    std::string message = "internal error";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& caught) {
      message = caught.what();
    } catch (...) {
    }
    reply_error(response, 500, message);
  });

  http.Post(kCompletionsPath, [&state](const httplib::Request& request, httplib::Response& response) {
    state.handle_completion(request, response, false);
  });
  http.Post(kChatPath, [&state](const httplib::Request& request, httplib::Response& response) {
    state.handle_completion(request, response, true);
  });
  http.Get("/health", [&state](const httplib::Request&, httplib::Response& response) {
    if (state.stopping) {
      reply_error(response, 503, "shutting down");
    } else {
      response.set_content(dump({{"status", "ok"}, {"model", state.served.id}}), "application/json");
    }
  });
  http.Get("/v1/models", [&state](const httplib::Request&, httplib::Response& response) {
    const auto& config = state.served.model->config();
    json model = {{"id", state.served.id}, {"object", "model"}, {"created", 0}, {"owned_by", "coconut"},
                  {"base", state.served.base.empty() ? state.served.id : state.served.base},
                  {"adapter", state.served.adapter.empty() ? json(nullptr) : json(state.served.adapter)},
                  {"context", state.scheduler->context()}, {"parameters", count_parameters(config).total},
                  {"layers", config.num_hidden_layers}, {"depth_router", config.depth_router},
                  {"mode", training_mode_name(state.served.mode)},
                  {"default_latent_thoughts", state.served.default_latent_thoughts}};
    if (state.served.cascade.active())
      model["default_depth_cascade"] = state.served.cascade.layer_sets()
                                           ? json{{"removed", state.served.cascade.removed}, {"confidence", state.served.cascade.confidence}}
                                           : json{{"depths", state.served.cascade.depths}, {"confidence", state.served.cascade.confidence}};
    response.set_content(dump({{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });
  http.Get("/metrics", [&state](const httplib::Request&, httplib::Response& response) {
    response.set_content(state.metrics.prometheus_text(state.scheduler->stats(), state.http->gate_stats()),
                         "text/plain; version=0.0.4");
  });
}

Server::~Server() {
  shutdown();
  state_->scheduler->join();
}

int Server::bind() {
  const int port = state_->options.port == 0 ? state_->http->bind_to_any_port(state_->options.host)
                                             : (state_->http->bind_to_port(state_->options.host, state_->options.port)
                                                    ? state_->options.port
                                                    : -1);
  if (port < 0)
    throw std::runtime_error("serve: cannot listen on " + state_->options.host + ":" + std::to_string(state_->options.port));
  // cpp-httplib listens with a backlog of 5: a burst of clients would see dropped connection
  // attempts, retried by their kernels a second later. Listening again only raises the backlog.
  if (::listen(state_->listening_socket, SOMAXCONN) != 0)
    throw std::runtime_error("serve: cannot raise the listen backlog on port " + std::to_string(port));
  return port;
}

void Server::listen() {
  state_->http->listen_after_bind();
  // Every handler has returned, so every in-flight request is answered. (Should accept() itself
  // have failed, this also stops the scheduler, which would otherwise wait for work forever.)
  shutdown();
  state_->scheduler->join();
}

void Server::shutdown() {
  state_->stopping = true;
  state_->scheduler->shutdown(std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(state_->options.shutdown_grace_seconds)));
  // No new connections: accept() fails, httplib's loop ends and waits for its handlers, which
  // finish the requests in flight (new requests on open connections get 503 meanwhile).
  const int socket = state_->listening_socket.exchange(-1);
  if (socket >= 0) ::shutdown(socket, SHUT_RDWR);
}

const ServedModel& Server::model() const { return state_->served; }
int64_t Server::context() const { return state_->scheduler->context(); }
int Server::lanes() const { return static_cast<int>(state_->scheduler->lanes()); }

int64_t Server::wide_step_rows() const { return state_->scheduler->wide_step_rows(); }

namespace {

// SIGTERM and SIGINT may land on any thread of the process (torch's and OpenMP's workers exist
// before serve() runs, so a signal mask set here would not cover them). The handler only writes
// the signal's number into a pipe, which is async-signal-safe; one thread reads it and shuts down.
int stop_signal_pipe[2] = {-1, -1};

void on_stop_signal(int signal) {
  const auto number = static_cast<unsigned char>(signal);
  [[maybe_unused]] const ssize_t written = ::write(stop_signal_pipe[1], &number, 1);
}

class StopSignals {
 public:
  StopSignals() {
    if (::pipe2(stop_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw std::runtime_error("serve: cannot create the pipe that carries SIGTERM");
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, &previous_term_);
    sigaction(SIGINT, &action, &previous_int_);
  }
  ~StopSignals() {
    sigaction(SIGTERM, &previous_term_, nullptr);
    sigaction(SIGINT, &previous_int_, nullptr);
    ::close(stop_signal_pipe[0]);
    ::close(stop_signal_pipe[1]);
    stop_signal_pipe[0] = stop_signal_pipe[1] = -1;
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal received within `timeout`, or 0.
  static int wait(std::chrono::milliseconds timeout) {
    pollfd readable{stop_signal_pipe[0], POLLIN, 0};
    if (::poll(&readable, 1, static_cast<int>(timeout.count())) <= 0) return 0;
    unsigned char number = 0;
    return ::read(stop_signal_pipe[0], &number, 1) == 1 ? number : 0;
  }

 private:
  struct sigaction previous_term_ {};
  struct sigaction previous_int_ {};
};

}  // namespace

int serve(const ServeOptions& options, std::ostream& log) {
  // Installed before the model loads: a SIGTERM meanwhile stops the server as soon as it listens.
  StopSignals stop_signals;
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-answer

  std::optional<torch::ScalarType> dtype;
  if (!options.dtype.empty()) dtype = dtype_from_name(options.dtype);
  const std::string weights =
      resolve_weights(options.weights, options.model_dir, !options.adapter_dir.empty(), torch::Device(options.device).is_cpu());
  ServedModel served = load_served_model(options.model_dir, options.adapter_dir, dtype, torch::Device(options.device),
                                         weight_format_from_name(weights));
  const LlamaConfig config = served.model->config();
  Server server(std::move(served), options);
  const int port = server.bind();
  const int64_t context = server.context();
  const ParameterCount parameters = count_parameters(config);
  const auto model_dtype = server.model().model->embed_tokens->weight.scalar_type();
  const DepthCascade& cascade = server.model().cascade;
  log << fmt::format("model {}: {} layers, {} parameters ({} non-embedding), {}{}, mode {}{}{}\n", server.model().id,
                     config.num_hidden_layers, parameters.total, parameters.non_embedding, dtype_name(model_dtype),
                     weights == "dense" ? "" : ", projections " + weights,
                     training_mode_name(server.model().mode),
                     server.model().default_latent_thoughts > 0
                         ? fmt::format(", {} latent thoughts by default", server.model().default_latent_thoughts)
                         : std::string(),
                     cascade.active() ? ", depth cascade " + describe_depth_cascade(cascade) + " by default" : std::string())

      << fmt::format("cost: {:.3g} FLOPs per token at context {}, KV cache {} bytes per token, {} slots x {} positions = {:.1f} MiB\n",
                     flops_per_token(config, context).total(), context, kv_cache_bytes_per_token(config, model_dtype),
                     options.max_batch, context,
                     static_cast<double>(kv_cache_bytes_per_token(config, model_dtype) * options.max_batch * context) / (1 << 20))
      << fmt::format("serving on http://{}:{} (max batch {}, queue {}, {} lane{}); SIGTERM or Ctrl-C stops\n",
                     options.host, port, options.max_batch, options.max_queue, server.lanes(), server.lanes() == 1 ? "" : "s")
      << std::flush;

  std::atomic<bool> finished{false};
  std::thread signal_waiter([&] {
    while (!finished) {
      const int signal = StopSignals::wait(std::chrono::milliseconds(200));
      if (signal == SIGTERM || signal == SIGINT) {
        log << fmt::format("{}: no new requests; in-flight ones get {} s to finish\n", signal == SIGTERM ? "SIGTERM" : "SIGINT",
                           options.shutdown_grace_seconds)
            << std::flush;
        server.shutdown();
        return;
      }
    }
  });
  server.listen();
  finished = true;
  signal_waiter.join();
  log << "stopped\n" << std::flush;
  return 0;
}

}  // namespace coconut::serve
