// Chat templates rendered as jinja2 renders them (tests/reference/render_chat_templates.py, the
// way transformers' apply_chat_template calls it): SmolLM2's ChatML, Llama 3's and Llama 3.2's.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "support/reference_python.h"
#include "support/temp_dir.h"
#include "text/chat_template.h"

namespace coconut {
namespace {

using testing::TempDir;

TEST(ChatTemplate, RendersAsJinjaDoes) {
  TempDir dir;
  ASSERT_TRUE(testing::run_reference("render_chat_templates.py",
                                     testing::test_data("gguf/smollm2-tiny-q.gguf") + " " + testing::test_data("chat_templates") +
                                         " " + dir.file("cases.json"),
                                     dir.file("log")));
  const auto cases = nlohmann::json::parse(std::ifstream(dir.file("cases.json")));
  ASSERT_EQ(cases.size(), 12u);
  for (const auto& entry : cases) {
    const ChatTemplate chat = ChatTemplate::recognise(entry["jinja"].get<std::string>(), entry["template"].get<std::string>());
    std::vector<ChatMessage> messages;
    for (const auto& message : entry["messages"]) messages.push_back({message["role"], message["content"]});
    EXPECT_EQ(chat.render(messages, "<|begin_of_text|>", "27 Nov 2026"), entry["rendered"].get<std::string>())
        << entry["template"] << " " << entry["messages"].dump();
  }
}

TEST(ChatTemplate, KnowsItsFormatsAndRefusesOthers) {
  const auto smollm2 = ChatTemplate::recognise(
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nBe "
      "brief.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}",
      "x");
  EXPECT_EQ(smollm2.format(), ChatTemplate::Format::kChatMl);
  EXPECT_EQ(smollm2.default_system().value_or("none"), "Be brief.");
  try {
    ChatTemplate::recognise("{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}", "mistral/tokenizer_config.json");
    FAIL() << "a Mistral template was taken";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("mistral/tokenizer_config.json"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("neither ChatML"), std::string::npos) << error.what();
  }
  TempDir dir;
  const auto none = load_chat_template(dir.path().string());
  EXPECT_FALSE(none.chat.has_value());
  EXPECT_NE(none.problem.find("has no chat_template"), std::string::npos) << none.problem;
}

}  // namespace
}  // namespace coconut
