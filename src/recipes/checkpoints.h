// What a training run keeps on disk, apart from its model: the trainer state saved beside each
// checkpoint, the checkpoint folders of an output_dir (written whole into a pending folder, then
// renamed, so a kill leaves the earlier ones intact; the newest `keep` are kept; `last_checkpoint`
// names the one to resume from) and the metrics log (one JSON record per line).
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "io/peft_adapter.h"
#include "model/llama.h"
#include "reasoning/layout.h"
#include "text/hf_tokenizer.h"

namespace coconut {

inline constexpr const char* kLastCheckpointFile = "last_checkpoint";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";
inline constexpr const char* kOptimizerFile = "optimizer.pt";
inline constexpr const char* kAdaptersFile = "adapters.safetensors";

// Where a run stands, saved with each checkpoint so a killed run resumes exactly there.
struct TrainerState {
  int64_t epoch = 0;             // epoch in progress
  int64_t next_batch = 0;        // micro-batches of that epoch already consumed
  int64_t global_step = 0;       // optimizer steps done
  int64_t optimizer_stage = -1;  // the stage (or icot removal) the optimizer was created for
  int64_t tokens_seen = 0;

  nlohmann::json to_json() const;
  // Errors name `source` and the field (malformed or impossible values).
  static TrainerState from_json(const nlohmann::json& value, const std::string& source);
  // Against this run's schedule: the epoch within it (an epoch equal to num_epochs is a finished
  // run), the batch within the epoch, and no more steps than the epochs before it can hold.
  void check_against_schedule(const std::string& source, int64_t num_epochs, int64_t batches_per_epoch,
                              int64_t steps_per_epoch) const;
};

// "checkpoint-<step>" -> step; anything else (".tmp", ".old", other names) -> nullopt.
std::optional<int64_t> checkpoint_step(const std::string& name);

class CheckpointWriter {
 public:
  // Checkpoints go under `root` (the run's output_dir); the newest `keep` checkpoint-<step> folders stay.
  CheckpointWriter(std::filesystem::path root, int64_t keep) : root_(std::move(root)), keep_(keep) {}

  // HF folder + tokenizer + settings (+ optimizer and trainer state), written whole, then renamed.
  // `optimizer_files`: optimizer state already written elsewhere (ZeRO's shards), copied in.
  void write(const std::string& name, Llama& model, const HfTokenizer& tokenizer, const ReasoningSettings& settings,
             const torch::optim::AdamW* optimizer, const TrainerState* state,
             const std::vector<std::string>& optimizer_files = {});
  // checkpoint-<global_step>, then `last_checkpoint` names it and older ones beyond `keep` go. The
  // optimizer state: `optimizer` (optimizer.pt), or `optimizer_files` (ZeRO's index and shards).
  void write_checkpoint(Llama& model, const HfTokenizer& tokenizer, const ReasoningSettings& settings,
                        const torch::optim::AdamW* optimizer, const std::vector<std::string>& optimizer_files,
                        const TrainerState& state);
  // The folder `last_checkpoint` names, checked to be a complete checkpoint of this output_dir.
  std::optional<std::filesystem::path> last_checkpoint() const;
  // LoRA runs: every folder written also gets adapter/, the adapters (scale alpha / r) and these
  // embedding rows as a PEFT adapter over `base_model` (with the tokenizer and coconut.json).
  // `base_pruning`: the run trained a copy of `base_model` without these layers and MLP channels (a
  // pruned folder), which the adapter's coconut.json names so that it loads over the unpruned base.
  void export_adapters(double alpha, std::vector<int64_t> token_rows, std::string base_model,
                       BasePruning base_pruning = {}) {
    adapter_alpha_ = alpha;
    token_rows_ = std::move(token_rows);
    base_model_ = std::move(base_model);
    base_pruning_ = std::move(base_pruning);
  }
  // Every folder written also gets `source`'s tokenizer_config.json (the chat template, BOS and EOS)
  // and generation_config.json, where it has them: a checkpoint is a model folder like its parent.
  void keep_side_files(std::string source) { side_files_from_ = std::move(source); }

 private:
  void write_into(const std::filesystem::path& pending, const std::string& name, Llama& model, const HfTokenizer& tokenizer,
                  const ReasoningSettings& settings, const torch::optim::AdamW* optimizer, const TrainerState* state,
                  const std::vector<std::string>& optimizer_files);
  void prune_old(const std::string& keep);

  std::filesystem::path root_;
  int64_t keep_;
  double adapter_alpha_ = 0;  // 0: no adapter/ folder
  std::vector<int64_t> token_rows_;
  std::string base_model_;
  BasePruning base_pruning_;
  std::string side_files_from_;
};

// A LoRA run's adapters.safetensors back into a model with the same adapters attached: the factors
// and, when the run trained some, the embedding rows `token_rows` (checked to be the same ids).
void load_lora_checkpoint(Llama& model, const std::string& path, const std::vector<int64_t>& token_rows);

class MetricsLog {
 public:
  // On resume, records after the checkpoint's step are dropped (they will be produced again);
  // without one, the log starts empty.
  MetricsLog(const std::filesystem::path& path, std::optional<int64_t> resumed_step);
  void write(const nlohmann::json& record);

 private:
  std::filesystem::path path_;
  std::ofstream file_;
};

}  // namespace coconut
