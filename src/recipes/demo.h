// The main job (`coconut demo`), in a few CPU minutes.
//   task prontoqa (default): the shipped ProntoQA models (models/prontoqa-cot, models/prontoqa-coconut,
//     trained here from scratch) on the released validation set; score the Coconut model's layers at
//     its continuous thoughts; remove the most redundant layer; heal it (distilled from the unpruned
//     model, on part of the training set); evaluate everything again. Where the models folder has
//     prosqa-coconut-anydepth, also that model on ProsQA at every layer and with its depth cascade.
//   task sums: the whole story on the running-sum task: generate data; train CoT, then the Coconut
//     curriculum from it, and a no-CoT baseline; then the same scoring, pruning and healing.
// Writes <out>/results.csv, <out>/report.md and its plots, and prints the table.
#pragma once

#include <ostream>
#include <string>

namespace coconut {

struct DemoOptions {
  std::string task = "prontoqa";  // prontoqa (needs the shipped models) | sums
  std::string out = "runs/demo";
  // prontoqa: where the shipped models and the datasets are (relative to the repository root).
  std::string models_dir = "models", data_dir = "data";
  int heal_examples = 2000;       // prontoqa: training questions the pruned model heals on
  int score_examples = 64;        // prontoqa: training questions the layers are scored on
  // sums:
  int digits = 4;               // the running sum's length: steps per question
  int train_examples = 6000, valid_examples = 300;  // prontoqa: valid_examples limits the released 200
  int cot_epochs = 3, epochs_per_stage = 2, nocot_epochs = 3, heal_epochs = 1;
  int max_latent_stage = 3;     // stages 1..max replace the first k steps by k thoughts (the last step stays in words)
  int latency_questions = 50;   // questions timed one at a time
  bool reuse = false;           // keep finished models from an earlier run (says so) instead of retraining
  bool force = false;           // replace `out` even when it is not an earlier demo's folder
  uint64_t seed = 0;
};

// Returns 0; throws on failure. Progress goes to `progress`.
int run_demo(const DemoOptions& options, std::ostream& progress);

}  // namespace coconut
