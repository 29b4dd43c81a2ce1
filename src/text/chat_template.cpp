#include "text/chat_template.h"

#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <stdexcept>

#include "util/json_text.h"

namespace coconut {

namespace {

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

// Jinja's `trim`: Python's str.strip(), whitespace at both ends.
std::string trim(const std::string& text) {
  const char* space = " \t\n\r\f\v";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

// A Jinja string literal's escapes (\n, \t, \', \", \\) as the characters they stand for.
std::string unescape(const std::string& literal) {
  std::string out;
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal[i] != '\\' || i + 1 == literal.size()) {
      out += literal[i];
      continue;
    }
    const char next = literal[++i];
    out += next == 'n' ? '\n' : next == 't' ? '\t' : next;
  }
  return out;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::strftime(text, sizeof text, "%d %b %Y", &local);
  return text;
}

}  // namespace

ChatTemplate ChatTemplate::recognise(const std::string& jinja, const std::string& source) {
  ChatTemplate chat;
  if (contains(jinja, "<|im_start|>") && contains(jinja, "<|im_end|>") && contains(jinja, "message['content']")) {
    chat.format_ = Format::kChatMl;
    // The system turn written out as a literal, '<|im_start|>system\n...<|im_end|>\n', its line
    // breaks as escapes or as the characters themselves.
    static const std::regex system_literal(R"(['"]<\|im_start\|>system(?:\\n|\n)((?:[^'"\\]|\\.)*)<\|im_end\|>(?:\\n|\n)['"])");
    std::smatch match;
    if (std::regex_search(jinja, match, system_literal)) chat.default_system_ = unescape(match[1].str());
    return chat;
  }
  if (contains(jinja, "<|start_header_id|>") && contains(jinja, "<|end_header_id|>") && contains(jinja, "<|eot_id|>")) {
    chat.format_ = contains(jinja, "Cutting Knowledge Date") ? Format::kLlama31 : Format::kLlama3;
    if (chat.format_ == Format::kLlama31 && !contains(jinja, "strftime_now")) {
      static const std::regex date_literal(R"re(set date_string = "([^"]*)")re");
      std::smatch match;
      if (std::regex_search(jinja, match, date_literal)) chat.fixed_date_ = match[1].str();
    }
    return chat;
  }
  throw std::invalid_argument(source + ": the chat template is neither ChatML (<|im_start|> ... <|im_end|>) nor Llama 3's "
                              "(<|start_header_id|> ... <|eot_id|>), the formats rendered here; Jinja is not evaluated");
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const std::string& bos_token, const std::string& date) const {
  std::string prompt;
  if (format_ == Format::kChatMl) {
    for (size_t i = 0; i < messages.size(); ++i) {
      if (i == 0 && messages[0].role != "system" && default_system_)
        prompt += "<|im_start|>system\n" + *default_system_ + "<|im_end|>\n";
      prompt += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
    }
    return prompt + "<|im_start|>assistant\n";
  }
  const auto turn = [](const ChatMessage& message) {
    return "<|start_header_id|>" + message.role + "<|end_header_id|>\n\n" + trim(message.content) + "<|eot_id|>";
  };
  prompt = bos_token;
  size_t first = 0;
  if (format_ == Format::kLlama31) {
    // The system turn always comes first; the conversation's own system message closes it.
    const bool has_system = !messages.empty() && messages[0].role == "system";
    const std::string today_date = !date.empty() ? date : fixed_date_ ? *fixed_date_ : today();
    prompt += "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: " + today_date + "\n\n" +
              (has_system ? trim(messages[0].content) : "") + "<|eot_id|>";
    first = has_system ? 1 : 0;
  }
  for (size_t i = first; i < messages.size(); ++i) prompt += turn(messages[i]);
  return prompt + "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

ModelChatTemplate load_chat_template(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer_config.json";
  ModelChatTemplate found;
  found.problem = path + " has no chat_template, so the model has no chat format; give the prompt as plain text";
  if (!std::filesystem::exists(path)) return found;
  std::ifstream file(path);
  if (!file) throw std::runtime_error(path + ": cannot be read");
  const auto config = parse_json_text(std::string(std::istreambuf_iterator<char>(file), {}), path);
  if (!config.is_object()) throw std::invalid_argument(path + ": must be a JSON object");
  if (config.contains("bos_token") && config["bos_token"].is_string()) found.bos_text = config["bos_token"].get<std::string>();
  if (!config.contains("chat_template") || !config["chat_template"].is_string()) return found;
  try {
    found.chat = ChatTemplate::recognise(config["chat_template"].get<std::string>(), path);
    found.problem.clear();
  } catch (const std::invalid_argument& error) {
    found.problem = error.what();
  }
  return found;
}

}  // namespace coconut
