// Continuous batching on the clock: M concurrent clients on 127.0.0.1 against one client at a
// time, each sending streamed greedy completions (fixed prompt and length, EOS off) for a bounded
// number of requests. Reports completion tokens/s over the wall time, and p50/p99 of the time to
// first token and of the whole request, per concurrency, next to generate() on the same prompts
// without the server, and the HTTP round trip alone. The model is --model DIR, or the random
// 27.8M-parameter Llama of bench_prune with a word-level tokenizer over its vocabulary.
// --external-port PORT sends the same requests to another OpenAI-compatible server instead (llama.cpp's
// llama-server on `coconut export-gguf` of the same model: the side-by-side the issue asks for).
// Prints what one run measured; nothing here is a pass/fail test.
#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <fmt/core.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_support.h"
#include "model/cpu_decode.h"
#include "model/generate.h"
#include "model/quantized_linear.h"
#include "model/threads.h"
#include "reasoning/special_tokens.h"
#include "serve/server.h"
#include "text/hf_tokenizer.h"

using namespace coconut;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  std::string model;
  std::vector<int> clients = {1, 4, 16};
  int requests_per_client = 4;
  int64_t prompt_words = 64, max_tokens = 64, max_batch = 16;
  double max_seconds = 60;
  int reserved_cores = 1;  // as `coconut serve`: one core for the HTTP and client threads
  int wide_step_threads = -1;  // as `coconut serve`: every core for a pass over wide_step_rows positions or more
  int64_t wide_step_rows = 0;  // as `coconut serve`: automatic (serve::default_wide_step_rows)
  int lanes = 0;  // as `coconut serve`: automatic (serve::default_lanes)
  int external_port = 0;   // > 0: measure the OpenAI-compatible server on 127.0.0.1:port instead of ours
  bool stream = true;      // false: each answer comes whole (no time to first token then)
  bool general_decode = false;  // decode on the general forward (A/B against the decode step over memory)
  std::string dtype;             // with --model: its activations' dtype (empty: the folder's)
  std::string weights = "dense";  // with --model: dense | q8_0 | q4_0 | q4_1 | gguf
};

// The bench_prune model with random weights, EOS made unreachable, and a tokenizer whose words are
// its vocabulary.
serve::ServedModel random_model() {
  LlamaConfig config = bench::small_bench_config();
  std::vector<std::string> specials = {"<pad>", "<bos>", "<eos>", "<unk>"};
  std::string words;
  for (int64_t i = static_cast<int64_t>(specials.size()); i < config.vocab_size; ++i) words += "w" + std::to_string(i) + " ";
  auto tokenizer = build_word_level_tokenizer({words}, specials);
  config.bos_token_ids = {1};
  config.eos_token_ids = {2};
  config.validate();
  serve::ServedModel served;
  served.id = "random-27.8M";
  served.model = Llama(config);
  initialize_weights(served.model, 0.02, 1);
  {
    torch::NoGradGuard no_grad;
    served.model->output_weight()[2].fill_(0);
  }
  served.special = find_special_tokens(*tokenizer, config);
  served.tokenizer = std::move(tokenizer);
  return served;
}

struct Sample {
  double first_token_seconds = 0, total_seconds = 0;
  int64_t completion_tokens = 0;
  bool ok = false;
};

// One streamed request on a fresh connection, timed from before connect to [DONE].
Sample stream_once(int port, const std::string& body) {
  Sample sample;
  const auto start = Clock::now();
  const int socket_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(socket_fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(socket_fd);
    return sample;
  }
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: bench\r\nConnection: close\r\nContent-Type: "
                              "application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ::send(socket_fd, request.data(), request.size(), 0);
  std::string received;
  char buffer[4096];
  bool first = false;
  while (true) {
    const ssize_t n = ::recv(socket_fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    received.append(buffer, static_cast<size_t>(n));
    if (!first && received.find("\"text\"") != std::string::npos) {
      first = true;
      sample.first_token_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    }
    if (received.find("data: [DONE]") != std::string::npos) break;
  }
  ::close(socket_fd);
  sample.total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (received.find(" 200 ") == std::string::npos) return sample;
  const auto usage = received.find("\"completion_tokens\":");
  if (usage != std::string::npos) {
    sample.completion_tokens = std::stoll(received.substr(usage + 20));
  } else {  // a server without usage in its stream (llama.cpp's): one event per token
    for (size_t at = received.find("data: {"); at != std::string::npos; at = received.find("data: {", at + 1))
      if (received.find("\"text\":", at) < received.find("\n\n", at)) ++sample.completion_tokens;
  }
  sample.ok = sample.completion_tokens > 0;
  return sample;
}

double percentile(std::vector<double> values, double fraction) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto index = static_cast<size_t>(std::ceil(fraction * static_cast<double>(values.size()))) - 1;
  return values[std::min(index, values.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"bench_serve: continuous batching, M concurrent clients against one at a time"};
  app.add_option("--model", flags.model, "HF model folder (default: a random 27.8M-parameter model)");
  app.add_option("--clients", flags.clients, "concurrencies to measure")->capture_default_str();
  app.add_option("--requests-per-client", flags.requests_per_client, "requests each client sends")->capture_default_str();
  app.add_option("--prompt-words", flags.prompt_words, "prompt length in words")->capture_default_str();
  app.add_option("--max-tokens", flags.max_tokens, "tokens per answer")->capture_default_str();
  app.add_option("--max-batch", flags.max_batch, "server slots")->capture_default_str();
  app.add_option("--max-seconds", flags.max_seconds, "stop sending new requests after this long per concurrency")
      ->capture_default_str();
  app.add_option("--reserve-cores", flags.reserved_cores,
                 "cores left to the HTTP and client threads (coconut serve reserves 1; OMP_NUM_THREADS overrides)")
      ->capture_default_str();
  app.add_option("--external-port", flags.external_port,
                 "measure another OpenAI-compatible server on 127.0.0.1:PORT (llama.cpp's llama-server on the "
                 "export-gguf of --model) with the same prompts, instead of ours");
  app.add_option("--wide-step-threads", flags.wide_step_threads,
                 "threads for a pass over --wide-step-rows positions or more (default every core, as coconut serve; 0 = off)");
  app.add_option("--wide-step-rows", flags.wide_step_rows, "positions from which a pass is wide (default automatic, as coconut serve)");
  app.add_option("--lanes", flags.lanes, "KV-cache lanes stepped side by side (default automatic, as coconut serve)");
  app.add_flag("--stream,!--no-stream", flags.stream, "stream the answers (server-sent events, one per token)")
      ->capture_default_str();
  app.add_option("--dtype", flags.dtype, "with --model: float32 | bfloat16 (default: the folder's)");
  app.add_option("--weights", flags.weights, "with --model: dense | q8_0 | q4_0 | q4_1 | gguf, as coconut serve --weights")
      ->capture_default_str();
  app.add_flag("--general-decode", flags.general_decode,
               "decode on the general forward, not the decode step over memory (model/cpu_decode.h; for A/B runs)");
  CLI11_PARSE(app, argc, argv);
  configure_threads(flags.reserved_cores);
  set_cpu_decode_layers(!flags.general_decode);
  if (flags.wide_step_threads < 0) flags.wide_step_threads = wide_pass_threads();

  std::optional<torch::ScalarType> dtype;
  if (!flags.dtype.empty()) dtype = dtype_from_name(flags.dtype);
  serve::ServedModel served = flags.model.empty() ? random_model()
                                                  : serve::load_served_model(flags.model, "", dtype, torch::kCPU,
                                                                             weight_format_from_name(flags.weights));
  std::string prompt;
  const int64_t vocabulary = served.tokenizer->vocab_size();
  // Words of the vocabulary spread over it; pieces that are not plain letters or digits (byte
  // tokens such as <0x0A>, punctuation, a SentencePiece or byte-level space marker) become "the",
  // so that a prompt is about as many tokens as words for any tokenizer.
  const auto plain = [](const std::string& word) {
    return !word.empty() && std::all_of(word.begin(), word.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
  };
  for (int64_t i = 0; i < flags.prompt_words; ++i) {
    const auto word = served.tokenizer->id_to_token(4 + (i * 7919) % std::max<int64_t>(1, vocabulary - 4));
    prompt += (word && plain(*word) ? *word : std::string("the")) + " ";
  }
  // The same work without the server: generate() on 1 and on max_batch prompts at once.
  std::vector<int64_t> prompt_ids;
  if (served.special.bos) prompt_ids.push_back(*served.special.bos);
  for (int64_t id : served.tokenizer->encode(prompt)) prompt_ids.push_back(id);
  std::vector<std::pair<int64_t, double>> engine_rates;
  for (int64_t rows : {int64_t{1}, flags.max_batch}) {
    GenerationOptions generation;
    generation.max_new_tokens = flags.max_tokens;
    const auto start = Clock::now();
    generate(served.model, std::vector<std::vector<int64_t>>(static_cast<size_t>(rows), prompt_ids), generation);
    engine_rates.emplace_back(rows, static_cast<double>(rows * flags.max_tokens) /
                                        std::chrono::duration<double>(Clock::now() - start).count());
  }
  serve::ServeOptions options;
  options.port = 0;
  options.max_batch = flags.max_batch;
  options.max_queue = 256;
  options.wide_step_threads = flags.wide_step_threads;
  options.wide_step_rows = flags.wide_step_rows;
  options.lanes = flags.lanes;
  options.context = std::min<int64_t>(served.model->config().max_position_embeddings, 2 * (flags.prompt_words + flags.max_tokens) + 64);
  const std::string model_id = served.id;
  std::unique_ptr<serve::Server> server;
  std::thread listener;
  int port = flags.external_port;
  if (port <= 0) {
    server = std::make_unique<serve::Server>(std::move(served), options);
    port = server->bind();
    listener = std::thread([&] { server->listen(); });
  }
  fmt::print("bench_serve: {} on port {}, model {}, {} threads, prompt {} words, {} tokens per answer, {} slots, {} lanes, "
             "passes of {}+ positions wide\n",
             server ? "coconut serve" : "an external server", port, model_id, torch::get_num_threads(), flags.prompt_words,
             flags.max_tokens, flags.max_batch, server ? server->lanes() : 0, server ? server->wide_step_rows() : 0);
  auto request = nlohmann::json{{"prompt", prompt}, {"max_tokens", flags.max_tokens}, {"temperature", 0}, {"stream", flags.stream}};
  // llama.cpp's server keeps a slot's KV cache for a repeated prompt and would skip its prefill;
  // ours reads every prompt, so the external server is asked to as well.
  if (!server) request["cache_prompt"] = false;
  const std::string body = request.dump();
  stream_once(port, body);  // warm-up
  {
    // What the HTTP layer alone costs per request: keep-alive GET /health round trips.
    httplib::Client client("127.0.0.1", port);
    client.set_keep_alive(true);
    const int round_trips = 2000;
    const auto start = Clock::now();
    for (int i = 0; i < round_trips; ++i) client.Get("/health");
    fmt::print("HTTP round trip (cpp-httplib, GET /health, keep-alive): {:.1f} us\n",
               1e6 * std::chrono::duration<double>(Clock::now() - start).count() / round_trips);
  }

  fmt::print("| clients | requests | tokens/s | vs 1 client | TTFT p50 | TTFT p99 | latency p50 | latency p99 |\n");
  fmt::print("|---|---|---|---|---|---|---|---|\n");
  double single = 0;
  for (int clients : flags.clients) {
    std::vector<std::vector<Sample>> samples(static_cast<size_t>(clients));
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (int client = 0; client < clients; ++client)
      threads.emplace_back([&, client] {
        for (int i = 0; i < flags.requests_per_client; ++i) {
          if (std::chrono::duration<double>(Clock::now() - start).count() > flags.max_seconds) break;
          samples[static_cast<size_t>(client)].push_back(stream_once(port, body));
        }
      });
    for (auto& thread : threads) thread.join();
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    std::vector<double> first, total;
    int64_t tokens = 0, failed = 0;
    for (const auto& per_client : samples)
      for (const auto& sample : per_client) {
        if (!sample.ok) {
          ++failed;
          continue;
        }
        first.push_back(sample.first_token_seconds);
        total.push_back(sample.total_seconds);
        tokens += sample.completion_tokens;
      }
    const double rate = static_cast<double>(tokens) / wall;
    if (clients == 1) single = rate;
    fmt::print("| {} | {}{} | {:.1f} | {} | {:.1f} ms | {:.1f} ms | {:.1f} ms | {:.1f} ms |\n", clients, first.size(),
               failed ? fmt::format(" ({} failed)", failed) : "", rate, single > 0 ? fmt::format("{:.2f}x", rate / single) : "-",
               1e3 * percentile(first, 0.5), 1e3 * percentile(first, 0.99), 1e3 * percentile(total, 0.5),
               1e3 * percentile(total, 0.99));
  }
  for (const auto& [rows, rate] : engine_rates)
    fmt::print("generate() alone, {} prompts at once (prefill included): {:.1f} tokens/s\n", rows, rate);
  if (server) {
    server->shutdown();
    listener.join();
  }
  return 0;
}
