// The training procedure on a tiny model and the demo task: configuration errors, a resumed run
// reaching the same weights as an uninterrupted one, the NaN guard, and that training learns.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "data/hops.h"
#include "data/prosqa.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "recipes/heal.h"
#include "recipes/step_paths.h"
#include "recipes/train.h"
#include "support/temp_dir.h"

using namespace coconut;
using coconut::testing::TempDir;

namespace {

std::string tiny_yaml(const TempDir& dir, const std::string& mode) {
  save_coconut_json(dir.file("train.json"), generate_hops(24, 1, {6, 2, 3}));
  save_coconut_json(dir.file("val.json"), generate_hops(6, 2, {6, 2, 3}));
  std::ostringstream yaml;
  yaml << "mode: " << mode << "\n"
       << "train_path: " << dir.file("train.json") << "\n"
       << "val_path: " << dir.file("val.json") << "\n"
       << "output_dir: " << dir.file("run") << "\n"
       << "model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 2, num_attention_heads: 4,\n"
       << "        num_key_value_heads: 2, max_position_embeddings: 128, tie_word_embeddings: true}\n"
       << "num_epochs: 3\nepochs_per_stage: 1\nmax_latent_stage: 2\nc_thought: 1\n"
       << "batch_size: 4\ngradient_accumulation_steps: 2\nlr: 3.0e-3\nschedule: cosine\nwarmup_steps: 2\n"
       << "seed: 5\nlog_every: 1\nval_generate_limit: 3\nmax_new_tokens: 8\n";
  return yaml.str();
}

// The tiny YAML without its model block: a run that continues the model of load_model_path.
std::string without_model(std::string yaml) {
  const auto model_begin = yaml.find("model: {"), model_end = yaml.find("}\n", model_begin);
  return yaml.erase(model_begin, model_end + 2 - model_begin);
}

std::map<std::string, torch::Tensor> final_weights(const std::string& run_dir) {
  return read_safetensors(run_dir + "/final/model.safetensors");
}

// Checks that every training record of a run's metrics.jsonl logs `key`: 0 at stage 0 (no
// thoughts), in (0, `below`) at every latent stage; returns how many latent-stage records there were.
int latent_stage_records_logging(const std::string& run_dir, const std::string& key, double below = 1e30) {
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  int logged = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] != "train") continue;
    EXPECT_TRUE(record.contains(key)) << line;
    if (!record.contains(key)) continue;
    if (record["stage"] == 0) {
      EXPECT_EQ(record[key].get<double>(), 0.0) << line;
      continue;
    }
    EXPECT_GT(record[key].get<double>(), 0.0) << line;
    EXPECT_LT(record[key].get<double>(), below) << line;
    ++logged;
  }
  return logged;
}

}  // namespace

TEST(TrainConfig, ReadsYamlAndOverrides) {
  const auto config = train_config_from_yaml_text(
      "mode: coconut\ntrain_path: t.json\ninit: c.json\nc_thought: 2\npad_latent_to_max: true\nlr: 3e-4\n", "x.yaml",
      {"c_thought=3", "name=abc"});
  EXPECT_EQ(config.training_mode(), TrainingMode::kCoconut);
  EXPECT_EQ(config.c_thought, 3);
  EXPECT_TRUE(config.pad_latent_to_max);
  EXPECT_DOUBLE_EQ(config.lr, 3e-4);
  EXPECT_EQ(config.resolved_output_dir(), "runs/abc");
  EXPECT_TRUE(config.uses_stages());
}

TEST(TrainConfig, ErrorsNameTheFileAndTheKey) {
  const std::string base = "train_path: t.json\ninit: c.json\n";
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "lrr: 1\n", "a.yaml"), "a.yaml", "unknown key 'lrr'");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "lr: fast\n", "a.yaml"), "a.yaml", "'lr'", "fast");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "mode: [cot\n", "b.yaml"), "b.yaml", "malformed YAML");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "mode: magic\n", "c.yaml"), "c.yaml", "'mode'", "magic");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "batch_size: 0\n", "d.yaml"), "d.yaml", "'batch_size'");
  EXPECT_THROW_WITH(train_config_from_yaml_text("init: c.json\n", "e.yaml"), "e.yaml", "'train_path'", "missing");
  EXPECT_THROW_WITH(train_config_from_yaml_text("train_path: t.json\n", "f.yaml"), "f.yaml", "no model");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base, "g.yaml", {"lr"}), "override 'lr'", "key=value");
  EXPECT_THROW_WITH(load_train_config("/nonexistent/h.yaml"), "/nonexistent/h.yaml", "cannot open");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "lora_rank: 4\nlora_targets: [q_proj, lm_head]\n", "i.yaml"),
                    "i.yaml", "'lora_targets'", "lm_head");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "lora_rank: -1\n", "j.yaml"), "j.yaml", "'lora_rank'");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "router_only: true\n", "l.yaml"), "l.yaml", "'router_only'", "depth_router");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "depth_router: true\nrouter_penalty: -1\n", "m.yaml"), "m.yaml",
                    "'router_penalty'");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "layer_drop: 1\n", "p.yaml"), "p.yaml", "'layer_drop'", "[0, 1)");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "layer_drop: 0.2\ndepth_router: true\n", "p.yaml"), "p.yaml",
                    "'layer_drop'", "depth_router");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "layer_drop_schedule: steep\n", "p.yaml"), "p.yaml",
                    "'layer_drop_schedule'", "steep");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "prefix_drop: 1.5\n", "p.yaml"), "p.yaml", "'prefix_drop'", "[0, 1]");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "nested_drop: 0.5\n", "p.yaml"), "p.yaml", "'nested_drop_order'", "needs");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "nested_drop: 0.5\nnested_drop_order: [1, 5, 1]\n", "p.yaml"), "p.yaml",
                    "'nested_drop_order'", "listed twice");
  EXPECT_EQ(train_config_from_yaml_text(base + "nested_drop_order: 1,5,3\n", "p.yaml").nested_drop_order,
            (std::vector<int64_t>{1, 5, 3}));
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "prefix_min_layers: -1\n", "p.yaml"), "p.yaml", "'prefix_min_layers'");
  // Values that would reach libtorch's optimizer or device parsing unchecked.
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "beta1: 1\n", "n.yaml"), "n.yaml", "'beta1'", "[0, 1)");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "beta2: -0.5\n", "n.yaml"), "n.yaml", "'beta2'");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "eps: 0\n", "n.yaml"), "n.yaml", "'eps'");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "weight_decay: .nan\n", "n.yaml"), "n.yaml", "'weight_decay'");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "lr: .inf\n", "n.yaml"), "n.yaml", "'lr'");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "init_std: -1\n", "n.yaml"), "n.yaml", "'init_std'");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "device: tpu\n", "n.yaml"), "n.yaml", "'device'", "tpu");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "negation: fused\n", "n.yaml"), "n.yaml", "'negation'",
                    "word_forms");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "word_forms: true\nnegation: after\n", "n.yaml"), "n.yaml",
                    "'negation'", "'after' is not separate, postfix, fused or fused_marked");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "articles: joined\n", "n.yaml"), "n.yaml", "'articles'", "word_forms");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "word_forms: true\narticles: fused\n", "n.yaml"), "n.yaml",
                    "'articles'", "'fused' is not separate, joined or joined_postfix");
  // The model's own keys: a typo is an error, and vocab_size belongs to the tokenizer.
  const std::string fields = "train_path: t.json\nmodel: {hidden_size: 8, intermediate_size: 16, num_hidden_layers: 1, "
                             "num_attention_heads: 2";
  EXPECT_THROW_WITH(train_config_from_yaml_text(fields + ", hiden_size: 4}\n", "o.yaml"), "o.yaml", "model.hiden_size",
                    "unknown key");
  EXPECT_THROW_WITH(train_config_from_yaml_text(fields + ", vocab_size: 99}\n", "o.yaml"), "o.yaml", "model.vocab_size",
                    "tokenizer");
  EXPECT_EQ(train_config_from_yaml_text(base, "k.yaml", {"lora_targets=q_proj,v_proj"}).lora_targets,
            (std::vector<std::string>{"q_proj", "v_proj"}));
  // The distractor curriculum: a probability per epoch, the last for the rest; each in [0, 1].
  const auto dropping = train_config_from_yaml_text(base + "shuffle_facts: true\ndrop_unused_facts: [0.9, 0.5, 0]\n", "p.yaml");
  const Curriculum curriculum = dropping.curriculum();
  EXPECT_DOUBLE_EQ(curriculum.drop_unused_facts_at(0), 0.9);
  EXPECT_DOUBLE_EQ(curriculum.drop_unused_facts_at(1), 0.5);
  EXPECT_DOUBLE_EQ(curriculum.drop_unused_facts_at(2), 0.0);
  EXPECT_DOUBLE_EQ(curriculum.drop_unused_facts_at(40), 0.0);
  EXPECT_EQ(dropping.to_json()["drop_unused_facts"], nlohmann::json({0.9, 0.5, 0.0}));
  const auto overridden = train_config_from_yaml_text(base + "shuffle_facts: true\n", "p.yaml", {"drop_unused_facts=0.9, 0.3"});
  EXPECT_EQ(overridden.drop_unused_facts, (std::vector<double>{0.9, 0.3}));
  EXPECT_DOUBLE_EQ(train_config_from_yaml_text(base + "shuffle_facts: true\ndrop_unused_facts: 0.7\n", "p.yaml")
                       .curriculum()
                       .drop_unused_facts_at(5),
                   0.7);
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "shuffle_facts: true\ndrop_unused_facts: [0.9, 1.5]\n", "q.yaml"),
                    "q.yaml", "'drop_unused_facts'", "[0, 1]");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "shuffle_facts: true\ndrop_unused_facts: [0.9, much]\n", "q.yaml"),
                    "q.yaml", "'drop_unused_facts'", "much");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "shuffle_facts: true\ndrop_unused_facts: []\n", "q.yaml"),
                    "q.yaml", "'drop_unused_facts'", "at least one");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "drop_unused_facts: [0, 0.5]\n", "q.yaml"), "q.yaml",
                    "'drop_unused_facts'", "shuffle_facts");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "mode: coconut\nthought_step_answer: true\n", "r.yaml"), "r.yaml",
                    "'thought_step_answer'", "thought_step_loss > 0");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "mode: coconut\nlatent_bottleneck: 1.5\n", "s.yaml"), "s.yaml",
                    "'latent_bottleneck'", "[0, 1]");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base + "mode: cot\nlatent_bottleneck: 0.5\n", "s.yaml"), "s.yaml",
                    "'latent_bottleneck'", "mode coconut");
  EXPECT_DOUBLE_EQ(train_config_from_yaml_text(base + "mode: coconut\nlatent_bottleneck: 0.5\n", "s.yaml").latent_bottleneck, 0.5);
}

TEST(Train, ResumedRunReachesTheSameWeights) {
  TempDir straight_dir, resumed_dir;
  std::ostringstream log;
  // max_steps also ends the cosine schedule, so the stop that stands for a kill falls inside the
  // warm-up (6 steps), where the learning rate does not depend on where the schedule ends.
  const auto straight = train(train_config_from_yaml_text(tiny_yaml(straight_dir, "coconut"), "straight", {"warmup_steps=6"}), log);
  ASSERT_FALSE(straight.final_dir.empty());
  // Killed after 5 optimizer steps (mid-epoch 2, inside the latent stages), then resumed.
  const std::string yaml = tiny_yaml(resumed_dir, "coconut");
  const auto first = train(train_config_from_yaml_text(yaml, "first", {"max_steps=5", "warmup_steps=6"}), log);
  EXPECT_TRUE(first.stopped_at_max_steps);
  EXPECT_EQ(first.steps, 5);
  // A run stopped by max_steps is a model too: final/ beside the checkpoint it resumes from.
  EXPECT_EQ(first.final_dir, resumed_dir.file("run/final"));
  EXPECT_FALSE(final_weights(resumed_dir.file("run")).empty());
  const auto resumed = train(train_config_from_yaml_text(yaml, "resumed", {"resume=true", "warmup_steps=6"}), log);
  EXPECT_EQ(resumed.steps, straight.steps);
  const auto expected = final_weights(straight_dir.file("run"));
  const auto actual = final_weights(resumed_dir.file("run"));
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [name, tensor] : expected) {
    ASSERT_TRUE(actual.count(name)) << name;
    EXPECT_TRUE(torch::equal(tensor, actual.at(name))) << name << " differs after resume";
  }
  // The metrics of the resumed run continue those of the first part without duplicates.
  std::ifstream metrics(resumed_dir.file("run/metrics.jsonl"));
  std::string line;
  int64_t last_step = 0;
  while (std::getline(metrics, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] != "train") continue;
    EXPECT_GT(record["step"].get<int64_t>(), last_step);
    last_step = record["step"].get<int64_t>();
  }
  EXPECT_EQ(last_step, straight.steps);
}

namespace {

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace

// Resume trusts nothing it reads: impossible states, a pointer out of the run's folder, a
// truncated optimizer state are errors naming the file; a finished run does nothing.
TEST(Train, ResumeRefusesImpossibleStatesAndForeignCheckpoints) {
  TempDir dir;
  std::ostringstream log;
  const std::string yaml = tiny_yaml(dir, "cot");
  train(train_config_from_yaml_text(yaml, "first", {"max_steps=3"}), log);
  const std::string run = dir.file("run");
  std::string name;
  std::getline(std::ifstream(run + "/last_checkpoint"), name);
  ASSERT_EQ(name, "checkpoint-3");
  const std::string state_path = run + "/" + name + "/trainer_state.json";
  const auto good_state = read_json_file(state_path);
  const auto resume = [&] { return train(train_config_from_yaml_text(yaml, "resumed", {"resume=true"}), log); };
  const auto with_state = [&](const std::string& key, int64_t value) {
    auto state = good_state;
    state[key] = value;
    write_text(state_path, state.dump());
  };
  with_state("next_batch", -4);
  EXPECT_THROW_WITH(resume(), state_path, "impossible trainer state", "negative batch index -4");
  with_state("global_step", -1);
  EXPECT_THROW_WITH(resume(), state_path, "negative step");
  with_state("epoch", 7);
  EXPECT_THROW_WITH(resume(), state_path, "epoch 7 is past num_epochs 3");
  with_state("next_batch", 1000);
  EXPECT_THROW_WITH(resume(), state_path, "batch 1000 is past the epoch's");
  with_state("global_step", int64_t{1} << 62);
  EXPECT_THROW_WITH(resume(), state_path, "cannot be reached");
  write_text(state_path, good_state.dump());

  // last_checkpoint naming anything but a checkpoint-<step> folder of this run.
  for (const std::string& pointer : {dir.file("elsewhere"), "../run/" + name, std::string("checkpoint-3/../checkpoint-3")}) {
    write_text(run + "/last_checkpoint", pointer + "\n");
    EXPECT_THROW_WITH(resume(), run + "/last_checkpoint", "not a checkpoint-<step> folder");
  }
  write_text(run + "/last_checkpoint", name + "\n");

  // A truncated optimizer state is found before training starts.
  const std::string optimizer = run + "/" + name + "/optimizer.pt";
  const auto size = std::filesystem::file_size(optimizer);
  std::filesystem::resize_file(optimizer, size / 2);
  EXPECT_THROW_WITH(resume(), optimizer, "unreadable optimizer state");
}

// val_split: the last N training examples become the validation set and leave training, so a test
// file never has to serve as validation.
TEST(Train, ValSplitHoldsOutTheLastTrainingExamples) {
  TempDir dir;
  std::ostringstream log;
  std::string yaml = tiny_yaml(dir, "cot");
  const std::string val_line = "val_path: " + dir.file("val.json") + "\n";
  yaml.replace(yaml.find(val_line), val_line.size(), "val_split: 12\n");
  // 24 examples, 12 held out: 12 / (batch 4 x accumulation 2) -> 2 optimizer steps per epoch (3 with all 24).
  const auto held_out = train(train_config_from_yaml_text(yaml, "split", {"num_epochs=1"}), log);
  EXPECT_EQ(held_out.steps, 2);
  EXPECT_NE(log.str().find("validation"), std::string::npos) << log.str();
  EXPECT_THROW_WITH(train(train_config_from_yaml_text(yaml, "split", {"val_split=24"}), log), dir.file("train.json"),
                    "val_split 24 leaves no training examples");
  EXPECT_THROW_WITH(train_config_from_yaml_text(yaml + val_line, "both.yaml"), "both.yaml", "'val_split'", "not both");
}

TEST(Train, AFinishedRunResumedDoesNothing) {
  TempDir dir;
  std::ostringstream log;
  const std::string yaml = tiny_yaml(dir, "cot");
  const auto stopped = train(train_config_from_yaml_text(yaml, "first", {"max_steps=3"}), log);
  ASSERT_TRUE(stopped.stopped_at_max_steps);
  // Resumed with the same max_steps: no further step (it used to train one more on every resume).
  std::ostringstream again;
  const auto resumed = train(train_config_from_yaml_text(yaml, "again", {"max_steps=3", "resume=true"}), again);
  EXPECT_EQ(resumed.steps, 3);
  EXPECT_NE(again.str().find("nothing to do"), std::string::npos) << again.str();
  EXPECT_FALSE(std::filesystem::exists(dir.file("run/checkpoint-4")));
  // Trained to the end, then resumed: nothing to do, the final model untouched.
  const auto finished = train(train_config_from_yaml_text(yaml, "rest", {"resume=true"}), log);
  ASSERT_FALSE(finished.final_dir.empty());
  const auto before = std::filesystem::last_write_time(dir.file("run/final/model.safetensors"));
  std::ostringstream done;
  const auto after = train(train_config_from_yaml_text(yaml, "done", {"resume=true"}), done);
  EXPECT_EQ(after.steps, finished.steps);
  EXPECT_EQ(after.final_dir, finished.final_dir);
  EXPECT_NE(done.str().find("nothing to do"), std::string::npos) << done.str();
  EXPECT_EQ(std::filesystem::last_write_time(dir.file("run/final/model.safetensors")), before);
}

// An absurd learning rate: the weights turn non-finite after the first steps (caught before they
// are saved, although the loss that step was still finite); a later step would show a NaN loss.
TEST(Train, StopsOnNonFiniteWeightsOrLossAndKeepsTheLastCheckpoint) {
  TempDir dir;
  std::ostringstream log;
  const auto config = train_config_from_yaml_text(tiny_yaml(dir, "cot"), "nan.yaml",
                                                  {"lr=1.0e+30", "max_grad_norm=0", "save_every_steps=1",
                                                   "warmup_steps=0", "schedule=constant", "gradient_accumulation_steps=1"});
  std::string checkpoint;
  {
    std::ifstream pointer;  // read after the failure: the last good checkpoint the message names
    EXPECT_THROW_WITH(train(config, log), "is no longer finite; stopped without saving", "last good checkpoint is");
    pointer.open(dir.file("run/last_checkpoint"));
    std::getline(pointer, checkpoint);
  }
  ASSERT_FALSE(checkpoint.empty());
  // The good checkpoint is intact and loadable, and nothing was written after it.
  const auto state = read_json_file(dir.file("run/" + checkpoint + "/trainer_state.json"));
  EXPECT_EQ("checkpoint-" + std::to_string(state["global_step"].get<int64_t>()), checkpoint);
  EXPECT_NO_THROW(read_safetensors(dir.file("run/" + checkpoint + "/model.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("run/final")));
}

// A step never reads the device: a non-finite loss is found at the next log step or save, which
// names the step it first happened at and stops before anything is written. Here the only read
// before a save is the epoch's end (log_every past it, no checkpoints in between).
TEST(Train, ANonFiniteLossFoundLaterStopsBeforeAnythingIsSaved) {
  TempDir dir;
  std::ostringstream log;
  const auto config = train_config_from_yaml_text(tiny_yaml(dir, "cot"), "nan.yaml",
                                                  {"lr=1.0e+30", "max_grad_norm=0", "save_every_steps=0", "log_every=1000",
                                                   "warmup_steps=0", "schedule=constant", "gradient_accumulation_steps=1"});
  try {
    train(config, log);
    FAIL() << "training went on with a non-finite loss";
  } catch (const TrainingDiverged& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("the loss is not finite; stopped without saving"), std::string::npos) << message;
    EXPECT_NE(message.find("no checkpoint was written yet"), std::string::npos) << message;
    // The step named is the first non-finite one (step 1 used finite weights), not the epoch's last.
    const int64_t step = std::stoll(message.substr(message.find("step ") + 5));
    EXPECT_GE(step, 2) << message;
    EXPECT_LT(step, 6) << message;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("run/final")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("run/last_checkpoint")));
}

TEST(Train, CotLossFallsAndTheFinalFolderDescribesTheModel) {
  TempDir dir;
  std::ostringstream log;
  const auto config = train_config_from_yaml_text(tiny_yaml(dir, "cot"), "learn.yaml", {"num_epochs=12", "lr=1.0e-2", "gradient_accumulation_steps=1"});
  const auto summary = train(config, log);
  std::ifstream metrics(dir.file("run/metrics.jsonl"));
  std::string line;
  std::vector<double> losses;
  while (std::getline(metrics, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "train") losses.push_back(record["loss"].get<double>());
  }
  ASSERT_GE(losses.size(), 6u);
  EXPECT_LT(losses.back(), 0.75 * losses.front()) << log.str();
  EXPECT_TRUE(summary.last_validation.contains("accuracy"));
  const auto settings = load_reasoning_settings(summary.final_dir);
  EXPECT_EQ(settings.mode, "cot");
  EXPECT_NE(log.str().find("tok/s"), std::string::npos);
  EXPECT_NE(log.str().find("ETA"), std::string::npos);
}

TEST(Train, Bf16AutocastTracksFloat32) {
  const auto first_loss = [](const std::string& yaml, const std::string& run_dir, const std::vector<std::string>& overrides) {
    std::ostringstream log;
    train(train_config_from_yaml_text(yaml, "bf16.yaml", overrides), log);
    std::ifstream metrics(run_dir + "/metrics.jsonl");
    std::string line;
    std::getline(metrics, line);
    return nlohmann::json::parse(line)["loss"].get<double>();
  };
  TempDir f32_dir, bf16_dir;
  const double f32 = first_loss(tiny_yaml(f32_dir, "coconut"), f32_dir.file("run"), {"max_steps=1", "max_latent_stage=1"});
  const double bf16 =
      first_loss(tiny_yaml(bf16_dir, "coconut"), bf16_dir.file("run"), {"max_steps=1", "max_latent_stage=1", "bf16=true"});
  EXPECT_NEAR(bf16, f32, 0.02 * f32);  // bf16 products, float32 accumulation and weights
  EXPECT_NE(bf16, f32);                // and autocast really ran
}

TEST(Train, EveryModeTrainsValidatesAndSavesItsSettings) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> modes = {
      {"no_cot", {}}, {"cot", {}}, {"coconut", {"uniform_prob=0.5"}}, {"no_thoughts", {}},
      {"pause_as_thought", {}}, {"pause", {"pause_tokens=2"}},
      {"icot", {"remove_per_epoch=2", "removal_smoothing_lambda=1.0"}}};
  for (const auto& [mode, extra] : modes) {
    TempDir dir;
    std::ostringstream log;
    std::vector<std::string> overrides = {"num_epochs=2", "log_every=1"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    const auto summary = train(train_config_from_yaml_text(tiny_yaml(dir, mode), mode + ".yaml", overrides), log);
    {
      std::ifstream metrics(dir.file("run") + "/metrics.jsonl");
      std::string line;
      std::vector<double> losses;
      while (std::getline(metrics, line)) {
        const auto record = nlohmann::json::parse(line);
        if (record["event"] == "train") losses.push_back(record["loss"].get<double>());
      }
      // Six steps from a random init (lr 3e-3, cosine): measured drops from first to last logged
      // loss 0.15-0.24 (from ~2.98) in every mode, step-to-step noise ~0.02; 0.05 is a third of
      // the smallest drop. A mode whose updates do not reach the weights stays within noise.
      ASSERT_GE(losses.size(), 6u) << mode;
      EXPECT_LT(losses.back(), losses.front() - 0.05) << mode << ": the loss did not fall";
    }
    EXPECT_TRUE(summary.last_validation.contains("accuracy")) << mode;
    EXPECT_TRUE(std::isfinite(summary.last_validation["val_loss"].get<double>())) << mode;
    EXPECT_EQ(load_reasoning_settings(summary.final_dir).mode, mode);
  }
}

TEST(Train, AutoThoughtRmsIsTheEmbeddingsMeanRmsAndIsSavedAndKept) {
  TempDir dir;
  std::ostringstream log;
  const auto yaml = tiny_yaml(dir, "coconut");
  // A model without a scale (one epoch of training), then a run from it that measures "auto": the
  // scale is that of the table it starts from, measured here independently before its first step.
  auto base = train_config_from_yaml_text(yaml, "b.yaml", {"num_epochs=1"});
  base.output_dir = dir.file("base");
  const auto base_dir = train(base, log).final_dir;
  ASSERT_LE(load_config(base_dir + "/config.json").latent_thought_rms, 0.0);
  const auto table = read_safetensors(base_dir + "/model.safetensors").at("model.embed_tokens.weight").to(torch::kFloat64);  // [V, D]
  const double mean_rms = table.square().mean(1).sqrt().mean().item<double>();  // mean over rows of rms(row)
  const auto first = train(train_config_from_yaml_text(without_model(yaml), "r.yaml",
                                                       {"num_epochs=1", "latent_thought_rms=auto", "load_model_path=" + base_dir}),
                           log);
  const double saved = load_config(first.final_dir + "/config.json").latent_thought_rms;
  // float32 mean of float32 row RMSs (training) against float64 here: relative 1e-7 for 30-odd
  // rows; 1e-6 relative. The init std (0.02) differs from the table's 0.0194 by 3%.
  EXPECT_NEAR(saved, mean_rms, 1e-6 * mean_rms);
  EXPECT_NE(log.str().find("thoughts rescaled to RMS"), std::string::npos);
  // A run that continues from that model keeps its scale ("auto" measures only a model without one)...
  auto again = train_config_from_yaml_text(yaml, "s.yaml", {"num_epochs=1", "latent_thought_rms=auto"});
  again.model = nlohmann::json::object();
  again.load_model_path = first.final_dir;
  again.output_dir = dir.file("again");
  EXPECT_EQ(load_config(train(again, log).final_dir + "/config.json").latent_thought_rms, saved);
  // ... and a number sets it; a bad value is named.
  auto fixed = again;
  fixed.output_dir = dir.file("fixed");
  fixed.latent_thought_rms = 0.25;
  EXPECT_EQ(load_config(train(fixed, log).final_dir + "/config.json").latent_thought_rms, 0.25);
  EXPECT_THROW_WITH(train_config_from_yaml_text(yaml, "t.yaml", {"latent_thought_rms=-2"}), "t.yaml", "latent_thought_rms");
  EXPECT_THROW_WITH(train_config_from_yaml_text(yaml, "t.yaml", {"latent_thought_rms=big"}), "latent_thought_rms", "'big'");
}

TEST(Train, ExpectedEmbeddingThoughtsAreSavedKeptAndNamedWhenWrong) {
  TempDir dir;
  std::ostringstream log;
  const auto yaml = tiny_yaml(dir, "coconut");
  const auto first =
      train(train_config_from_yaml_text(yaml, "r.yaml", {"num_epochs=1", "latent_thought_input=expected_embedding"}), log);
  EXPECT_EQ(load_config(first.final_dir + "/config.json").latent_thought_input, "expected_embedding");
  EXPECT_NE(log.str().find("thoughts fed back as expected embeddings"), std::string::npos);
  // A continuation without the key keeps the model's; with it, the key wins.
  auto again = train_config_from_yaml_text(yaml, "s.yaml", {"num_epochs=1"});
  again.model = nlohmann::json::object();
  again.load_model_path = first.final_dir;
  again.output_dir = dir.file("again");
  EXPECT_EQ(load_config(train(again, log).final_dir + "/config.json").latent_thought_input, "expected_embedding");
  again.output_dir = dir.file("back");
  again.latent_thought_input = "last_hidden";
  EXPECT_EQ(load_config(train(again, log).final_dir + "/config.json").latent_thought_input, "last_hidden");
  EXPECT_THROW_WITH(train_config_from_yaml_text(yaml, "t.yaml", {"latent_thought_input=soft"}), "t.yaml",
                    "latent_thought_input", "'soft'");
}

TEST(Train, StepSupervisionIsLoggedAndOnlyForThoughtModes) {
  TempDir dir;
  std::ostringstream log;
  const auto summary = train(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "s.yaml",
                                                         {"num_epochs=2", "thought_step_loss=0.5"}), log);
  EXPECT_NE(log.str().find("step-decoding"), std::string::npos);
  // Stage 0 has no thoughts to decode; stage 1 decodes one step per question (uniform_prob 0).
  EXPECT_GT(latent_stage_records_logging(dir.file("run"), "thought_step_loss"), 0);
  EXPECT_EQ(load_config(summary.final_dir + "/config.json").hidden_size, 16);
  // pause_as_thought decodes the steps from what each pause column's source state would feed back.
  const auto paused = train(train_config_from_yaml_text(tiny_yaml(dir, "pause_as_thought"), "p.yaml",
                                                        {"num_epochs=2", "thought_step_loss=0.5", "output_dir=" + dir.file("paused")}),
                            log);
  EXPECT_FALSE(paused.final_dir.empty());
  EXPECT_GT(latent_stage_records_logging(dir.file("paused"), "thought_step_loss"), 0);
  EXPECT_THROW_WITH(train_config_from_yaml_text(tiny_yaml(dir, "cot"), "t.yaml", {"thought_step_loss=1"}), "t.yaml",
                    "thought_step_loss", "mode coconut or pause_as_thought");
  EXPECT_THROW_WITH(train_config_from_yaml_text(tiny_yaml(dir, "pause_as_thought"), "t.yaml",
                                                {"thought_step_loss=1", "thought_step_answer=true"}),
                    "t.yaml", "thought_step_answer", "mode coconut");
  EXPECT_THROW_WITH(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "t.yaml", {"thought_step_loss=-1"}), "t.yaml",
                    "thought_step_loss");
}

TEST(Train, ReachableSetSupervisionNeedsGraphsAndIsLogged) {
  TempDir dir;
  std::ostringstream log;
  // Without graphs in the data (the hops task) the key is refused, naming the file.
  EXPECT_THROW_WITH(train(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "s.yaml", {"thought_reachable_loss=1"}), log),
                    "s.yaml", "thought_reachable_loss", dir.file("train.json"), "graph");
  EXPECT_THROW_WITH(train_config_from_yaml_text(tiny_yaml(dir, "cot"), "t.yaml", {"thought_reachable_loss=1"}), "t.yaml",
                    "thought_reachable_loss", "mode coconut or pause_as_thought");
  EXPECT_THROW_WITH(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "t.yaml", {"thought_reachable_loss=-1"}),
                    "t.yaml", "thought_reachable_loss");
  // Per-thought weights: a list (YAML or "4,1"), each finite and >= 0, only with the loss on.
  const auto weighted = train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "t.yaml",
                                                    {"thought_reachable_loss=1", "thought_reachable_weights=4, 1"});
  EXPECT_EQ(weighted.thought_reachable_weights, (std::vector<double>{4, 1}));
  EXPECT_EQ(weighted.to_json()["thought_reachable_weights"], nlohmann::json({4.0, 1.0}));
  EXPECT_THROW_WITH(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "t.yaml", {"thought_reachable_weights=4,1"}),
                    "t.yaml", "thought_reachable_weights", "thought_reachable_loss > 0");
  EXPECT_THROW_WITH(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "t.yaml",
                                                {"thought_reachable_loss=1", "thought_reachable_weights=4,-1"}),
                    "t.yaml", "thought_reachable_weights", ">= 0");
  EXPECT_THROW_WITH(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "t.yaml",
                                                {"thought_reachable_loss=1", "thought_reachable_weights=4,x"}),
                    "override", "thought_reachable_weights", "'x'");
  EXPECT_TRUE(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "t.yaml",
                                          {"thought_reachable_loss=1", "thought_reachable_start=root"})
                  .curriculum()
                  .reachable_from_root);
  EXPECT_FALSE(weighted.curriculum().reachable_from_root);
  EXPECT_THROW_WITH(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "t.yaml", {"thought_reachable_start=root"}),
                    "t.yaml", "thought_reachable_start", "thought_reachable_loss > 0");
  EXPECT_THROW_WITH(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "t.yaml",
                                                {"thought_reachable_loss=1", "thought_reachable_start=leaves"}),
                    "t.yaml", "thought_reachable_start", "'leaves'");
  // ProsQA-shaped data: every latent stage pays it.
  ProsqaOptions small;  // short questions for the tiny model's 128 positions
  small.min_concepts = 6;
  small.max_concepts = 7;
  small.min_steps = 2;
  small.max_steps = 3;
  small.people = 2;
  save_coconut_json(dir.file("graphs.json"), generate_prosqa(16, 4, small));
  save_coconut_json(dir.file("graphs_val.json"), generate_prosqa(4, 5, small));
  const auto summary = train(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "s.yaml",
                                                         {"num_epochs=2", "thought_reachable_loss=0.5", "max_latent_stage=3",
                                                          "train_path=" + dir.file("graphs.json"),
                                                          "val_path=" + dir.file("graphs_val.json")}),
                             log);
  EXPECT_FALSE(summary.final_dir.empty());
  EXPECT_NE(log.str().find("reachable"), std::string::npos);
  // At least -log(mass on the set) > 0, and no more than -log of a random model's share of it.
  EXPECT_GT(latent_stage_records_logging(dir.file("run"), "thought_reachable_loss", 10.0), 0);
  // pause_as_thought pays it too, on the states before its pause tokens.
  const auto paused = train(train_config_from_yaml_text(tiny_yaml(dir, "pause_as_thought"), "p.yaml",
                                                        {"num_epochs=2", "thought_reachable_loss=0.5", "max_latent_stage=3",
                                                         "output_dir=" + dir.file("paused"),
                                                         "train_path=" + dir.file("graphs.json"),
                                                         "val_path=" + dir.file("graphs_val.json")}),
                            log);
  EXPECT_FALSE(paused.final_dir.empty());
  EXPECT_GT(latent_stage_records_logging(dir.file("paused"), "thought_reachable_loss", 10.0), 0);
}

TEST(Train, DepthRouterLearnsToSkipLayersUnderItsPenalty) {
  TempDir dir;
  std::ostringstream log;
  const std::string yaml = tiny_yaml(dir, "coconut");
  const auto base = train(train_config_from_yaml_text(yaml, "base.yaml", {"num_epochs=2", "log_every=100"}), log);
  // Only the gates learn, pushed hard towards skipping (the model comes from load_model_path).
  const auto routed = heal(train_config_from_yaml_text(
      without_model(yaml), "router.yaml",
      {"load_model_path=" + base.final_dir, "output_dir=" + dir.file("routed"), "depth_router=true", "router_only=true",
       "router_penalty=20", "router_init_bias=1", "lr=5.0e-2", "router_lr_scale=1", "num_epochs=3", "warmup_steps=0"}), log);
  EXPECT_TRUE(load_config(routed.final_dir + "/config.json").depth_router);
  std::vector<double> fractions;
  std::ifstream metrics(dir.file("routed/metrics.jsonl"));
  std::string line;
  while (std::getline(metrics, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record.contains("router_layer_fraction")) fractions.push_back(record["router_layer_fraction"].get<double>());
  }
  ASSERT_GE(fractions.size(), 4u);
  EXPECT_GT(fractions.front(), 0.6);  // sigmoid(1) = 0.73 at the start
  EXPECT_LT(fractions.back(), fractions.front() - 0.2) << log.str();
  // The model itself is untouched.
  const auto before = final_weights(dir.file("run"));
  const auto after = final_weights(dir.file("routed"));
  size_t compared = 0;
  for (const auto& [name, tensor] : after) {
    if (name.find(".router.") != std::string::npos) continue;
    ASSERT_TRUE(before.count(name)) << name;
    EXPECT_TRUE(torch::equal(before.at(name), tensor)) << name;
    ++compared;
  }
  EXPECT_EQ(compared, before.size());
}

// The router's training noise comes from a generator seeded per micro-batch by the run: two runs
// give the same weights whatever else drew from libtorch's default generator before them (a sweep
// trains many models in one process; `coconut sweep` gave a different router on every run before),
// and so does a run stopped and resumed (inside the warm-up: max_steps also ends the schedule).
TEST(Train, DepthRouterTrainingIsReproducibleAndResumes) {
  TempDir dir;
  std::ostringstream log;
  const std::string yaml = tiny_yaml(dir, "coconut");
  const auto base = train(train_config_from_yaml_text(yaml, "base.yaml", {"num_epochs=1", "log_every=100"}), log);
  const auto routed = [&](const std::string& name, std::vector<std::string> overrides) {
    overrides.insert(overrides.end(), {"load_model_path=" + base.final_dir, "output_dir=" + dir.file(name), "depth_router=true",
                                       "router_penalty=1", "router_init_bias=1", "num_epochs=2", "warmup_steps=4"});
    return heal(train_config_from_yaml_text(without_model(yaml), name + ".yaml", overrides), log);
  };
  torch::rand({1000});
  const auto first = routed("first", {});
  torch::rand({777});
  routed("second", {});
  ASSERT_TRUE(routed("resumed", {"max_steps=3"}).stopped_at_max_steps);
  torch::rand({55});
  EXPECT_EQ(routed("resumed", {"resume=true"}).steps, first.steps);
  const auto expected = final_weights(dir.file("first"));
  for (const std::string run : {"second", "resumed"}) {
    const auto actual = final_weights(dir.file(run));
    ASSERT_EQ(actual.size(), expected.size()) << run;
    for (const auto& [name, tensor] : expected) EXPECT_TRUE(torch::equal(tensor, actual.at(name))) << run << ": " << name << " differs";
  }
}

// negation_offset_init: every fused "not~X" starts as "X" plus one shared vector (the same for
// every property), read back from the saved model after one step at lr 1e-12 (nothing moves).
TEST(TrainNegationOffset, FusedTokensStartAsTheirWordPlusOneSharedVector) {
  TempDir dir;
  std::ostringstream yaml;
  yaml << "mode: cot\ntrain_path: " << COCONUT_SOURCE_DIR << "/data/prontoqa/valid.json\ntrain_limit: 40\n"
       << "output_dir: " << dir.file("run") << "\nword_forms: true\nnegation: fused_marked\n"
       << "model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2,\n"
       << "        max_position_embeddings: 512, tie_word_embeddings: true}\n"
       << "num_epochs: 1\nbatch_size: 8\nlr: 1.0e-12\nweight_decay: 0\nseed: 3\nmax_steps: 1\neval_every_epochs: 0\n";
  std::ostringstream log;
  auto config = train_config_from_yaml_text(yaml.str() + "negation_offset_init: true\n", "n.yaml");
  train(config, log);
  const auto table = read_safetensors(dir.file("run/checkpoint-1/model.safetensors")).at("model.embed_tokens.weight");
  const auto vocab = read_json_file(dir.file("run/checkpoint-1/tokenizer.json"))["model"]["vocab"];
  torch::Tensor shared;
  int pairs = 0;
  for (const auto& [token, id] : vocab.items()) {
    if (token.rfind("not~", 0) != 0 || !vocab.contains(token.substr(4))) continue;
    const auto offset = table[id.get<int64_t>()] - table[vocab[token.substr(4)].get<int64_t>()];
    if (!shared.defined()) shared = offset;
    EXPECT_TRUE(torch::allclose(offset, shared, 0, 1e-6)) << token;
    ++pairs;
  }
  EXPECT_GT(pairs, 10);
  EXPECT_GT(shared.norm().item<double>(), 0.01);  // a real vector, not zero
  // Refused where no fused tokens exist.
  EXPECT_THROW_WITH(train_config_from_yaml_text(yaml.str() + "negation_offset_init: true\n", "n.yaml", {"negation=separate"}),
                    "n.yaml", "'negation_offset_init'", "fused");
}

// The same option on a trained model (load_model_path): its "not~X" rows are replaced by its "X" rows
// plus one shared vector at the scale of the table's rows; every other row is kept.
TEST(TrainNegationOffset, ALoadedModelGetsTheOffsetAtItsOwnScale) {
  TempDir dir;
  std::ostringstream yaml;
  yaml << "mode: cot\ntrain_path: " << COCONUT_SOURCE_DIR << "/data/prontoqa/valid.json\ntrain_limit: 40\n"
       << "word_forms: true\nnegation: fused_marked\n"
       << "num_epochs: 1\nbatch_size: 8\nweight_decay: 0\nseed: 3\nmax_steps: 1\neval_every_epochs: 0\n";
  const std::string model = "model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2,\n"
                            "        max_position_embeddings: 512, tie_word_embeddings: true}\n";
  std::ostringstream log;
  auto first = train_config_from_yaml_text(yaml.str() + model + "lr: 0.5\ninit_std: 0.3\noutput_dir: " + dir.file("a") + "\n", "a.yaml");
  train(first, log);
  auto second = train_config_from_yaml_text(yaml.str() + "lr: 1.0e-12\nnegation_offset_init: true\nload_model_path: " +
                                                dir.file("a/checkpoint-1") + "\noutput_dir: " + dir.file("b") + "\n", "b.yaml");
  train(second, log);
  const auto before = read_safetensors(dir.file("a/checkpoint-1/model.safetensors")).at("model.embed_tokens.weight");
  const auto after = read_safetensors(dir.file("b/checkpoint-1/model.safetensors")).at("model.embed_tokens.weight");
  const auto vocab = read_json_file(dir.file("b/checkpoint-1/tokenizer.json"))["model"]["vocab"];
  const double rms = before.pow(2).mean().sqrt().item<double>();
  torch::Tensor shared;
  std::set<int64_t> negated;
  for (const auto& [token, id] : vocab.items()) {
    if (token.rfind("not~", 0) != 0 || !vocab.contains(token.substr(4))) continue;
    const auto offset = after[id.get<int64_t>()] - before[vocab[token.substr(4)].get<int64_t>()];
    if (!shared.defined()) shared = offset;
    EXPECT_TRUE(torch::allclose(offset, shared, 0, 1e-5)) << token;
    negated.insert(id.get<int64_t>());
  }
  EXPECT_GT(negated.size(), 10u);
  // n ~ N(0, rms^2) per element: its own RMS within 50% of the table's (16 elements).
  const double shared_rms = shared.pow(2).mean().sqrt().item<double>();
  EXPECT_GT(shared_rms, 0.5 * rms);
  EXPECT_LT(shared_rms, 1.5 * rms);
  for (int64_t id = 0; id < before.size(0); ++id) {
    if (!negated.count(id)) {
      EXPECT_TRUE(torch::allclose(after[id], before[id], 0, 1e-6)) << id;
    }
  }
}

// The stochastic-depth mask: layer_drop alone never drops the first layer; prefix_drop 1 makes every
// row a prefix of K layers, K in [prefix_min_layers, L - 1] (each depth drawn), and 0.5 about half
// of the rows; both together drop within the prefix too.
TEST(Train, StochasticDepthMaskDrawsPrefixes) {
  TrainConfig config;
  torch::manual_seed(3);
  config.prefix_drop = 1.0;
  config.prefix_min_layers = 3;
  const auto prefixes = stochastic_depth_keep(4000, 8, config, torch::kCPU);  // [4000, 8]
  const auto kept = prefixes.sum(1);                                           // [4000]
  EXPECT_TRUE(torch::equal(prefixes, torch::arange(8).view({1, 8}) < kept.view({-1, 1})));  // prefixes
  for (int64_t depth = 3; depth <= 7; ++depth) EXPECT_GT(kept.eq(depth).sum().item<int64_t>(), 600) << depth;
  EXPECT_EQ(kept.lt(3).sum().item<int64_t>() + kept.gt(7).sum().item<int64_t>(), 0);
  config.prefix_min_layers = 0;  // ceil(L / 2)
  EXPECT_EQ(stochastic_depth_keep(4000, 7, config, torch::kCPU).sum(1).min().item<int64_t>(), 4);
  config.prefix_drop = 0.5;
  const double shallow = stochastic_depth_keep(4000, 8, config, torch::kCPU).sum(1).lt(8).to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(shallow, 0.5, 0.05);
  config.layer_drop = 0.25;
  config.layer_drop_schedule = "flat";
  const auto both = stochastic_depth_keep(4000, 8, config, torch::kCPU);
  EXPECT_TRUE(both.select(1, 0).all().item<bool>());
  EXPECT_NEAR(both.select(1, 2).to(torch::kFloat64).mean().item<double>(), 0.75, 0.04);  // layer 2 is in every prefix
  config.prefix_drop = 0;
  config.layer_drop = 0;
  EXPECT_TRUE(stochastic_depth_keep(5, 8, config, torch::kCPU).all().item<bool>());
}

// nested_drop: each row drops nothing (probability 1 - nested_drop) or the first k layers of the
// order, every k in 1..4 drawn; the order's layers beyond any index of the model are refused.
TEST(Train, StochasticDepthMaskDrawsNestedSubStacks) {
  TrainConfig config;
  torch::manual_seed(5);
  config.nested_drop = 0.6;
  config.nested_drop_order = {1, 5, 3, 7};
  const auto keep = stochastic_depth_keep(5000, 8, config, torch::kCPU);  // [5000, 8]
  const auto dropped = keep.logical_not().sum(1);                        // [5000]
  for (int64_t k = 1; k <= 4; ++k) {
    // Rows that drop k layers drop exactly the first k of the order.
    auto expected = torch::ones({8}, torch::kBool);
    for (int64_t i = 0; i < k; ++i) expected[config.nested_drop_order[static_cast<size_t>(i)]] = false;
    const auto rows = keep.index({dropped.eq(k)});
    EXPECT_GT(rows.size(0), 600) << k;  // about 0.6 / 4 of 5000
    EXPECT_TRUE(rows.eq(expected.view({1, 8})).all().item<bool>()) << k;
  }
  EXPECT_NEAR(dropped.eq(0).to(torch::kFloat64).mean().item<double>(), 0.4, 0.03);
  config.nested_drop_order = {1, 9};
  EXPECT_THROW(stochastic_depth_keep(4, 8, config, torch::kCPU), std::invalid_argument);
}

// layer_drop (stochastic depth) as a healing mode from a trained model: seeded, so two runs give
// the same weights bit for bit; it changes what is learned (a run without it ends elsewhere).
TEST(Train, LayerDropHealsReproduciblyFromASeed) {
  TempDir dir;
  std::ostringstream log;
  const std::string yaml = tiny_yaml(dir, "coconut");
  const auto base = train(train_config_from_yaml_text(yaml, "base.yaml", {"num_epochs=1", "log_every=100"}), log);
  const auto heal_with = [&](const std::string& name, const std::string& rate) {
    heal(train_config_from_yaml_text(without_model(yaml), name + ".yaml",
                                     {"load_model_path=" + base.final_dir, "output_dir=" + dir.file(name), "layer_drop=" + rate,
                                      "num_epochs=1", "log_every=100"}),
         log);
    return final_weights(dir.file(name));
  };
  const auto first = heal_with("drop_a", "0.5"), second = heal_with("drop_b", "0.5"), plain = heal_with("plain", "0");
  size_t differing = 0;
  for (const auto& [name, tensor] : first) {
    EXPECT_TRUE(torch::equal(tensor, second.at(name))) << name;
    if (!torch::equal(tensor, plain.at(name))) ++differing;
  }
  EXPECT_GT(differing, 0u);
}

// The step's paths that compute the same thing (TrainConfig::last_layer_cut, frozen_base_bf16,
// chunked_head_loss):
// LoRA's frozen base in bf16 trains the same run (bit for bit where every product's input requires
// grad: LatentForward.AFrozenBaseInBf16IsTheSameLoraStepWithoutACopyPerPass; here the first layer's
// q/k/v read a frozen table, which the CPU multiplies as inference); compare_paths alternates the arms
// over its first steps, logs each one's tokens/s, then goes on as configured.
TEST(Train, StepPathsTrainTheSameRunAndAreCompared) {
  const std::vector<std::string> lora = {"lora_rank=4", "lora_alpha=8", "bf16=true", "first_stage=1", "max_latent_stage=2",
                                         "gradient_accumulation_steps=1", "max_steps=17", "val_generate_limit=0"};
  const auto run = [&](const TempDir& dir, std::vector<std::string> overrides, std::ostringstream& log) {
    overrides.insert(overrides.begin(), lora.begin(), lora.end());
    train(train_config_from_yaml_text(tiny_yaml(dir, "coconut"), "paths.yaml", overrides), log);
    std::vector<nlohmann::json> records;
    std::ifstream metrics(dir.file("run/metrics.jsonl"));
    for (std::string line; std::getline(metrics, line);) records.push_back(nlohmann::json::parse(line));
    return records;
  };
  const auto losses = [](const std::vector<nlohmann::json>& records) {
    std::vector<double> values;
    for (const auto& record : records)
      if (record["event"] == "train") values.push_back(record["loss"].get<double>());
    return values;
  };
  TempDir float32_dir, bf16_dir, compared_dir;
  std::ostringstream float32_log, bf16_log, compared_log;
  const auto float32_run = run(float32_dir, {"frozen_base_bf16=false", "last_layer_cut=false"}, float32_log);
  const auto bf16_run = run(bf16_dir, {"frozen_base_bf16=true", "last_layer_cut=false"}, bf16_log);
  TempDir chunked_dir;
  std::ostringstream chunked_log;
  const auto chunked_run = run(chunked_dir, {"chunked_head_loss=true", "last_layer_cut=false"}, chunked_log);
  ASSERT_EQ(losses(float32_run).size(), 17u);
  ASSERT_EQ(losses(bf16_run).size(), 17u);
  // Measured: within 3e-5 of each other, where the steps move the loss by 1e-2.
  for (size_t i = 0; i < 17; ++i) {
    EXPECT_NEAR(losses(bf16_run)[i], losses(float32_run)[i], 1e-4 * losses(float32_run)[i]) << i;
    EXPECT_NEAR(losses(chunked_run)[i], losses(float32_run)[i], 1e-4 * losses(float32_run)[i]) << i;
  }

  // Five arms, each once unmeasured and twice measured: steps 1-15, then as configured.
  const auto compared = run(compared_dir, {"compare_paths=2"}, compared_log);
  const nlohmann::json* report = nullptr;
  for (const auto& record : compared)
    if (record["event"] == "path_comparison") report = &record;
  ASSERT_NE(report, nullptr) << compared_log.str();
  EXPECT_EQ((*report)["step"], 15);
  std::vector<std::string> names;
  for (const auto& arm : (*report)["arms"]) {
    names.push_back(arm["paths"]);
    EXPECT_EQ(arm["steps"], 2);
    EXPECT_GT(arm["tokens_per_second"].get<double>(), 0.0);
    EXPECT_EQ(arm["peak_gib"].get<double>(), 0.0);  // measured on a CUDA device only
  }
  EXPECT_EQ(names, (std::vector<std::string>{"old", "cut", "bf16-base", "chunked-loss", "cut+bf16-base+chunked-loss"}));
  EXPECT_EQ((*report)["arms"][0]["ratio"], 1.0);
  EXPECT_NE(compared_log.str().find("paths compared, 2 steps each: old "), std::string::npos) << compared_log.str();
  // The arms compute the same step: the run follows the float32 one.
  const auto compared_losses = losses(compared);
  ASSERT_EQ(compared_losses.size(), 17u);
  for (size_t i = 0; i < 17; ++i) EXPECT_NEAR(compared_losses[i], losses(float32_run)[i], 1e-4 * losses(float32_run)[i]) << i;

  const std::string base = tiny_yaml(compared_dir, "coconut");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base, "p.yaml", {"frozen_base_bf16=true", "bf16=true"}), "p.yaml",
                    "'frozen_base_bf16'", "LoRA");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base, "q.yaml", {"frozen_base_bf16=true", "lora_rank=4"}), "q.yaml",
                    "'frozen_base_bf16'", "bf16");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base, "r.yaml", {"last_layer_cut=sometimes"}), "r.yaml", "'last_layer_cut'",
                    "auto, true or false");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base, "s.yaml", {"compare_paths=-1"}), "s.yaml", "'compare_paths'");
  EXPECT_THROW_WITH(train_config_from_yaml_text(base, "t.yaml", {"chunked_head_loss=true", "distill_from=teacher"}), "t.yaml",
                    "'chunked_head_loss'", "distill_from");
}

// The comparison's bookkeeping: arms in turn a step at a time, the first round unmeasured, each
// arm's tokens over its time, its ratio to the first arm and its largest peak.
TEST(PathComparison, AlternatesArmsAndReportsTheirRates) {
  PathComparison comparison(comparison_arms(false, true), 2);  // old, cut, chunked-loss, both
  std::vector<std::string> order;
  const int64_t gib = int64_t{1} << 30;
  for (int64_t step = 0; comparison.active(); ++step) {
    order.push_back(comparison.arm().name());
    const int64_t arm = step % 4;
    // Round 0 (ignored) at a tenth of the speed; then arm k runs (k + 1) x 100 tokens a second.
    comparison.finished_step(step < 4 ? 10.0 : 1.0, 100 * (arm + 1), (arm + 1 + step) * gib);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"old", "cut", "chunked-loss", "cut+chunked-loss", "old", "cut", "chunked-loss",
                                             "cut+chunked-loss", "old", "cut", "chunked-loss", "cut+chunked-loss"}));
  const auto report = comparison.report();
  ASSERT_EQ(report["arms"].size(), 4u);
  for (int64_t arm = 0; arm < 4; ++arm) {
    const auto& entry = report["arms"][static_cast<size_t>(arm)];
    EXPECT_EQ(entry["steps"], 2);
    EXPECT_DOUBLE_EQ(entry["tokens_per_second"].get<double>(), 100.0 * static_cast<double>(arm + 1));
    EXPECT_DOUBLE_EQ(entry["ratio"].get<double>(), static_cast<double>(arm + 1));
    EXPECT_DOUBLE_EQ(entry["peak_gib"].get<double>(), static_cast<double>(arm + 1 + 8 + arm));  // its last step: 8 + arm
  }
  EXPECT_NE(comparison.summary().find("cut+chunked-loss 400 tok/s (4.000x) peak 15.0 GiB"), std::string::npos) << comparison.summary();
  EXPECT_THROW(PathComparison({}, 2), std::invalid_argument);
  EXPECT_THROW(PathComparison(comparison_arms(false, false), 0), std::invalid_argument);
}
