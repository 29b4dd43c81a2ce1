// Data parallelism on this machine: `coconut train --nproc 2` (two processes, Gloo over loopback,
// each taking every other micro-batch) ends with the weights of one process that accumulates the
// same two micro-batches per step; a run stopped by two processes resumes in one. ZeRO-2
// (zero_stage: 2) ends where unsharded data parallelism ends, and its sharded checkpoints resume on
// 3 -> 2 -> 1 processes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>

#include "data/example.h"
#include "data/hops.h"
#include "io/hf_checkpoint.h"
#include "io/safetensors.h"
#include "support/run_cli.h"
#include "support/temp_dir.h"

using coconut::testing::read_text;
using coconut::testing::run_coconut;
using coconut::testing::TempDir;

namespace {

// Coconut curriculum (bucketed batches, latent stages), 4 rows per micro-batch.
void write_config(const TempDir& dir, int examples = 40) {
  coconut::save_coconut_json(dir.file("train.json"), coconut::generate_hops(examples, 1, {6, 2, 3}));
  std::ofstream yaml(dir.file("train.yaml"));
  yaml << "mode: coconut\ntrain_path: " << dir.file("train.json") << "\n"
       << "model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 2, num_attention_heads: 4,\n"
       << "        num_key_value_heads: 2, max_position_embeddings: 128, tie_word_embeddings: true}\n"
       << "num_epochs: 3\nepochs_per_stage: 1\nmax_latent_stage: 2\nbatch_size: 4\nlr: 3.0e-3\n"
       << "schedule: cosine\nwarmup_steps: 2\nmax_grad_norm: 1.0\nseed: 5\nlog_every: 1\n";
}

// The loss of every optimizer step in a run's metrics log.
std::vector<double> losses_in(const TempDir& dir, const std::string& run) {
  std::ifstream metrics(dir.file(run + "/metrics.jsonl"));
  std::string line;
  std::vector<double> losses;
  while (std::getline(metrics, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "train") losses.push_back(record["loss"].get<double>());
  }
  return losses;
}

void expect_same_weights(const TempDir& dir, const std::string& a, const std::string& b, double rtol, double atol) {
  const auto first = coconut::read_safetensors(dir.file(a + "/final/model.safetensors"));
  const auto second = coconut::read_safetensors(dir.file(b + "/final/model.safetensors"));
  ASSERT_EQ(first.size(), second.size());
  for (const auto& [name, tensor] : first) {
    ASSERT_TRUE(second.count(name)) << name;
    EXPECT_TRUE(torch::allclose(tensor, second.at(name), rtol, atol))
        << a << " vs " << b << ", " << name << ": max difference " << (tensor - second.at(name)).abs().max().item<float>();
  }
}

}  // namespace

TEST(CliDistributed, TwoProcessesMatchOneWithTheSameGlobalBatch) {
  TempDir dir;
  write_config(dir);
  const std::string yaml = dir.file("train.yaml");
  ASSERT_EQ(run_coconut("train " + yaml + " output_dir=" + dir.file("one") + " gradient_accumulation_steps=2",
                        dir.file("one.log")), 0) << read_text(dir.file("one.log"));
  ASSERT_EQ(run_coconut("train " + yaml + " output_dir=" + dir.file("two") + " --nproc 2", dir.file("two.log")), 0)
      << read_text(dir.file("two.log"));
  EXPECT_NE(read_text(dir.file("two.log")).find("2 processes (gloo), global batch 8"), std::string::npos)
      << read_text(dir.file("two.log"));

  // Summing two gradients and halving rounds differently from accumulating halves: float32
  // noise, compounded over the run's steps, stays far below the weights' change in training.
  expect_same_weights(dir, "one", "two", 1e-4, 1e-5);
  // Only rank 0 wrote the log: one line per optimizer step, the same steps and losses as the
  // single process; and the runs did train (the comparison is not between untouched weights).
  const auto one_losses = losses_in(dir, "one"), two_losses = losses_in(dir, "two");
  ASSERT_EQ(one_losses.size(), two_losses.size());
  for (size_t i = 0; i < one_losses.size(); ++i) EXPECT_NEAR(one_losses[i], two_losses[i], 1e-4) << "step " << i + 1;
  EXPECT_LT(one_losses.back(), one_losses.front());
}

// Stopped after 4 steps by two processes and resumed by one that accumulates the same two
// micro-batches per step: the same steps, losses and final weights as a straight two-process run.
// Constant schedule (after warm-up), so that the stop at max_steps cannot change the learning rates.
TEST(CliDistributed, RunStoppedByTwoProcessesResumesInOne) {
  TempDir dir;
  write_config(dir);
  const std::string yaml = dir.file("train.yaml") + " schedule=constant";
  ASSERT_EQ(run_coconut("train " + yaml + " output_dir=" + dir.file("straight") + " --nproc 2", dir.file("straight.log")), 0)
      << read_text(dir.file("straight.log"));
  const std::string stopped = yaml + " output_dir=" + dir.file("run");
  ASSERT_EQ(run_coconut("train " + stopped + " max_steps=4 --nproc 2", dir.file("first.log")), 0) << read_text(dir.file("first.log"));
  ASSERT_EQ(read_text(dir.file("run/last_checkpoint")), "checkpoint-4\n");
  ASSERT_EQ(run_coconut("train " + stopped + " resume=true gradient_accumulation_steps=2", dir.file("second.log")), 0)
      << read_text(dir.file("second.log"));
  const std::string log = read_text(dir.file("second.log"));
  EXPECT_NE(log.find("resuming from"), std::string::npos) << log;
  EXPECT_TRUE(std::ifstream(dir.file("run/final/model.safetensors")).good());
  std::ifstream metrics(dir.file("run/metrics.jsonl"));
  std::string line;
  int64_t last_step = 0;
  while (std::getline(metrics, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] != "train") continue;
    EXPECT_EQ(record["step"].get<int64_t>(), last_step + 1);  // no step lost or repeated across the switch
    last_step = record["step"].get<int64_t>();
  }
  EXPECT_GT(last_step, 4);
  // As in TwoProcessesMatchOneWithTheSameGlobalBatch: summing two gradients across processes and
  // accumulating them in one round differently (float32 noise over the steps after the switch).
  const auto straight = losses_in(dir, "straight"), resumed = losses_in(dir, "run");
  ASSERT_EQ(straight.size(), resumed.size());
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_NEAR(straight[i], resumed[i], 1e-4) << "step " << i + 1;
  expect_same_weights(dir, "straight", "run", 1e-4, 1e-5);
  EXPECT_LT(straight.back(), straight.front());  // they trained: not a comparison of untouched weights
}

TEST(CliDistributed, BadLauncherVariablesAreNamed) {
  TempDir dir;
  write_config(dir);
  const std::string yaml = dir.file("train.yaml") + " output_dir=" + dir.file("run");
  EXPECT_NE(WEXITSTATUS(std::system(("WORLD_SIZE=x " + std::string(COCONUT_BINARY_DIR) + "/coconut train " + yaml + " >" +
                                      dir.file("a.log") + " 2>&1").c_str())), 0);
  EXPECT_NE(read_text(dir.file("a.log")).find("WORLD_SIZE='x'"), std::string::npos) << read_text(dir.file("a.log"));
  const int status = WEXITSTATUS(std::system(("WORLD_SIZE=2 RANK=0 " + std::string(COCONUT_BINARY_DIR) + "/coconut train " +
                                              yaml + " >" + dir.file("b.log") + " 2>&1").c_str()));
  EXPECT_NE(status, 0);
  EXPECT_NE(read_text(dir.file("b.log")).find("MASTER_ADDR"), std::string::npos) << read_text(dir.file("b.log"));
  const int bad_rank = WEXITSTATUS(std::system(("WORLD_SIZE=2 RANK=5 MASTER_ADDR=127.0.0.1 " + std::string(COCONUT_BINARY_DIR) +
                                                "/coconut train " + yaml + " >" + dir.file("c.log") + " 2>&1").c_str()));
  EXPECT_NE(bad_rank, 0);
  EXPECT_NE(read_text(dir.file("c.log")).find("RANK=5"), std::string::npos) << read_text(dir.file("c.log"));
}

// ZeRO-2 shards the AdamW state and the averaged gradients; the arithmetic of every element is
// unchanged, so two processes end where unsharded data parallelism ends, step for step.
TEST(CliDistributed, ZeroStageTwoMatchesUnshardedDataParallelism) {
  TempDir dir;
  write_config(dir);
  const std::string yaml = dir.file("train.yaml") + " --nproc 2 gradient_accumulation_steps=2";
  ASSERT_EQ(run_coconut("train " + yaml + " output_dir=" + dir.file("whole"), dir.file("whole.log")), 0)
      << read_text(dir.file("whole.log"));
  ASSERT_EQ(run_coconut("train " + yaml + " output_dir=" + dir.file("zero") + " zero_stage=2", dir.file("zero.log")), 0)
      << read_text(dir.file("zero.log"));
  // Reduce-scatter and all-reduce add the same two numbers; the clipping norm is summed in another
  // order (float64 over shards vs float32 per tensor): 1e-6 relative at most, compounded over the run.
  expect_same_weights(dir, "whole", "zero", 1e-5, 1e-6);
  const auto whole = losses_in(dir, "whole"), zero = losses_in(dir, "zero");
  ASSERT_EQ(whole.size(), zero.size());
  ASSERT_GT(zero.size(), 3u);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(whole[i], zero[i], 1e-6) << "step " << i + 1;
  EXPECT_LT(zero.back(), zero.front());
  // Its checkpoints hold the shards and their index, not a whole optimizer state.
  std::string name = read_text(dir.file("zero/last_checkpoint"));
  name.pop_back();  // the newline
  const std::string checkpoint = dir.file("zero/" + name);
  EXPECT_TRUE(std::ifstream(checkpoint + "/optimizer_shards.json").good()) << checkpoint;
  EXPECT_TRUE(std::ifstream(checkpoint + "/optimizer-rank-00000-of-00002.safetensors").good());
  EXPECT_TRUE(std::ifstream(checkpoint + "/optimizer-rank-00001-of-00002.safetensors").good());
  EXPECT_FALSE(std::ifstream(checkpoint + "/optimizer.pt").good());
}

// A sharded checkpoint resumes on another number of processes: stopped by 3 (chunks of ceil(n/3),
// padded), continued by 2, finished by 1, with the same 6 micro-batches per step throughout, the run
// ends where one uninterrupted 2-process run ends.
TEST(CliDistributed, ZeroCheckpointsResumeOnOtherWorldSizes) {
  TempDir dir;
  write_config(dir, 120);  // 30 micro-batches an epoch: 5 steps
  // A constant rate: max_steps, which stops the segments, is also the cosine schedule's horizon.
  const std::string yaml = dir.file("train.yaml") + " zero_stage=2 schedule=constant";
  ASSERT_EQ(run_coconut("train " + yaml + " output_dir=" + dir.file("straight") + " --nproc 2 gradient_accumulation_steps=3",
                        dir.file("straight.log")), 0) << read_text(dir.file("straight.log"));
  const std::string run = yaml + " output_dir=" + dir.file("moved");
  ASSERT_EQ(run_coconut("train " + run + " --nproc 3 gradient_accumulation_steps=2 max_steps=3", dir.file("three.log")), 0)
      << read_text(dir.file("three.log"));
  ASSERT_EQ(run_coconut("train " + run + " --nproc 2 gradient_accumulation_steps=3 max_steps=7 resume=true", dir.file("two.log")), 0)
      << read_text(dir.file("two.log"));
  ASSERT_EQ(run_coconut("train " + run + " gradient_accumulation_steps=6 resume=true", dir.file("one.log")), 0)
      << read_text(dir.file("one.log"));
  EXPECT_NE(read_text(dir.file("one.log")).find("resuming from"), std::string::npos) << read_text(dir.file("one.log"));
  expect_same_weights(dir, "straight", "moved", 1e-4, 1e-5);
  const auto straight = losses_in(dir, "straight"), moved = losses_in(dir, "moved");
  ASSERT_EQ(straight.size(), moved.size());
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_NEAR(straight[i], moved[i], 1e-4) << "step " << i + 1;

  // Resuming a sharded checkpoint without zero_stage (or the reverse) is refused, naming both.
  EXPECT_NE(run_coconut("train " + dir.file("train.yaml") + " output_dir=" + dir.file("moved") + " resume=true num_epochs=4",
                        dir.file("unsharded.log")), 0);
  EXPECT_NE(read_text(dir.file("unsharded.log")).find("resume with zero_stage: 2"), std::string::npos)
      << read_text(dir.file("unsharded.log"));
}
