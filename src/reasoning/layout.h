// How a trained model reasons and must be prompted, saved beside its weights as coconut.json:
// its training mode and the Coconut curriculum's layout (stage, thoughts per step, the largest
// latent stage, padding). Written by training; read by eval, pruning, healing, the sweep and serve.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "data/sequences.h"
#include "model/config.h"
#include "model/generate.h"

namespace coconut {

inline constexpr const char* kReasoningSettingsFile = "coconut.json";

// A depth cascade over prefixes of the model: every question first runs the first depths[0]
// layers (prompt, thoughts and answer); where its answer's confidence, the lowest probability among
// its generated tokens, is at most `confidence`, it goes on to depths[1] from its prompt's state at
// depths[0] (those layers are not run again on the prompt), and so on. Empty depths: off.
//
// Or a cascade over layer sets: each level is the model without some layers (`removed`, any set,
// not only the last ones), run whole, prompt included, from the start: a deeper level shares no
// state with a shallower one and its FLOPs count the whole question again. `depths` is then empty.
struct DepthCascade {
  std::vector<int64_t> depths;  // ascending, each at least 1
  double confidence = 0;        // in [0, 1]; a deeper level is taken at or below it (0: never, 1: always)
  std::vector<std::vector<int64_t>> removed;  // a layer-set cascade: per level the layers left out (ascending)
  bool active() const { return !depths.empty() || !removed.empty(); }
  bool layer_sets() const { return !removed.empty(); }
  size_t levels() const { return layer_sets() ? removed.size() : depths.size(); }
  // The layers level `level` runs, of a model of `layers` layers.
  int64_t level_layers(size_t level, int64_t layers) const {
    return layer_sets() ? layers - static_cast<int64_t>(removed[level].size()) : depths[level];
  }
};
// "5,8@0.9" (depths, then the threshold), or "{1,3,5,7},{1,5},{}@0.9" (per level the layers it
// leaves out; {} is the whole model): throws std::invalid_argument naming the problem.
DepthCascade parse_depth_cascade(const std::string& text);
// The cascade as parse_depth_cascade reads it.
std::string describe_depth_cascade(const DepthCascade& cascade);
// What level `level` of `cascade` costs (eval/cost.h), as eval and serve count it: a prefix level
// its thoughts and answer at its depth plus the prompt's layers above the previous level's depth
// (cascade_level_flops); a layer-set level the whole question without its removed layers
// (layer_set_flops). `prompt_tokens`: the prompt and the tokens after the thoughts; `prompt_only`:
// the prompt alone.
double cascade_level_cost(const LlamaConfig& config, const DepthCascade& cascade, size_t level, int64_t prompt_tokens,
                          int64_t prompt_only, int64_t new_tokens, int64_t latent_steps);
// Throws std::invalid_argument (prefixed with `where`) unless the depths ascend within 1..layers
// (layer sets: each within 0..layers-1, ascending, leaving a layer, and the levels' layer counts
// ascend).
void check_depth_cascade(const DepthCascade& cascade, int64_t layers, const std::string& where);

// Halting: "2,4,6@0.9", the thought counts a question may stop at (ascending; the last is the most
// it takes) and the confidence above which a peek's answer is kept (model/generate.h's
// ThoughtHalting; peek_tokens stays 0). Throws std::invalid_argument naming the problem.
ThoughtHalting parse_thought_halting(const std::string& text);
// The halting as parse_thought_halting reads it.
std::string describe_thought_halting(const ThoughtHalting& halting);

struct ReasoningSettings {
  std::string mode = "cot";
  int64_t stage = 0, c_thought = 1, max_latent_stage = 0, pause_tokens = 0;
  bool pad_latent_to_max = false;
  // Trained with latent_bottleneck 1: every answer saw the question only through the thoughts, so
  // it is prompted that way too (GenerationOptions::latent_bottleneck). Optional in coconut.json.
  bool answer_through_thoughts = false;
  // The depth policy eval runs by default (optional in coconut.json: "depth_cascade": {"depths":
  // [5, 8], "confidence": 0.9}); --depth K / full runs a fixed depth instead.
  DepthCascade depth_cascade;
  // The weight format eval, generate, serve and logits run by default (`--weights auto`): "" (dense)
  // or q8_0 / q4_0 / q4_1. import-gguf writes the file's own format where every projection has it,
  // so a GGUF model runs as it came. Optional in coconut.json ("weights").
  std::string weights;

  // The sequence layout at `stage` (-1: the trained stage), e.g. for latent_thoughts_for_stage.
  SequenceOptions sequence_options(int64_t at_stage = -1) const;
  // The thoughts a prompt gets by default (Coconut, pause_as_thought): the trained stage's count,
  // past max_latent_stage the maximum.
  int64_t trained_latent_thoughts() const;
};

nlohmann::json reasoning_settings_to_json(const ReasoningSettings& settings);
// Defaults (cot) when <model_dir>/coconut.json does not exist; errors name the file when it is malformed.
ReasoningSettings load_reasoning_settings(const std::string& model_dir);

// What `--weights REQUESTED` means for a model folder: REQUESTED itself, or for "auto" the folder's
// coconut.json `weights`, except with a merged adapter (its weights are no longer the file's blocks)
// or off the CPU (no quantized kernels there), where auto is dense.
std::string resolve_weights(const std::string& requested, const std::string& model_dir, bool adapter_merged, bool on_cpu);

}  // namespace coconut
