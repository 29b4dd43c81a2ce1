// Plain text end to end (issue 69): a model trained in mode lm learns every token of its windows
// and reports a validation perplexity that eval-lm's independent scorer reproduces; a pruned model
// heals on plain text without reasoning markers and keeps the settings it came with; layer and head
// scores and `prune --drop-block` measure on plain text; `coconut sweep` runs on plain text.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "data/hops.h"
#include "data/text_documents.h"
#include "eval/loglikelihood.h"
#include "io/hf_checkpoint.h"
#include "pruning/scores.h"
#include "pruning/surgery.h"
#include "reasoning/special_tokens.h"
#include "io/peft_adapter.h"
#include "recipes/evaluate_model.h"
#include "recipes/heal.h"
#include "recipes/pruning.h"
#include "recipes/sweep.h"
#include "support/temp_dir.h"
#include "text/hf_tokenizer.h"

using namespace coconut;
using coconut::testing::TempDir;

namespace {

// `count` short documents of a seeded toy grammar, separated by blank lines.
std::string write_corpus(const TempDir& dir, const std::string& name, int count, uint64_t seed) {
  const std::vector<std::string> subjects = {"the cat", "a dog", "the bird", "my friend"};
  const std::vector<std::string> verbs = {"sees", "likes", "follows"};
  const std::vector<std::string> objects = {"the mat .", "a ball .", "the tree .", "the river ."};
  std::mt19937_64 rng(seed);
  std::ofstream out(dir.file(name));
  for (int d = 0; d < count; ++d) {
    const int sentences = 1 + static_cast<int>(rng() % 3);
    for (int s = 0; s < sentences; ++s)
      out << (s ? " " : "") << subjects[rng() % subjects.size()] << " " << verbs[rng() % verbs.size()] << " "
          << objects[rng() % objects.size()];
    out << "\n\n";
  }
  return dir.file(name);
}

std::vector<nlohmann::json> metrics_of(const std::string& run_dir, const std::string& event) {
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(metrics, line);) {
    auto record = nlohmann::json::parse(line);
    if (record["event"] == event) records.push_back(std::move(record));
  }
  return records;
}

// A model trained from scratch on the corpus in mode lm (word-level vocabulary from the text).
std::string trained_lm_model(const TempDir& dir, const std::string& corpus, std::ostream& log) {
  std::ostringstream yaml;
  yaml << "mode: lm\ntrain_path: " << corpus << "\nval_split: 6\noutput_dir: " << dir.file("lm") << "\n"
       << "model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 3, num_attention_heads: 4,\n"
       << "        num_key_value_heads: 2, max_position_embeddings: 64, tie_word_embeddings: true}\n"
       << "text_window: 16\nnum_epochs: 3\nbatch_size: 4\nlr: 1.0e-2\nseed: 3\nlog_every: 1\n";
  train(train_config_from_yaml_text(yaml.str(), "lm.yaml"), log);
  return dir.file("lm/final");
}

}  // namespace

TEST(TrainLm, PlainTextLearnsEveryTokenAndItsPerplexityIsEvalLms) {
  TempDir dir;
  const auto corpus = write_corpus(dir, "corpus.txt", 40, 1);
  std::ostringstream log;
  const auto final_dir = trained_lm_model(dir, corpus, log);
  EXPECT_NE(log.str().find("34 documents in"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find(", perplexity "), std::string::npos) << log.str();

  const auto validations = metrics_of(dir.file("lm"), "validation");
  ASSERT_EQ(validations.size(), 3u) << log.str();
  for (const auto& record : validations) {
    EXPECT_NEAR(record["val_perplexity"].get<double>(), std::exp(record["val_loss"].get<double>()), 1e-9);
    EXPECT_FALSE(record.contains("accuracy"));  // no questions to answer
  }
  EXPECT_LT(validations.back()["val_loss"].get<double>(), 0.8 * validations.front()["val_loss"].get<double>()) << log.str();

  // No reasoning markers: the vocabulary is the text's words and the word-level specials.
  const auto tokenizer = HfTokenizer::load(final_dir + "/tokenizer.json");
  EXPECT_FALSE(tokenizer->token_to_id(kLatentToken).has_value());
  auto model = load_model(final_dir);
  EXPECT_EQ(model->config().vocab_size, tokenizer->vocab_size());
  EXPECT_EQ(load_reasoning_settings(final_dir).mode, "cot");  // how it is prompted: plain text, no layout

  // The last validation's perplexity, recomputed by eval-lm's scorer on the same packed stream
  // (the last 6 documents, EOS after each) in non-overlapping windows of 16: the same tokens are
  // scored (each window's first goes unscored in both).
  auto documents = load_text_documents(corpus);
  std::vector<int64_t> stream;
  for (size_t d = documents.size() - 6; d < documents.size(); ++d) {
    const auto ids = tokenizer->encode_with_special_tokens(documents[d]);
    stream.insert(stream.end(), ids.begin(), ids.end());
    stream.push_back(model->config().eos_token_ids.front());
  }
  model->eval();
  const auto reference = score_text(model, stream, 16, 16, 3);
  EXPECT_EQ(reference.scored, validations.back()["val_tokens"].get<int64_t>());
  EXPECT_NEAR(reference.perplexity(), validations.back()["val_perplexity"].get<double>(),
              1e-4 * reference.perplexity());
}

TEST(TrainLm, ReasoningDataAndLmModeRefuseEachOther) {
  TempDir dir;
  const auto corpus = write_corpus(dir, "corpus.txt", 8, 1);
  save_coconut_json(dir.file("hops.json"), generate_hops(8, 1, {6, 2, 3}));
  const auto run = [&](const std::string& mode, const std::string& data) {
    std::ostringstream yaml, log;
    yaml << "mode: " << mode << "\ntrain_path: " << data << "\noutput_dir: " << dir.file("run-" + mode) << "\n"
         << "model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 4,\n"
         << "        num_key_value_heads: 2, max_position_embeddings: 64}\nnum_epochs: 1\n";
    try {
      train(train_config_from_yaml_text(yaml.str(), mode + ".yaml"), log);
    } catch (const std::exception& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  EXPECT_NE(run("lm", dir.file("hops.json")).find("mode lm reads plain text"), std::string::npos);
  EXPECT_NE(run("cot", corpus).find("mode: lm"), std::string::npos);
  EXPECT_THROW(train_config_from_yaml_text("mode: lm\ntrain_path: x.txt\nmodel: {hidden_size: 16}\nshuffle_facts: true\n", "y"),
               std::invalid_argument);
  EXPECT_THROW(train_config_from_yaml_text("mode: lm\ntrain_path: x.txt\nmodel: {hidden_size: 16}\ntext_window: 1\n", "y"),
               std::invalid_argument);
}

TEST(HealLm, APrunedModelHealsOnPlainTextWithoutMarkersAndValidatesAtMaxSteps) {
  TempDir dir;
  const auto corpus = write_corpus(dir, "corpus.txt", 40, 1);
  std::ostringstream train_log;
  const auto original = trained_lm_model(dir, corpus, train_log);
  {
    auto model = load_model(original);
    auto pruned = drop_layers(model, {2});
    save_derived_model(pruned, original, dir.file("pruned"));
    // What `coconut prune` writes beside the weights.
    std::ofstream(dir.file("pruned/pruning.json")) << nlohmann::json{{"source", original}, {"dropped_layers", {2}}, {"dropped_heads", ""}};
  }
  const auto healing_text = write_corpus(dir, "healing.txt", 30, 2);
  std::ostringstream yaml, log;
  yaml << "load_model_path: " << dir.file("pruned") << "\ntrain_path: " << healing_text << "\nval_path: " << corpus
       << "\nval_limit: 8\noutput_dir: " << dir.file("healed") << "\ntext_window: 16\nnum_epochs: 4\nbatch_size: 4\n"
       << "lr: 5.0e-3\nlora_rank: 4\nlora_alpha: 8\ndistill_from: " << original << "\nmax_steps: 5\neval_every_steps: 2\n"
       << "log_every: 1\n";
  const auto config = train_config_from_yaml_text(yaml.str(), "heal.yaml");
  EXPECT_EQ(heal_config(config).mode, "lm");  // plain text: the plain next-token loss
  const auto summary = heal(config, log);
  EXPECT_TRUE(summary.stopped_at_max_steps);

  std::vector<int64_t> steps;
  for (const auto& record : metrics_of(dir.file("healed"), "validation")) steps.push_back(record["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 5})) << log.str();
  const auto healed = load_model(summary.final_dir);
  EXPECT_EQ(healed->config().num_hidden_layers, 2);
  EXPECT_EQ(healed->config().vocab_size, load_model(original)->config().vocab_size);  // no marker rows
  EXPECT_FALSE(HfTokenizer::load(summary.final_dir + "/tokenizer.json")->token_to_id(kStartLatentToken).has_value());

  // The adapter ships small: it names the unpruned model as its base and the layer its training
  // copy lacked, and loaded over that base it is the healed model.
  const std::string adapter = summary.final_dir + "/adapter";
  EXPECT_EQ(adapter_dropped_layers(adapter), (std::vector<int64_t>{2}));
  EXPECT_EQ(read_peft_adapter(adapter).base_model, original);
  auto over_base = load_model_variant(original, adapter, torch::kFloat32, torch::kCPU, {}, WeightFormat::kDense);
  auto merged = load_model(summary.final_dir, torch::kFloat32);
  merged->eval();
  const auto ids = torch::tensor({{3, 4, 5, 6, 7, 3}}, torch::kInt64);
  EXPECT_TRUE(torch::allclose(over_base->logits(over_base->forward_ids(ids).hidden), merged->logits(merged->forward_ids(ids).hidden),
                              1e-5, 1e-5));
  // Loaders that cannot remove layers refuse it by name; a base too shallow for the layers it names is an error naming them.
  EXPECT_THROW(load_model_with_adapter(original, adapter), std::invalid_argument);
  try {
    load_model_variant(dir.file("pruned"), adapter, torch::kFloat32, torch::kCPU, {}, WeightFormat::kDense);
    ADD_FAILURE() << "an adapter over a pruned base loaded over the pruned folder";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("coconut.json: dropped_layers"), std::string::npos) << error.what();
  }
}

// A width cut heals the same way: the adapter names the channels its training copy lacked
// (dropped_mlp_channels, the source's indices) and loads over the unpruned model.
TEST(HealLm, AnAdapterOverAWidthCutNamesItsChannelsAndLoadsOverTheUnprunedModel) {
  TempDir dir;
  const auto corpus = write_corpus(dir, "corpus.txt", 40, 1);
  std::ostringstream train_log;
  const auto original = trained_lm_model(dir, corpus, train_log);
  ScoringDataOptions options;
  options.samples = 4;
  options.window = 8;
  auto scoring = load_scoring_data(original, corpus, options);
  PruneRequest request;
  request.mlp_width = 20;  // of 32
  request.channel_metric = "wanda";
  auto pruning = prune_model(scoring, request);
  ASSERT_EQ(pruning.mlp_channels.size(), 3u);
  EXPECT_EQ(pruning.model->config().intermediate_size, 20);
  save_derived_model(pruning.model, original, dir.file("narrow"));
  {  // What `coconut prune` writes beside the weights.
    BasePruning removed;
    removed.mlp_channels = pruning.mlp_channels;
    nlohmann::json report = {{"source", original}, {"dropped_layers", nlohmann::json::array()}, {"dropped_heads", ""}};
    write_base_pruning(report, removed);
    std::ofstream(dir.file("narrow/pruning.json")) << report.dump();
  }
  std::ostringstream yaml, log;
  yaml << "load_model_path: " << dir.file("narrow") << "\ntrain_path: " << corpus << "\noutput_dir: " << dir.file("healed")
       << "\ntext_window: 16\nnum_epochs: 1\nbatch_size: 4\nlr: 5.0e-3\nlora_rank: 4\nlora_alpha: 8\nmax_steps: 2\n";
  const auto summary = heal(train_config_from_yaml_text(yaml.str(), "heal.yaml"), log);
  const std::string adapter = summary.final_dir + "/adapter";
  const auto named = adapter_base_pruning(adapter);
  EXPECT_TRUE(named.layers.empty());
  ASSERT_EQ(named.mlp_channels.size(), 3u);
  EXPECT_EQ(named.mlp_channels.at(1), pruning.mlp_channels.at(1));
  EXPECT_EQ(read_peft_adapter(adapter).base_model, original);
  auto over_base = load_model_variant(original, adapter, torch::kFloat32, torch::kCPU, {}, WeightFormat::kDense);
  auto merged = load_model(summary.final_dir, torch::kFloat32);
  merged->eval();
  EXPECT_EQ(over_base->config().intermediate_size, 20);
  const auto ids = torch::tensor({{3, 4, 5, 6, 7, 3}}, torch::kInt64);
  EXPECT_TRUE(torch::allclose(over_base->logits(over_base->forward_ids(ids).hidden), merged->logits(merged->forward_ids(ids).hidden),
                              1e-5, 1e-5));
  EXPECT_THROW(load_model_with_adapter(original, adapter), std::invalid_argument);  // a loader that cannot prune
  // A base narrower than the channels named: the error names the adapter's key.
  try {
    load_model_variant(dir.file("narrow"), adapter, torch::kFloat32, torch::kCPU, {}, WeightFormat::kDense);
    ADD_FAILURE() << "an adapter over a width cut loaded over the cut folder";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("coconut.json: dropped_mlp_channels"), std::string::npos) << error.what();
  }
}

// A folder that ran on its GGUF file's blocks passes on neither the blocks nor the setting: pruned,
// it runs the file's values re-quantized to Q8_0.
TEST(HealLm, APrunedFolderOfGgufBlocksRunsQ8_0) {
  TempDir dir;
  const auto corpus = write_corpus(dir, "corpus.txt", 8, 1);
  std::ostringstream log;
  const auto original = trained_lm_model(dir, corpus, log);
  ReasoningSettings settings = load_reasoning_settings(original);
  settings.weights = "gguf";
  std::ofstream(original + "/coconut.json") << reasoning_settings_to_json(settings).dump();
  auto model = load_model(original);
  auto pruned = drop_layers(model, {1});
  save_derived_model(pruned, original, dir.file("pruned"));
  EXPECT_EQ(load_reasoning_settings(dir.file("pruned")).weights, "q8_0");
  EXPECT_FALSE(std::filesystem::exists(dir.file("pruned/ggml_blocks.safetensors")));
}

TEST(HealLm, AReasoningModelHealedOnTextKeepsItsLayout) {
  TempDir dir;
  save_coconut_json(dir.file("train.json"), generate_hops(16, 1, {6, 2, 3}));
  std::ostringstream coconut_yaml, coconut_log;
  coconut_yaml << "mode: coconut\ntrain_path: " << dir.file("train.json") << "\noutput_dir: " << dir.file("coconut") << "\n"
               << "model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 2, num_attention_heads: 4,\n"
               << "        num_key_value_heads: 2, max_position_embeddings: 128}\n"
               << "num_epochs: 2\nmax_latent_stage: 1\nbatch_size: 4\nseed: 1\neval_every_epochs: 0\n";
  train(train_config_from_yaml_text(coconut_yaml.str(), "coconut.yaml"), coconut_log);
  // Text in the model's own words (its word-level vocabulary knows them).
  std::ofstream(dir.file("text.txt")) << generate_hops(4, 9, {6, 2, 3})[0].question << "\n\n"
                                      << generate_hops(4, 9, {6, 2, 3})[1].question << "\n";
  std::ostringstream yaml, log;
  yaml << "load_model_path: " << dir.file("coconut/final") << "\ntrain_path: " << dir.file("text.txt") << "\noutput_dir: "
       << dir.file("healed") << "\nnum_epochs: 1\nbatch_size: 2\neval_every_epochs: 0\n";
  const auto summary = heal(train_config_from_yaml_text(yaml.str(), "heal.yaml"), log);
  const auto settings = load_reasoning_settings(summary.final_dir);
  EXPECT_EQ(settings.mode, "coconut");
  EXPECT_EQ(settings.stage, 1);
}

TEST(ScoreLm, LayerAndHeadScoresAndPruningMeasureOnPlainText) {
  TempDir dir;
  const auto corpus = write_corpus(dir, "corpus.txt", 40, 1);
  std::ostringstream log;
  const auto model_dir = trained_lm_model(dir, corpus, log);
  ScoringDataOptions options;
  options.samples = 5;
  options.batch_size = 2;
  options.window = 8;
  auto scoring = load_scoring_data(model_dir, corpus, options);
  EXPECT_TRUE(scoring.plain_text);
  EXPECT_TRUE(scoring.examples.empty());
  ASSERT_EQ(scoring.batches.size(), 3u);  // 5 windows, 2 a batch
  for (const auto& batch : scoring.batches) {
    EXPECT_LE(batch.ids.size(1), 8);
    EXPECT_TRUE(torch::equal(batch.labels.masked_select(batch.attention_mask.to(torch::kBool)),
                             batch.ids.masked_select(batch.attention_mask.to(torch::kBool))));
  }
  // The first windows of the packed corpus, in order.
  const auto tokenizer = HfTokenizer::load(model_dir + "/tokenizer.json");
  const auto windows = text_windows(load_text_documents(corpus), *tokenizer, scoring.special.eos, 8);
  EXPECT_EQ(std::vector<int64_t>(scoring.batches[0].ids[0].data_ptr<int64_t>(), scoring.batches[0].ids[0].data_ptr<int64_t>() + 8),
            windows[0].question);

  PruneRequest request;
  request.drop_block = 1;
  request.layer_score.scores = {LayerScore::kBlockInfluence};
  request.head_fraction = 0.25;
  request.head_granularity = "kv-group";
  auto pruned = prune_model(scoring, request);
  EXPECT_EQ(pruned.layers.size(), 1u);
  EXPECT_EQ(pruned.model->config().num_hidden_layers, 2);
  EXPECT_TRUE(std::isfinite(mean_loss(pruned.model, scoring.batches, torch::kCPU)));

  options.mode = "cot";
  EXPECT_THROW(load_scoring_data(model_dir, corpus, options), std::invalid_argument);
}

// `coconut sweep` on plain text (task: text): every cell's perplexity and mean acc_norm are what
// eval-lm's scorers give on the cell's own model folder, the scores measure on the calibration text,
// healing trains in mode lm, and a second run reuses every cell.
TEST(SweepLm, ATextSweepMeasuresEachVariantAsEvalLmDoes) {
  TempDir dir;
  const auto corpus = write_corpus(dir, "corpus.txt", 40, 1);
  std::ostringstream train_log;
  const auto original = trained_lm_model(dir, corpus, train_log);
  const auto calibration = write_corpus(dir, "calibration.txt", 12, 5);
  const auto test_text = write_corpus(dir, "test.txt", 20, 6);
  {
    std::ofstream choices(dir.file("choices.jsonl"));
    const std::vector<std::string> endings = {"the mat .", "a ball .", "the tree .", "the river ."};
    for (int i = 0; i < 12; ++i)
      choices << nlohmann::json{{"context", (i % 2 ? "a dog likes" : "the cat sees")},
                                {"choices", {endings[i % 4], endings[(i + 1) % 4], endings[(i + 2) % 4]}}, {"label", i % 3}}.dump()
              << "\n";
  }
  std::ostringstream yaml;
  yaml << "output_dir: " << dir.file("sweep") << "\nseed: 2\n"
       << "data: {task: text, train: " << corpus << ", valid: " << calibration << ", test: " << test_text
       << ", test_tokens: 120, window: 16, choices: [" << dir.file("choices.jsonl") << "], choice_items: 10}\n"
       << "models: {lm: {use: " << original << "}}\n"
       << "prune: {models: [lm], layer_scores: [bi, ablation], layers_removed: [1], heal: [false, true], score_samples: 6,\n"
       << "        heal_train: {max_steps: 2, batch_size: 4, lr: 5.0e-3, lora_rank: 2, lora_alpha: 4, eval_every_steps: 0}}\n";
  const auto config = sweep_config_from_yaml_text(yaml.str(), "text.yaml");
  std::ostringstream log;
  const auto cells = run_sweep(config, log);
  ASSERT_EQ(cells.size(), 5u) << log.str();  // full; bi and ablation, each healed and not
  EXPECT_NE(log.str().find("windows of " + calibration), std::string::npos) << log.str();

  // The independent measure: eval-lm's scorers on the folder the cell names, the test text read as
  // eval-lm --text reads it, its first 120 tokens, windows of 16.
  std::ifstream file(test_text, std::ios::binary);
  std::stringstream raw;
  raw << file.rdbuf();
  int healed = 0;
  for (const auto& cell : cells) {
    SCOPED_TRACE(cell.label());
    auto model = load_model(cell.model_dir);
    model->eval();
    const auto tokenizer = HfTokenizer::load(cell.model_dir + "/tokenizer.json");
    auto ids = tokenizer->encode_with_special_tokens(raw.str());
    ids.resize(120);
    EXPECT_NEAR(cell.perplexity, score_text(model, ids, 16, 16, 1).perplexity(), 1e-4 * cell.perplexity);
    int right = 0;
    std::ifstream choices(dir.file("choices.jsonl"));
    std::string line;
    for (int i = 0; i < 10 && std::getline(choices, line); ++i) {
      const auto item = nlohmann::json::parse(line);
      const auto options = item["choices"].get<std::vector<std::string>>();
      const auto scores = score_choices(model, encode_choices(*tokenizer, item["context"], options, model->config().bos_token_ids.empty()
                                                                  ? model->config().eos_token_ids.front() : model->config().bos_token_ids.front()),
                                        64);
      right += argmax_choice_normalized(scores, options) == item["label"].get<int64_t>();
    }
    EXPECT_NEAR(cell.accuracy, right / 10.0, 1e-9);
    EXPECT_EQ(cell.questions, 10);
    EXPECT_EQ(cell.layers, cell.structure == "full" ? 3 : 2);
    EXPECT_GT(cell.flops_per_answer, 0);
    if (cell.healed) {
      ++healed;
      EXPECT_EQ(load_reasoning_settings(cell.model_dir).mode, "cot");  // healed in mode lm: plain text, no layout
      EXPECT_FALSE(HfTokenizer::load(cell.model_dir + "/tokenizer.json")->token_to_id(kStartLatentToken).has_value());
    }
  }
  EXPECT_EQ(healed, 2);
  std::ifstream report(dir.file("sweep/report.md"));
  std::stringstream report_text;
  report_text << report.rdbuf();
  EXPECT_NE(report_text.str().find("pruning measured on plain text"), std::string::npos);
  EXPECT_NE(report_text.str().find("| perplexity | mean acc_norm |"), std::string::npos);

  std::ostringstream again;
  const auto second = run_sweep(config, again);
  EXPECT_NE(again.str().find("5 of 5 cells were finished by an earlier run"), std::string::npos) << again.str();
  ASSERT_EQ(second.size(), cells.size());
  for (size_t i = 0; i < cells.size(); ++i) EXPECT_NEAR(second[i].perplexity, cells[i].perplexity, 1e-4 * cells[i].perplexity);
}
