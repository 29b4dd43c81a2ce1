// Chat prompts: the model's own chat template (tokenizer_config.json's Jinja `chat_template`)
// recognised as one of the formats rendered here, then rendered as that template renders:
//   - ChatML (<|im_start|>role\ncontent<|im_end|>\n; SmolLM2, Qwen), with the default system
//     message the template inserts when the conversation opens without one;
//   - Llama 3 (<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>, BOS first, contents
//     trimmed), and Llama 3.1 / 3.2's form of it (a system turn that always opens with the
//     knowledge cut-off and today's date) for conversations without tools.
// Jinja itself is not evaluated: any other template is refused with a message saying so.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace coconut {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

class ChatTemplate {
 public:
  enum class Format { kChatMl, kLlama3, kLlama31 };

  // The format of `jinja`, or an std::invalid_argument naming `source` and the formats known.
  static ChatTemplate recognise(const std::string& jinja, const std::string& source);

  // The prompt for `messages`, ending with the assistant's opening (add_generation_prompt).
  // `bos_token` is the text of the model's BOS (Llama 3 starts with it); `date` is Llama 3.1's
  // "Today Date" ("26 Jul 2024" form; empty: today's, as transformers renders it).
  std::string render(const std::vector<ChatMessage>& messages, const std::string& bos_token = "",
                     const std::string& date = "") const;

  Format format() const { return format_; }
  const std::optional<std::string>& default_system() const { return default_system_; }

 private:
  Format format_ = Format::kChatMl;
  std::optional<std::string> default_system_;  // ChatML: inserted when messages[0] is not a system turn
  std::optional<std::string> fixed_date_;      // Llama 3.1: the template's own date (no strftime_now)
};

// The chat template in `model_dir`/tokenizer_config.json, when ChatTemplate renders it (otherwise
// `problem` says why there is none), and the BOS token's text.
struct ModelChatTemplate {
  std::optional<ChatTemplate> chat;
  std::string problem = "it has no chat_template";  // empty when `chat` is set
  std::string bos_text;
};
ModelChatTemplate load_chat_template(const std::string& model_dir);

}  // namespace coconut
