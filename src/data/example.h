// Reasoning examples: a question, its reasoning steps and the answer (extra fields kept), and
// loaders for the formats the datasets ship in.
#pragma once

#include <nlohmann/json.hpp>

#include <random>
#include <string>
#include <vector>

namespace coconut {

struct Example {
  std::string question;
  std::vector<std::string> steps;
  std::string answer;
  nlohmann::json extra = nlohmann::json::object();  // fields beyond the three above (kept, ignored)
};

// Coconut's JSON: a list of {"question", "steps": [...], "answer", ...} (ProsQA, ProntoQA, GSM8K).
std::vector<Example> load_coconut_json(const std::string& path);
// Stepwise internalisation text: one `question||chain of thought #### answer` a line. The steps
// are the `<<...>>` annotations when the chain has them (the GSM8K file), otherwise the chain split
// on " + " (the N_by_N_mult files: partial products, each with its running sum).
std::vector<Example> load_icot_text(const std::string& path);
// GSM8K's original jsonl: {"question", "answer": "... <<48/2=24>> ... #### 72"}; the steps are the
// `<<...>>` annotations, the answer the text after "####".
std::vector<Example> load_gsm8k_jsonl(const std::string& path);
// By extension and content: .json -> Coconut JSON, .jsonl -> GSM8K jsonl, .txt -> icot text; plain text
// (data/text_documents.h) is refused with a message that says where it is read.
// Every loader fails on malformed input (naming file, line or index, and field) and on an empty set.
std::vector<Example> load_dataset(const std::string& path);

// The question with its sentences but the last (the query) in a random order: the facts of ProntoQA
// and ProsQA questions hold in any order. A sentence ends with '.', '?' or '!' before a space or the end.
// drop_unused: each sentence that no step quotes (a distractor: the steps of ProntoQA and ProsQA
// quote every fact they use) is left out with this probability, a curriculum of shorter contexts.
// keep_query_matches: a distractor that shares a rare word (in at most two facts) with the query is
// never left out: the hard distractors stay ("Tumpuses are wooden" when the chain ends on
// "Numpuses are not wooden" and the query is "Max is not wooden"), so a short context still
// demands telling them apart.
Example shuffle_question_sentences(const Example& example, std::mt19937_64& rng, double drop_unused = 0.0,
                                   bool keep_query_matches = false);

void save_coconut_json(const std::string& path, const std::vector<Example>& examples);

// The icot multiplication chain for operands written least-significant digit first ("5 6 3 2"):
// partial products of a by each digit of b, each shifted and with its running sum in parentheses
// (all but the first and the last), then the product with len(a) + len(b) digits.
Example multiplication_example(const std::vector<int>& a_digits, const std::vector<int>& b_digits);
// `count` random examples with `digits`-digit operands (leading digit non-zero), seeded.
std::vector<Example> generate_multiplication(int digits, int count, uint64_t seed);
// The icot text line of an example: `question||steps joined by " + " #### answer`.
std::string icot_line(const Example& example);

}  // namespace coconut
