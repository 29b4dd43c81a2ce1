// The body of POST /v1/completions (OpenAI's fields plus Coconut's extensions), validated before
// anything runs. A bad field is a RequestError naming it; the HTTP layer answers it with a 4xx
// and a JSON error body.
//
// Unknown fields are ignored, as OpenAI-compatible servers do (clients send "user", "logit_bias",
// "stream_options" and the like). Known fields this server does not implement are refused when
// they ask for something (n or best_of above 1, suffix, non-zero penalties; logprobs of a streamed
// answer) rather than silently ignored. "logprobs": k (0..20) gives each generated token's
// log-probability and the k most likely tokens at its position.
//
// Scoring, as lm-evaluation-harness's local-completions model asks for it: "echo": true returns
// each prompt with the log-probability of every token after its first ("logprobs": k adds the k
// most likely tokens at each position, 0..20), with "max_tokens" 0 (the prompt alone) or 1 (one
// greedy token after it, scored too); "prompt" may then be a batch, an array of strings or of
// token-id arrays, one choice each. Streamed, the whole answer is one event before [DONE]. A
// Coconut model's "latent_thoughts" run where a prompt holds <|start-latent|><|end-latent|>.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "reasoning/layout.h"
#include "text/chat_template.h"

namespace coconut::serve {

struct RequestError : std::runtime_error {
  RequestError(int status, std::string param, const std::string& message)
      : std::runtime_error(message), status(status), param(std::move(param)) {}
  int status;         // HTTP status (400, 413, 503, ...)
  std::string param;  // the offending field, "" when none
};

struct CompletionRequest {
  // /v1/chat/completions: the conversation, rendered by the model's chat template.
  bool chat = false;
  std::vector<ChatMessage> messages;
  std::optional<std::string> prompt_text;  // "prompt": a string (or a one-string array)
  std::vector<int64_t> prompt_ids;         // "prompt": an array of token ids
  // Scoring: "echo" and "logprobs" (above); every prompt of the batch, text or token ids (one of
  // prompt_text / prompt_ids above is the first).
  bool echo = false;
  std::optional<int64_t> logprobs;
  struct Prompt {
    std::optional<std::string> text;
    std::vector<int64_t> ids;
  };
  std::vector<Prompt> prompts;
  int64_t max_tokens = 16;                 // OpenAI's default
  double temperature = 1.0;                // OpenAI's default; 0 = greedy
  double top_p = 1.0;
  std::optional<int64_t> seed;             // absent: a fresh random seed
  std::vector<std::string> stop;           // up to 4 strings; the text ends before the first match
  bool stream = false;
  // Extensions: continuous thoughts (default: what coconut.json says), mean layers per
  // thought/token (models with a depth router; without one, a prefix of the layers), the router's
  // gate threshold, and a depth cascade ("5,8@0.9" as eval's --cascade, or "off" for every layer;
  // default: coconut.json's depth_cascade, where the model has one).
  std::optional<int64_t> latent_thoughts;
  std::optional<double> depth_budget;
  std::optional<double> router_threshold;
  std::optional<DepthCascade> depth_cascade;  // "off": an inactive one
};

struct RequestLimits {
  int64_t max_tokens = 4096;      // the most tokens a request may ask for (the context caps it again)
  int64_t max_latent_thoughts = 1024;
};

// Parses and checks a request body (UTF-8 JSON). Throws RequestError.
CompletionRequest parse_completion_request(const std::string& body, const RequestLimits& limits);

// The chat endpoint's body: "messages" (each a role of system, user or assistant and a string
// content, or content parts of type text) in place of "prompt"; "max_completion_tokens" is
// taken as "max_tokens"; the other fields as parse_completion_request reads them.
CompletionRequest parse_chat_request(const std::string& body, const RequestLimits& limits);

}  // namespace coconut::serve
