// Data parallelism on this machine: `coconut train --nproc 2` (two processes, Gloo over loopback,
// each taking every other micro-batch) ends with the weights of one process that accumulates the
// same two micro-batches per step; a run stopped by two processes resumes in one.
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
void write_config(const TempDir& dir) {
  coconut::save_coconut_json(dir.file("train.json"), coconut::generate_hops(40, 1, {6, 2, 3}));
  std::ofstream yaml(dir.file("train.yaml"));
  yaml << "mode: coconut\ntrain_path: " << dir.file("train.json") << "\n"
       << "model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 2, num_attention_heads: 4,\n"
       << "        num_key_value_heads: 2, max_position_embeddings: 128, tie_word_embeddings: true}\n"
       << "num_epochs: 3\nepochs_per_stage: 1\nmax_latent_stage: 2\nbatch_size: 4\nlr: 3.0e-3\n"
       << "schedule: cosine\nwarmup_steps: 2\nmax_grad_norm: 1.0\nseed: 5\nlog_every: 1\n";
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

  const auto one = coconut::read_safetensors(dir.file("one/final/model.safetensors"));
  const auto two = coconut::read_safetensors(dir.file("two/final/model.safetensors"));
  ASSERT_EQ(one.size(), two.size());
  for (const auto& [name, tensor] : one) {
    ASSERT_TRUE(two.count(name)) << name;
    // Summing two gradients and halving rounds differently from accumulating halves: float32
    // noise, compounded over the run's steps, stays far below the weights' change in training.
    EXPECT_TRUE(torch::allclose(tensor, two.at(name), 1e-4, 1e-5))
        << name << ": max difference " << (tensor - two.at(name)).abs().max().item<float>();
  }
  // Only rank 0 wrote the log: one line per optimizer step, the same steps and losses as the
  // single process; and the runs did train (the comparison is not between untouched weights).
  auto losses_in = [&](const std::string& run) {
    std::ifstream metrics(dir.file(run + "/metrics.jsonl"));
    std::string line;
    std::vector<double> losses;
    while (std::getline(metrics, line)) {
      const auto record = nlohmann::json::parse(line);
      if (record["event"] == "train") losses.push_back(record["loss"].get<double>());
    }
    return losses;
  };
  const auto one_losses = losses_in("one"), two_losses = losses_in("two");
  ASSERT_EQ(one_losses.size(), two_losses.size());
  for (size_t i = 0; i < one_losses.size(); ++i) EXPECT_NEAR(one_losses[i], two_losses[i], 1e-4) << "step " << i + 1;
  EXPECT_LT(one_losses.back(), one_losses.front());
}

TEST(CliDistributed, RunStoppedByTwoProcessesResumesInOne) {
  TempDir dir;
  write_config(dir);
  const std::string yaml = dir.file("train.yaml") + " output_dir=" + dir.file("run");
  ASSERT_EQ(run_coconut("train " + yaml + " max_steps=4 --nproc 2", dir.file("first.log")), 0) << read_text(dir.file("first.log"));
  ASSERT_EQ(read_text(dir.file("run/last_checkpoint")), "checkpoint-4\n");
  ASSERT_EQ(run_coconut("train " + yaml + " resume=true", dir.file("second.log")), 0) << read_text(dir.file("second.log"));
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
