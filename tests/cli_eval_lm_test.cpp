// coconut eval-lm as a user runs it, on the stories260K fixture (a tiny Llama with a SentencePiece
// tokenizer): perplexity and choice scores against `coconut logits` of the same ids (one forward,
// its log-probabilities summed here), and bad inputs named by file, line and field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "support/run_cli.h"
#include "support/temp_dir.h"
#include "text/hf_tokenizer.h"

using coconut::testing::capture_coconut;
using coconut::testing::test_data;
using coconut::testing::TempDir;

namespace {

const std::string kStories = test_data("models/stories260K");

// log p(ids[t] | ids[..t]) for t in [from, ids.size()), from `coconut logits` over `ids`.
double logits_log_probability(const std::vector<int64_t>& ids, size_t from, TempDir& dir) {
  std::string list;
  for (int64_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  const auto run = capture_coconut("logits --model " + kStories + " --ids " + list + " --force --out " + dir.file("logits.safetensors"));
  EXPECT_EQ(run.status, 0);
  const auto log_probs = torch::log_softmax(coconut::read_safetensors(dir.file("logits.safetensors")).at("logits"), -1);  // [T, V]
  double total = 0;
  for (size_t t = from; t < ids.size(); ++t) total += log_probs[static_cast<int64_t>(t) - 1][ids[t]].item<double>();
  return total;
}

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

void expect_refused(const std::string& arguments, std::initializer_list<std::string> names) {
  const auto run = capture_coconut(arguments, "2>&1 >/dev/null");
  EXPECT_EQ(run.status, 1) << arguments << "\n" << run.output;
  for (const auto& name : names) EXPECT_NE(run.output.find(name), std::string::npos) << name << " not in: " << run.output;
}

}  // namespace

TEST(CliEvalLm, PerplexityIsTheTextsLogProbabilityOverItsTokens) {
  TempDir dir;
  const std::string text = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.";
  write(dir.file("story.txt"), text);
  const auto tokenizer = coconut::HfTokenizer::load(kStories + "/tokenizer.json");
  const auto ids = tokenizer->encode_with_special_tokens(text);  // BOS first: this tokenizer adds one
  ASSERT_GT(ids.size(), 10u);
  const auto whole = capture_coconut("eval-lm --model " + kStories + " --text " + dir.file("story.txt") + " --summary " + dir.file("s.json"));
  ASSERT_EQ(whole.status, 0) << whole.output;
  const auto summary = coconut::testing::printed_json(whole.output);
  const double expected_nll = -logits_log_probability(ids, 1, dir);
  EXPECT_EQ(summary["tokens"].get<int64_t>(), static_cast<int64_t>(ids.size()));
  EXPECT_EQ(summary["scored_tokens"].get<int64_t>(), static_cast<int64_t>(ids.size()) - 1);
  EXPECT_EQ(summary["windows"].get<int64_t>(), 1);
  EXPECT_EQ(summary["weights"], "dense");  // which weights ran, and in what dtype
  EXPECT_EQ(summary["dtype"], "float32");
  EXPECT_NEAR(summary["nll"].get<double>(), expected_nll, 1e-4 * expected_nll);
  EXPECT_NEAR(summary["perplexity"].get<double>(), std::exp(expected_nll / static_cast<double>(ids.size() - 1)), 1e-3);
  EXPECT_EQ(coconut::testing::printed_json(coconut::testing::read_text(dir.file("s.json")))["nll"], summary["nll"]);

  // Windows of 8 every 3: every token after the first scored once, each with at least 5 before it.
  const auto strided = capture_coconut("eval-lm --model " + kStories + " --text " + dir.file("story.txt") + " --window 8 --stride 3 --batch-size 2");
  ASSERT_EQ(strided.status, 0) << strided.output;
  const auto windows = coconut::testing::printed_json(strided.output);
  EXPECT_EQ(windows["scored_tokens"].get<int64_t>(), static_cast<int64_t>(ids.size()) - 1);
  EXPECT_GT(windows["nll"].get<double>(), summary["nll"].get<double>());  // less context: a worse fit
  double strided_nll = 0;
  for (int64_t begin = 0, previous_end = 0, n = static_cast<int64_t>(ids.size()); previous_end < n; begin += 3) {
    const int64_t end = std::min<int64_t>(begin + 8, n);
    const std::vector<int64_t> part(ids.begin() + begin, ids.begin() + end);
    strided_nll -= logits_log_probability(part, static_cast<size_t>(std::max(previous_end, begin + 1) - begin), dir);
    previous_end = end;
  }
  EXPECT_NEAR(windows["nll"].get<double>(), strided_nll, 1e-4 * strided_nll);
}

TEST(CliEvalLm, ChoicesScoreTheirTokensAfterTheContext) {
  TempDir dir;
  write(dir.file("items.jsonl"),
        "{\"id\": \"a\", \"context\": \"Once upon a time, there was a little \", \"choices\": [\"girl\", \"purple elephant\", \"dog\"], \"label\": 0}\n"
        "\n"
        "{\"context\": \"The sun was \", \"choices\": [\"shining\", \"x\"], \"label\": 1}\n");
  const auto run = capture_coconut("eval-lm --model " + kStories + " --choices " + dir.file("items.jsonl") + " --out " + dir.file("out.jsonl"));
  ASSERT_EQ(run.status, 0) << run.output;
  const auto summary = coconut::testing::printed_json(run.output);
  EXPECT_EQ(summary["items"].get<int64_t>(), 2);
  std::ifstream out(dir.file("out.jsonl"));
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(out, line);) records.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["id"], "a");
  EXPECT_EQ(records[1]["id"], 3);  // no id: its line number
  // The first item's scores by hand: context and continuation split as lm-evaluation-harness does
  // (the space ending the context starts each continuation), each choice from one forward.
  const auto tokenizer = coconut::HfTokenizer::load(kStories + "/tokenizer.json");
  const std::string context = "Once upon a time, there was a little";
  const auto context_ids = tokenizer->encode(context);
  const std::vector<std::string> choices = {"girl", "purple elephant", "dog"};
  double right = 0, right_norm = 0;
  for (size_t c = 0; c < choices.size(); ++c) {
    const auto whole = tokenizer->encode(context + " " + choices[c]);
    ASSERT_TRUE(std::equal(context_ids.begin(), context_ids.end(), whole.begin()));
    EXPECT_NEAR(records[0]["scores"][c].get<double>(), logits_log_probability(whole, context_ids.size(), dir), 1e-4) << choices[c];
  }
  for (const auto& record : records) {
    const auto scores = record["scores"].get<std::vector<double>>();
    const auto best = std::max_element(scores.begin(), scores.end()) - scores.begin();
    EXPECT_EQ(record["pred"].get<int64_t>(), best);
    right += record["pred"] == record["label"];
    right_norm += record["pred_norm"] == record["label"];
  }
  // acc_norm divides by characters: "purple elephant" (15) against "girl" (4) and "dog" (3).
  const auto first = records[0]["scores"].get<std::vector<double>>();
  const std::vector<double> normalized = {first[0] / 4, first[1] / 15, first[2] / 3};
  EXPECT_EQ(records[0]["pred_norm"].get<int64_t>(), std::max_element(normalized.begin(), normalized.end()) - normalized.begin());
  EXPECT_DOUBLE_EQ(summary["acc"].get<double>(), right / 2);
  EXPECT_DOUBLE_EQ(summary["acc_norm"].get<double>(), right_norm / 2);

  const auto limited = capture_coconut("eval-lm --model " + kStories + " --choices " + dir.file("items.jsonl") + " --limit 1");
  ASSERT_EQ(limited.status, 0);
  EXPECT_EQ(coconut::testing::printed_json(limited.output)["items"].get<int64_t>(), 1);
}

TEST(CliEvalLm, BadInputIsNamedByFileLineAndField) {
  TempDir dir;
  const std::string eval = "eval-lm --model " + kStories;
  const auto refused_line = [&](const std::string& name, const std::string& second_line, std::initializer_list<std::string> said) {
    write(dir.file(name), "{\"context\": \"a \", \"choices\": [\"b\", \"c\"], \"label\": 0}\n" + second_line + "\n");
    std::vector<std::string> names = {dir.file(name) + ":2: "};
    names.insert(names.end(), said.begin(), said.end());
    const auto run = capture_coconut(eval + " --choices " + dir.file(name), "2>&1 >/dev/null");
    EXPECT_EQ(run.status, 1) << run.output;
    for (const auto& part : names) EXPECT_NE(run.output.find(part), std::string::npos) << part << " not in: " << run.output;
  };
  refused_line("malformed.jsonl", "{\"context\": \"a\", \"choices\": [\"b\"", {"not a JSON object"});
  refused_line("label.jsonl", "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"label\": 2}", {"'label' 2 is outside the 2 choices"});
  refused_line("negative.jsonl", "{\"context\": \"a\", \"choices\": [\"b\"], \"label\": -1}", {"'label' -1"});
  refused_line("empty.jsonl", "{\"context\": \"a\", \"choices\": [\"b\", \"\"], \"label\": 0}", {"choice 1 is empty"});
  refused_line("nocontext.jsonl", "{\"choices\": [\"b\"], \"label\": 0}", {"'context' must be a string"});
  refused_line("nochoices.jsonl", "{\"context\": \"a\", \"choices\": [], \"label\": 0}", {"'choices' must be a non-empty array"});
  write(dir.file("short.txt"), "");  // BOS alone
  expect_refused(eval + " --text " + dir.file("short.txt"), {dir.file("short.txt"), "perplexity needs at least 2"});
  expect_refused(eval + " --text /nonexistent.txt", {"/nonexistent.txt: cannot open the text file"});
  expect_refused(eval, {"give --text FILE or --choices FILE.jsonl"});
  write(dir.file("story.txt"), "Once upon a time");
  expect_refused(eval + " --text " + dir.file("story.txt") + " --window 8 --stride 9", {"--stride must be at most --window"});
  expect_refused(eval + " --text " + dir.file("story.txt") + " --window 100000", {"exceeds the model's context"});
}
