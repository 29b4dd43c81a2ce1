#include "recipes/checkpoints.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "distributed/zero.h"
#include "io/hf_checkpoint.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "util/atomic_file.h"

namespace coconut {

// adapters.safetensors' keys for the embedding rows a LoRA run trains (beside lora_state's names).
constexpr const char* kTokenIdsKey = "trainable_token_ids";
constexpr const char* kTokenRowsKey = "trainable_token_rows";

namespace fs = std::filesystem;
using json = nlohmann::json;

json TrainerState::to_json() const {
  return {{"epoch", epoch}, {"next_batch", next_batch}, {"global_step", global_step},
          {"optimizer_stage", optimizer_stage}, {"tokens_seen", tokens_seen}};
}

TrainerState TrainerState::from_json(const json& value, const std::string& source) {
  TrainerState state;
  try {
    state.epoch = value.at("epoch").get<int64_t>();
    state.next_batch = value.at("next_batch").get<int64_t>();
    state.global_step = value.at("global_step").get<int64_t>();
    state.optimizer_stage = value.at("optimizer_stage").get<int64_t>();
    state.tokens_seen = value.at("tokens_seen").get<int64_t>();
  } catch (const json::exception& error) {
    throw std::invalid_argument(source + ": malformed trainer state: " + error.what());
  }
  const auto require = [&](bool holds, const std::string& what) {
    if (!holds) throw std::invalid_argument(source + ": impossible trainer state: " + what);
  };
  require(state.epoch >= 0, "negative epoch " + std::to_string(state.epoch));
  require(state.next_batch >= 0, "negative batch index " + std::to_string(state.next_batch));
  require(state.global_step >= 0, "negative step " + std::to_string(state.global_step));
  require(state.optimizer_stage >= -1, "optimizer stage " + std::to_string(state.optimizer_stage));
  require(state.tokens_seen >= 0, "negative token count " + std::to_string(state.tokens_seen));
  return state;
}

void TrainerState::check_against_schedule(const std::string& source, int64_t num_epochs, int64_t batches_per_epoch,
                                          int64_t steps_per_epoch) const {
  const auto require = [&](bool holds, const std::string& what) {
    if (!holds) throw std::invalid_argument(source + ": trainer state does not fit this run: " + what);
  };
  require(epoch <= num_epochs, "epoch " + std::to_string(epoch) + " is past num_epochs " + std::to_string(num_epochs) +
                                   " (raise num_epochs to train on)");
  require(next_batch <= batches_per_epoch, "batch " + std::to_string(next_batch) + " is past the epoch's " +
                                               std::to_string(batches_per_epoch) + " batches");
  require(global_step <= steps_per_epoch * (epoch + 1),
          "step " + std::to_string(global_step) + " cannot be reached in " + std::to_string(epoch + 1) +
              " epochs of " + std::to_string(steps_per_epoch) + " steps (was batch_size changed?)");
}

std::optional<int64_t> checkpoint_step(const std::string& name) {
  constexpr size_t kPrefix = 11;  // "checkpoint-"
  if (name.rfind("checkpoint-", 0) != 0 || name.size() <= kPrefix || name.size() > kPrefix + 18 ||
      name.find_first_not_of("0123456789", kPrefix) != std::string::npos)
    return std::nullopt;
  return std::stoll(name.substr(kPrefix));
}

void CheckpointWriter::write(const std::string& name, Llama& model, const HfTokenizer& tokenizer,
                             const ReasoningSettings& settings, const torch::optim::AdamW* optimizer,
                             const TrainerState* state, const std::vector<std::string>& optimizer_files) {
  const fs::path pending = root_ / ".pending";
  fs::create_directories(pending);
  try {
    write_into(pending, name, model, tokenizer, settings, optimizer, state, optimizer_files);
  } catch (...) {  // a failed write leaves the earlier checkpoints as they were, and no debris
    std::error_code ignored;
    fs::remove_all(pending, ignored);
    throw;
  }
  fs::remove_all(pending);
}

void CheckpointWriter::write_checkpoint(Llama& model, const HfTokenizer& tokenizer, const ReasoningSettings& settings,
                                        const torch::optim::AdamW* optimizer,
                                        const std::vector<std::string>& optimizer_files, const TrainerState& state) {
  const std::string name = "checkpoint-" + std::to_string(state.global_step);
  write(name, model, tokenizer, settings, optimizer, &state, optimizer_files);
  write_file_atomically((root_ / kLastCheckpointFile).string(), name + "\n");
  prune_old(name);
}

std::optional<fs::path> CheckpointWriter::last_checkpoint() const {
  const fs::path pointer = root_ / kLastCheckpointFile;
  if (!fs::exists(pointer)) return std::nullopt;
  std::ifstream file(pointer);
  std::string name;
  std::getline(file, name);
  // Only a checkpoint folder of this run: a path elsewhere would resume another model and then
  // prune this run's checkpoints.
  if (!checkpoint_step(name))
    throw std::invalid_argument(pointer.string() + ": names '" + name +
                                "', not a checkpoint-<step> folder of this output_dir");
  const fs::path directory = root_ / name;
  for (const char* required : {kTrainerStateFile, "config.json", "tokenizer.json"})
    if (!fs::is_regular_file(directory / required))
      throw std::invalid_argument(pointer.string() + ": names " + directory.string() + ", which lacks " + required);
  // The optimizer state: whole, or ZeRO's index (which the run checks its shards against).
  if (!fs::is_regular_file(directory / kOptimizerFile) && !fs::is_regular_file(directory / kZeroIndexFile))
    throw std::invalid_argument(pointer.string() + ": names " + directory.string() + ", which lacks " + kOptimizerFile +
                                " (or " + kZeroIndexFile + ")");
  return directory;
}

// The checkpoint's files, written into `pending`, then the HF folder `name`.
void CheckpointWriter::write_into(const fs::path& pending, const std::string& name, Llama& model,
                                  const HfTokenizer& tokenizer, const ReasoningSettings& settings,
                                  const torch::optim::AdamW* optimizer, const TrainerState* state,
                                  const std::vector<std::string>& optimizer_files) {
  std::vector<std::string> extra = optimizer_files;
  tokenizer.save((pending / "tokenizer.json").string());
  extra.push_back((pending / "tokenizer.json").string());
  if (!side_files_from_.empty())
    for (const char* side : {"tokenizer_config.json", "generation_config.json"}) {
      const fs::path source = fs::path(side_files_from_) / side;
      if (fs::is_regular_file(source)) extra.push_back(source.string());
    }
  write_file_atomically((pending / kReasoningSettingsFile).string(), reasoning_settings_to_json(settings).dump(2) + "\n");
  extra.push_back((pending / kReasoningSettingsFile).string());
  if (optimizer) {
    // Serialized in memory, then written like every other file: libtorch's own file writer
    // aborts the process (an exception from a destructor) when the disk is full.
    std::ostringstream bytes;
    torch::serialize::OutputArchive archive;
    optimizer->save(archive);
    archive.save_to(bytes);
    write_file_atomically((pending / kOptimizerFile).string(), bytes.str());
    extra.push_back((pending / kOptimizerFile).string());
  }
  if (state) {
    write_file_atomically((pending / kTrainerStateFile).string(), state->to_json().dump(2) + "\n");
    extra.push_back((pending / kTrainerStateFile).string());
  }
  // With LoRA the folder holds the merged weights (a plain model); the adapters go beside them so
  // that a resumed run can go on training them on top of the same frozen base.
  Llama to_save = model;
  if (has_lora(model)) {
    auto adapters = lora_state(model);
    if (!token_rows_.empty()) {
      const auto ids = torch::tensor(token_rows_, torch::kLong);
      adapters[kTokenIdsKey] = ids;
      adapters[kTokenRowsKey] = model->embed_tokens->weight.detach().index_select(0, ids.to(model->embed_tokens->weight.device())).cpu();
    }
    write_safetensors((pending / kAdaptersFile).string(), adapters);
    extra.push_back((pending / kAdaptersFile).string());
    to_save = merge_lora(model);
  }
  SaveOptions options;
  options.dtype = torch::kFloat32;
  options.extra_files = extra;
  save_hf_folder((root_ / name).string(), to_save, options);
  if (has_lora(model) && adapter_alpha_ > 0) {
    const fs::path folder = root_ / name;
    std::vector<std::string> copied = {(folder / "tokenizer.json").string()};
    std::map<std::string, std::string> written;
    if (base_pruning_.empty()) {
      copied.push_back((folder / kReasoningSettingsFile).string());
    } else {
      auto adapter_settings = reasoning_settings_to_json(settings);
      write_base_pruning(adapter_settings, base_pruning_);
      written[kReasoningSettingsFile] = adapter_settings.dump(2) + "\n";
    }
    write_peft_adapter((folder / "adapter").string(), peft_adapter_from_lora(model, adapter_alpha_, token_rows_, base_model_),
                       copied, written);
  }
}

void load_lora_checkpoint(Llama& model, const std::string& path, const std::vector<int64_t>& token_rows) {
  auto state = read_safetensors(path);
  const bool has_rows = state.count(kTokenIdsKey) && state.count(kTokenRowsKey);
  if (has_rows != !token_rows.empty() ||
      (has_rows && !torch::equal(state[kTokenIdsKey].to(torch::kLong), torch::tensor(token_rows, torch::kLong))))
    throw std::invalid_argument(path + ": its trained embedding rows are not this run's marker tokens (another tokenizer?)");
  if (has_rows) {
    set_token_rows(model, token_rows, state[kTokenRowsKey]);
    state.erase(kTokenIdsKey);
    state.erase(kTokenRowsKey);
  }
  load_lora_state(model, state, path);
}

void CheckpointWriter::prune_old(const std::string& keep) {
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const auto& entry : fs::directory_iterator(root_)) {
    const std::string name = entry.path().filename().string();
    if (const auto step = checkpoint_step(name); entry.is_directory() && step) found.emplace_back(*step, entry.path());
  }
  std::sort(found.begin(), found.end());
  const auto excess = static_cast<int64_t>(found.size()) - keep_;
  for (int64_t i = 0; i < excess; ++i)
    if (found[static_cast<size_t>(i)].second.filename() != keep) fs::remove_all(found[static_cast<size_t>(i)].second);
}

MetricsLog::MetricsLog(const fs::path& path, std::optional<int64_t> resumed_step) : path_(path) {
  if (resumed_step && fs::exists(path_)) {
    std::ifstream in(path_);
    std::string line, kept;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const json record = json::parse(line, nullptr, false);
      if (record.is_discarded()) continue;
      if (record.value("step", int64_t{0}) <= *resumed_step) kept += line + "\n";
    }
    write_file_atomically(path_.string(), kept);
  } else if (!resumed_step) {
    write_file_atomically(path_.string(), "");
  }
  file_.open(path_, std::ios::app);
  if (!file_) throw std::runtime_error(path_.string() + ": cannot open for writing");
}

void MetricsLog::write(const json& record) {
  file_ << record.dump() << "\n";
  file_.flush();
}

}  // namespace coconut
