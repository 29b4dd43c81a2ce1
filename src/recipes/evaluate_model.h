// Evaluating a trained model folder (weights, tokenizer.json, coconut.json) on a dataset: the
// prompt layout and thought counts default to what the model was trained for.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "data/example.h"
#include "model/llama.h"
#include "model/quantized_linear.h"
#include "reasoning/layout.h"
#include "reasoning/special_tokens.h"
#include "reasoning/evaluate.h"
#include "text/tokenizer.h"

namespace coconut {

struct ModelEvalOptions {
  std::string mode;              // empty: the trained mode
  int64_t latents = -1;          // thoughts per question; -1: the curriculum rule at `stage`
  int64_t stage = -1;            // -1: the trained stage
  int64_t pause_tokens = -1;     // -1: the trained count
  int64_t batch_size = 16;
  int64_t max_new_tokens = 128;
  DepthPolicy depth;             // early exit / router gate in thoughts and decoded tokens
  int64_t decode_thoughts = 0;   // Coconut: decode each step's thoughts, up to N tokens (0 = off)
  int64_t thought_top = 0;       // Coconut: each thought's K most likely tokens under the head (0 = off)
  std::optional<torch::ScalarType> dtype;  // empty: the checkpoint's
  torch::Device device = torch::kCPU;
  std::string adapter;           // a PEFT adapter folder merged into the model at load (empty: none)
  WeightFormat weights = WeightFormat::kDense;  // q8_0: projections quantized at load (model/quantize_model.h)
  // A sub-stack: these layers removed at load (pruning/surgery.h's drop_layers, not healed), so the
  // prompt, thoughts and answer all run without them and mean_flops counts what runs.
  std::set<int64_t> drop_layers;
  // A depth cascade (reasoning/layout.h). Empty: coconut.json's depth_cascade, where the model has
  // one and no other depth setting is asked for (drop_layers, early exit); an inactive one: every layer.
  std::optional<DepthCascade> cascade;
  // Thoughts per question decided by peeking at the answer (model/generate.h); with it the model
  // runs every layer unless `cascade` is given (which evaluate refuses beside it).
  ThoughtHalting halting;
  // A thought control (reasoning/thought_control.h): the questions run normally, then with their
  // thoughts replaced; the summary's thought_control compares the two. `control_calibration`: the
  // questions whose mean thoughts `mean` feeds (empty: the evaluated ones).
  ThoughtControl thought_control = ThoughtControl::kNone;
  uint64_t control_seed = 0;
  std::vector<Example> control_calibration;
};

// A model folder as eval, eval-lm, generate, serve and merge-adapter run it: `adapter` merged in
// (none when empty; one trained on a pruned copy of the base first removes from it the layers its
// coconut.json names, io/peft_adapter.h), then the layers `drop_layers` removed (an error names the
// folder), the projections on `weights`' blocks (dense ones packed: pack_for_inference); on the CPU
// every weight then moved to 2 MiB pages (model/huge_pages.h).
Llama load_model_variant(const std::string& model_dir, const std::string& adapter, std::optional<torch::ScalarType> dtype,
                         torch::Device device, const std::set<int64_t>& drop_layers, WeightFormat weights,
                         bool allow_nonfinite = false);

// The cascade a run uses: options.cascade, else the trained one unless the options ask for another
// depth, halting or a thought control (every layer then).
DepthCascade cascade_for(const ReasoningSettings& trained, const ModelEvalOptions& options);

// A loaded model (e.g. a pruned one in memory) in the layout `trained` describes, with the same
// defaults as evaluate_model_folder (options.dtype and options.device are not used).
EvalSummary evaluate_with_settings(Llama& model, const Tokenizer& tokenizer, const SpecialTokenIds& special,
                                   const ReasoningSettings& trained, const std::vector<Example>& examples,
                                   const ModelEvalOptions& options);

// Throws std::invalid_argument naming the folder when the tokenizer or markers are missing.
EvalSummary evaluate_model_folder(const std::string& model_dir, const std::vector<Example>& examples,
                                  const ModelEvalOptions& options);

// Early exit: the threshold at which the examples' thoughts and decoded tokens run `layers` layers
// on average (bisection over [0, 1]; the mean falls as the threshold rises). Throws when `layers`
// is outside [depth.exit_min_layers, L].
double exit_threshold_for_budget(const std::string& model_dir, const std::vector<Example>& examples,
                                 ModelEvalOptions options, double layers);
// Depth router: the gate threshold at which they run `layers` layers on average (bisection over
// [0, 1]; 0 runs every layer). Throws when the model has no router or `layers` is outside 0..L.
double router_threshold_for_budget(const std::string& model_dir, const std::vector<Example>& examples,
                                   ModelEvalOptions options, double layers);

// What a calibration chose, on its questions (for the summary): the rule ("flops" or "risk"), its
// target (the FLOPs fraction, or epsilon with delta) and what the chosen confidence gives there.
struct CascadeCalibrationReport {
  std::string rule;
  double target = 0, delta = 0;
  double confidence = 0, accuracy = 0, full_accuracy = 0, flops_fraction = 0;
  double risk = 0, p_value = 0;  // rule "risk"
  int64_t questions = 0;
};

// A depth cascade's confidence threshold for a FLOPs budget: the highest at which the examples'
// mean realised FLOPs stay within `fraction` of the full model's on the same examples (one run at
// full depth, one with every example taken through every level, then every threshold read off the
// levels' confidences). `cascade` gives the depths. Reports the threshold's accuracy and FLOPs on
// the examples through `log` (a line each). Throws when no threshold fits (the first level alone
// costs more).
double cascade_confidence_for_flops(const std::string& model_dir, const std::vector<Example>& examples,
                                    ModelEvalOptions options, const DepthCascade& cascade, double fraction,
                                    const std::function<void(const std::string&)>& log,
                                    CascadeCalibrationReport* report = nullptr);

// One calibration question taken through every level of a depth cascade: each level's answer
// confidence, FLOPs and whether its answer is right; and whether the full model's answer is right.
struct CascadeCalibrationQuestion {
  std::vector<double> confidence, flops;
  std::vector<bool> correct;
  bool full_correct = false;
};

// Where a question stops at threshold t: its first level whose confidence is above t, else the last.
size_t cascade_stop_level(const CascadeCalibrationQuestion& question, double threshold);

// Its p-values are eval/paired_test.h's binomial_tail_at_most.
struct CascadeRiskChoice {
  double threshold = -1;  // -1: no threshold passed, not even deepening every question
  double risk = 0, p_value = 1, accuracy = 0, mean_flops = 0;  // at the chosen threshold, on the questions
  int64_t thresholds_tested = 0;
};

// A confidence with a statistical guarantee (learn then test, Angelopoulos et al. 2021, as CALM,
// Schuster et al. 2022, uses it). A question's loss is 1 where the full model answers it right and
// the cascade at t does not (the accuracy the cascade loses against every layer). The thresholds
// the questions' confidences give are tested from the one that deepens every question down to 0,
// each against H0 "risk(t) > epsilon" with the binomial p-value; the chosen one is the lowest
// before the first that fails at level delta (fixed-sequence testing needs no multiplicity
// correction). Then, for new questions exchangeable with these, P(risk > epsilon) <= delta.
CascadeRiskChoice choose_cascade_threshold_for_risk(const std::vector<CascadeCalibrationQuestion>& questions, double epsilon,
                                                    double delta);

// That choice for a model: one run at full depth, one with every example through every level (as
// cascade_confidence_for_flops). Reports the choice through `log`; throws std::invalid_argument
// when no threshold passes (too few questions for epsilon and delta).
double cascade_confidence_for_risk(const std::string& model_dir, const std::vector<Example>& examples, ModelEvalOptions options,
                                   const DepthCascade& cascade, double epsilon, double delta,
                                   const std::function<void(const std::string&)>& log,
                                   CascadeCalibrationReport* report = nullptr);

}  // namespace coconut
