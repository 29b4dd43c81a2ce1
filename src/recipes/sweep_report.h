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

// One trained model's layer scores, as the sweep measured them.
struct SweepLayerScores {
  std::string positions;                        // where the angular distance was taken: latents | last
  std::string ablation_metric;                  // loss | accuracy
  double baseline = 0;                          // the unpruned model's ablation metric
  std::vector<std::vector<double>> angular;     // [n - 1][l]
  std::vector<double> influence;                // [L]
  std::vector<BlockScore> ablation;
};

struct SweepReport {
  double seconds = 0;                           // this invocation
  std::map<std::string, SweepLayerScores> layer_scores;  // by model name
};

// Writes <out>/accuracy_vs_flops.png, accuracy_vs_layers_removed.png, accuracy_vs_heads_removed.png
// (when heads were pruned), accuracy_vs_latents.png (when thoughts varied), layer_scores_<model>.png
// and report.md.
void write_sweep_report(const SweepConfig& config, const std::vector<SweepCell>& cells, const SweepReport& report,
                        std::ostream& progress);

}  // namespace coconut
