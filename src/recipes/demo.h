// The main job (`coconut demo`): the whole story on the running-sum task in a few CPU minutes.
// Generate data; train CoT, then the Coconut curriculum from it, and a no-CoT baseline; evaluate
// all three; score the Coconut model's layers at its continuous thoughts; remove the most
// redundant layer; heal it (distilled from the unpruned model); evaluate again. Writes
// <out>/results.csv, <out>/report.md and its plots, and prints the table.
#pragma once

#include <ostream>
#include <string>

namespace coconut {

struct DemoOptions {
  std::string out = "runs/demo";
  int digits = 4;               // the running sum's length: steps per question
  int train_examples = 6000, valid_examples = 300;
  int cot_epochs = 3, epochs_per_stage = 2, nocot_epochs = 3, heal_epochs = 1;
  int max_latent_stage = 3;     // stages 1..max replace the first k steps by k thoughts (the last step stays in words)
  int latency_questions = 50;   // questions timed one at a time
  bool reuse = false;           // keep finished models from an earlier run (says so) instead of retraining
  uint64_t seed = 0;
};

// Returns 0; throws on failure. Progress goes to `progress`.
int run_demo(const DemoOptions& options, std::ostream& progress);

}  // namespace coconut
