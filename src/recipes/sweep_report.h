// The sweep's report: plots (gnuplot PNGs) and <out>/report.md from the cells of a sweep.
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "pruning/selection.h"
#include "recipes/pruning.h"
#include "recipes/sweep.h"

namespace coconut {

// One trained model's layer and head scores, as the sweep measured them (once; kept in
// <out>/scores/<model>.json) and its report shows them.
struct ModelScores {
  std::vector<std::vector<double>> angular;          // [n - 1][l]; NaN where l + n > L
  std::vector<double> influence;                     // [L]
  std::vector<BlockScore> ablation;                  // blocks of every size asked for
  std::vector<std::vector<double>> head_importance;  // [L][units]
  std::string positions;                             // where angular was measured: latents | last
  std::string ablation_metric;                       // loss | accuracy (the sweep's, not in the JSON)
  double baseline = 0;                               // the unpruned model's ablation metric
};

struct SweepReport {
  double seconds = 0;                                // this invocation
  std::map<std::string, ModelScores> layer_scores;   // by model name
};

// Writes <out>/accuracy_vs_flops.png, accuracy_vs_layers_removed.png, accuracy_vs_heads_removed.png
// (when heads were pruned), accuracy_vs_latents.png (when thoughts varied), layer_scores_<model>.png
// and report.md.
void write_sweep_report(const SweepConfig& config, const std::vector<SweepCell>& cells, const SweepReport& report,
                        std::ostream& progress);

}  // namespace coconut
