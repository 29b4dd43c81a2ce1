#include "serve/completion_request.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "util/json_text.h"

namespace coconut::serve {
namespace {

using nlohmann::json;

RequestError bad(const std::string& param, const std::string& message) { return RequestError(400, param, message); }

json parse_body(const std::string& body) {
  if (body.empty()) throw bad("", "the request body is empty; send a JSON object");
  json parsed;
  try {
    parsed = parse_json_text(body, "the request body");
  } catch (const std::exception& error) {  // malformed JSON, non-UTF-8 bytes in a string, too deep
    throw bad("", std::string("the request body is not valid JSON: ") + error.what());
  }
  if (!parsed.is_object()) throw bad("", "the request body must be a JSON object, got " + std::string(parsed.type_name()));
  return parsed;
}

int64_t integer_field(const json& value, const std::string& name, int64_t low, int64_t high) {
  if (!value.is_number_integer()) throw bad(name, "'" + name + "' must be an integer, got " + std::string(value.type_name()));
  const bool too_large = value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(high);
  if (too_large || value.get<int64_t>() < low || value.get<int64_t>() > high)
    throw bad(name, "'" + name + "' must be in [" + std::to_string(low) + ", " + std::to_string(high) + "], got " +
                        value.dump());
  const auto number = value.get<int64_t>();
  return number;
}

double number_field(const json& value, const std::string& name, double low, double high) {
  if (!value.is_number()) throw bad(name, "'" + name + "' must be a number, got " + std::string(value.type_name()));
  const auto number = value.get<double>();
  if (!std::isfinite(number) || number < low || number > high)
    throw bad(name, "'" + name + "' must be in [" + std::to_string(low) + ", " + std::to_string(high) + "], got " +
                        value.dump());
  return number;
}

// A field that this server does not implement, refused unless it asks for the default.
void refuse_unless_default(const json& body, const std::string& name, const json& default_value) {
  if (!body.contains(name) || body[name].is_null() || body[name] == default_value) return;
  throw bad(name, "'" + name + "' = " + body[name].dump() + " is not supported by this server");
}

// The fields a completion and a chat completion share.
void parse_sampling_fields(const json& body, CompletionRequest& request, const RequestLimits& limits) {
  // 0 only where the prompt alone is asked for (scoring with echo).
  for (const char* name : {"max_tokens", "max_completion_tokens"})
    if (body.contains(name) && !body[name].is_null())
      request.max_tokens = integer_field(body[name], name, request.echo ? 0 : 1, limits.max_tokens);
  if (body.contains("temperature") && !body["temperature"].is_null())
    request.temperature = number_field(body["temperature"], "temperature", 0, 2);
  if (body.contains("top_p") && !body["top_p"].is_null()) {
    request.top_p = number_field(body["top_p"], "top_p", 0, 1);
    if (request.top_p <= 0) throw bad("top_p", "'top_p' must be above 0");
  }
  if (body.contains("seed") && !body["seed"].is_null())
    request.seed = integer_field(body["seed"], "seed", INT64_MIN, INT64_MAX);
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& stop = body["stop"];
    if (stop.is_string()) {
      request.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array() && stop.size() <= 4) {
      for (const auto& entry : stop) {
        if (!entry.is_string()) throw bad("stop", "'stop' must be a string or an array of up to 4 strings");
        request.stop.push_back(entry.get<std::string>());
      }
    } else {
      throw bad("stop", "'stop' must be a string or an array of up to 4 strings");
    }
    for (const auto& text : request.stop)
      if (text.empty() || text.size() > 256) throw bad("stop", "each 'stop' string must have 1 to 256 bytes");
  }
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) throw bad("stream", "'stream' must be true or false");
    request.stream = body["stream"].get<bool>();
  }
  if (body.contains("model") && !body["model"].is_null() && !body["model"].is_string())
    throw bad("model", "'model' must be a string");
  if (body.contains("latent_thoughts") && !body["latent_thoughts"].is_null())
    request.latent_thoughts = integer_field(body["latent_thoughts"], "latent_thoughts", 0, limits.max_latent_thoughts);
  if (body.contains("depth_budget") && !body["depth_budget"].is_null()) {
    request.depth_budget = number_field(body["depth_budget"], "depth_budget", 0, 1e6);
    if (*request.depth_budget <= 0) throw bad("depth_budget", "'depth_budget' must be above 0 (layers per position)");
  }
  if (body.contains("router_threshold") && !body["router_threshold"].is_null())
    request.router_threshold = number_field(body["router_threshold"], "router_threshold", 0, 1);
  if (body.contains("depth_cascade") && !body["depth_cascade"].is_null()) {
    if (!body["depth_cascade"].is_string())
      throw bad("depth_cascade", "'depth_cascade' must be a string: depths and a confidence as \"5,8@0.9\", or \"off\"");
    const std::string text = body["depth_cascade"].get<std::string>();
    try {
      request.depth_cascade = text == "off" ? DepthCascade{} : parse_depth_cascade(text);
    } catch (const std::invalid_argument& error) {
      throw bad("depth_cascade", std::string("'depth_cascade': ") + error.what());
    }
    if (request.depth_budget)
      throw bad("depth_cascade", "'depth_cascade' and 'depth_budget' both choose the depth: give one of them");
  }
  refuse_unless_default(body, "n", 1);
  refuse_unless_default(body, "best_of", 1);
  if (request.chat) {
    refuse_unless_default(body, "echo", false);
    refuse_unless_default(body, "logprobs", false);
  }
  refuse_unless_default(body, "suffix", json());
  refuse_unless_default(body, "presence_penalty", 0);
  refuse_unless_default(body, "frequency_penalty", 0);
}

}  // namespace

CompletionRequest parse_completion_request(const std::string& body_text, const RequestLimits& limits) {
  const json body = parse_body(body_text);
  CompletionRequest request;
  if (!body.contains("prompt") || body["prompt"].is_null()) throw bad("prompt", "'prompt' is required");
  const json& prompt = body["prompt"];
  const auto token_ids = [](const json& ids) {
    std::vector<int64_t> parsed;
    for (const auto& id : ids) parsed.push_back(integer_field(id, "prompt", 0, INT32_MAX));
    return parsed;
  };
  if (prompt.is_string()) {
    request.prompts.push_back({prompt.get<std::string>(), {}});
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number()) {
    request.prompts.push_back({std::nullopt, token_ids(prompt)});
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_string()) {
    for (const auto& text : prompt) {
      if (!text.is_string()) throw bad("prompt", "'prompt': an array of strings holds only strings");
      request.prompts.push_back({text.get<std::string>(), {}});
    }
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_array()) {
    for (const auto& ids : prompt) {
      if (!ids.is_array() || ids.empty()) throw bad("prompt", "'prompt': an array of token-id arrays holds only non-empty arrays");
      request.prompts.push_back({std::nullopt, token_ids(ids)});
    }
  } else {
    throw bad("prompt", "'prompt' must be a string, an array of strings, an array of token ids or an array of token-id arrays");
  }
  if (request.prompts.front().text)
    request.prompt_text = request.prompts.front().text;
  else
    request.prompt_ids = request.prompts.front().ids;
  if (body.contains("echo") && !body["echo"].is_null()) {
    if (!body["echo"].is_boolean()) throw bad("echo", "'echo' must be true or false");
    request.echo = body["echo"].get<bool>();
  }
  parse_sampling_fields(body, request, limits);
  if (body.contains("logprobs") && !body["logprobs"].is_null())
    request.logprobs = integer_field(body["logprobs"], "logprobs", 0, 20);
  if (!request.echo) {
    if (request.prompts.size() > 1)
      throw bad("prompt", "a batch of prompts is served with 'echo': true (scoring) only; send one prompt a request");
    if (request.logprobs && request.stream)
      throw bad("logprobs", "'logprobs' of generated tokens is served whole, not streamed: leave 'stream' out");
  } else {
    if (request.max_tokens > 1) throw bad("max_tokens", "with 'echo', 'max_tokens' must be 0 (the prompt alone) or 1 (one greedy token)");
    if (request.max_tokens == 1 && request.temperature > 0)
      throw bad("temperature", "with 'echo', the one token after the prompt is greedy: set 'temperature' to 0");
    if (request.depth_budget || request.router_threshold || request.depth_cascade)
      throw bad("echo", "'echo' scores the prompt with every layer: leave out depth_budget, router_threshold and depth_cascade");
  }
  return request;
}

CompletionRequest parse_chat_request(const std::string& body_text, const RequestLimits& limits) {
  const json body = parse_body(body_text);
  CompletionRequest request;
  request.chat = true;
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    throw bad("messages", "'messages' must be a non-empty array");
  for (const json& message : body["messages"]) {
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string())
      throw bad("messages", "each message must be an object with a 'role' and a 'content'");
    ChatMessage turn{message["role"].get<std::string>(), ""};
    if (turn.role != "system" && turn.role != "user" && turn.role != "assistant")
      throw bad("messages", "message role '" + turn.role + "' is not one of system, user, assistant (tools are not supported)");
    const json content = message.value("content", json());
    if (content.is_string()) {
      turn.content = content.get<std::string>();
    } else if (content.is_array()) {  // content parts: text only
      for (const json& part : content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw bad("messages", "message content parts must be of type 'text' (no images or audio here)");
        turn.content += part["text"].get<std::string>();
      }
    } else {
      throw bad("messages", "each message needs a string 'content'");
    }
    request.messages.push_back(std::move(turn));
  }
  refuse_unless_default(body, "tools", json());
  refuse_unless_default(body, "response_format", json());
  parse_sampling_fields(body, request, limits);
  return request;
}


}  // namespace coconut::serve
