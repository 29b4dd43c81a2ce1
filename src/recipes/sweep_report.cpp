#include "recipes/sweep_report.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "util/atomic_file.h"
#include "util/gnuplot.h"

namespace coconut {
namespace {

// One line of a plot: points (x, y) with a title.
struct Series {
  std::string title;
  std::vector<std::pair<double, double>> points;
};

// Accuracy (%) of several series in one PNG, each drawn `style`, sorted by x.
void plot_series(const std::vector<Series>& series, const std::string& png, const std::string& title, const std::string& xlabel,
                 const std::string& ylabel, const std::string& style, std::vector<std::string> settings = {}) {
  Figure figure{title, xlabel, ylabel, 1000, 650};
  figure.yrange = {{0, 105}};
  figure.settings = std::move(settings);
  for (const auto& one : series) {
    PlotSeries drawn{one.title, one.points, style};
    drawn.sort_by_x = true;
    figure.series.push_back(std::move(drawn));
  }
  plot_figure(figure, png);
}

int64_t report_latents(const SweepConfig& config) {
  if (config.report_latents >= 0) return config.report_latents;
  return config.latents.empty() ? -1 : *std::max_element(config.latents.begin(), config.latents.end());
}

// The thoughts at which a model's structural variants are compared.
int64_t compared_latents(const SweepConfig& config, const SweepCell& cell) {
  return cell.mode == "coconut" && !config.latents.empty() ? report_latents(config) : -1;
}

const SweepCell* find_cell(const std::vector<SweepCell>& cells, const std::string& model, const std::string& structure,
                           const std::string& score, int64_t layers_removed, double head_fraction, bool healed, int64_t latents) {
  for (const auto& cell : cells)
    if (cell.model == model && cell.structure == structure && cell.score == score && cell.layers_removed == layers_removed &&
        std::abs(cell.head_fraction - head_fraction) < 1e-9 && cell.healed == healed && cell.latents == latents)
      return &cell;
  return nullptr;
}

std::string percent(double accuracy) { return fmt::format("{:.1f}%", 100 * accuracy); }
std::string mflop(double flops) { return fmt::format("{:.3g}", flops / 1e6); }

std::string cells_table(const std::vector<const SweepCell*>& cells) {
  std::ostringstream table;
  table << "| cell | removed | layers | parameters | accuracy | tokens | thoughts | MFLOP / answer | latency / answer |\n"
        << "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto* c : cells)
    table << fmt::format("| {} | {} | {} | {} | {} | {:.1f} | {:.1f} | {} | {:.2f} ms |\n", c->label(),
                         c->dropped.empty() ? "-" : c->dropped, c->layers, c->parameters, percent(c->accuracy),
                         c->generated_tokens, c->latent_thoughts, mflop(c->flops_per_answer), 1e3 * c->latency_seconds);
  return table.str();
}

// What the cells were scored on: the test file when the config names one, else the validation
// file (never trained on: healing validates on a split of its own training data), else generated.
std::string evaluated_on(const SweepData& data) {
  if (!data.test.empty()) return "the test file `" + data.test + "`";
  if (!data.valid.empty()) return "the validation file `" + data.valid + "`";
  return "a generated test set";
}

// Which layers the models rely on: the scores per layer, a table and a heatmap each.
void layer_scores_section(const std::string& out, const SweepReport& report, std::ostringstream& md) {
  for (const auto& [model, scores] : report.layer_scores) {
    if (scores.angular.empty()) continue;
    const std::string png = out + "/layer_scores_" + model + ".png";
    plot_heatmap(scores.angular, png, "angular distance d(x_l, x_l+n) at the " + std::string(scores.positions == "latents" ? "latent thoughts" : "last token") + " (" + model + ")",
                 "first layer l", "block size n", 1, "distance");
    md << "### Layer scores of " << model << "\n\n| layer | angular distance to the next (" << scores.positions
       << ") | block influence | " << scores.ablation_metric << " without it |\n|---|---|---|---|\n";
    int64_t worst = -1, best = -1;
    double worst_value = 0, best_value = 0;
    const bool higher_is_better = scores.ablation_metric == "accuracy";
    for (size_t l = 0; l < scores.influence.size(); ++l) {
      double ablated = std::nan("");
      for (const auto& block : scores.ablation)
        if (block.size == 1 && block.start == static_cast<int64_t>(l)) ablated = block.score;
      md << fmt::format("| {} | {:.3f} | {:.3f} | {:.4f} |\n", l, scores.angular[0][l], scores.influence[l], ablated);
      const double harm = higher_is_better ? -ablated : ablated;
      if (worst < 0 || harm > worst_value) worst = static_cast<int64_t>(l), worst_value = harm;
      if (best < 0 || harm < best_value) best = static_cast<int64_t>(l), best_value = harm;
    }
    md << fmt::format("\nUnpruned {}: {:.4f}. Removing layer {} hurts most, layer {} least", scores.ablation_metric,
                      scores.baseline, worst, best)
       << (scores.positions == "latents" ? "; the angular distances are taken at the continuous thoughts, so they say which "
                                           "layers move the latent reasoning state" : "")
       << fmt::format(".\n\n![layer scores of {0}](layer_scores_{0}.png)\n\n", model);
  }

}

// A text sweep's report (task: text): every cell's perplexity and mean acc_norm against its FLOPs per
// token, by layers removed.
void write_text_sweep_report(const SweepConfig& config, const std::vector<SweepCell>& cells, const SweepReport& report,
                             std::ostream& progress) {
  const std::string out = config.output_dir;
  std::ostringstream md;
  md << "# coconut sweep: pruning measured on plain text\n\n"
     << fmt::format("Config: `{}`; {} cells; this invocation took {:.0f} s. Perplexity of the first {} tokens of `{}` in "
                    "non-overlapping windows of {} (`eval-lm --text`); accuracy: the mean acc_norm over {} (`eval-lm --choices`"
                    "{}); FLOPs per token of a forward at a context of {}; time per window of the perplexity run. Layer and head "
                    "scores measured on `{}`, healing on `{}`.\n\n",
                    config.source, cells.size(), report.seconds, config.data.test_tokens, config.data.test, config.data.window,
                    config.data.choices.empty() ? std::string("no choice sets") : fmt::format("`{}`", fmt::join(config.data.choices, "`, `")),
                    config.data.choice_items > 0 ? fmt::format(", the first {} items of each", config.data.choice_items) : "",
                    config.data.window, config.data.valid, config.data.train);
  std::vector<Series> perplexity, accuracy;
  for (const auto& model : config.pruning.models)
    for (bool healed : config.pruning.heal)
      for (const auto& score : config.pruning.layer_scores) {
        Series ppl{model + " " + score + (healed ? " healed" : ""), {}}, acc{ppl.title, {}};
        for (const auto& cell : cells)
          if (cell.model == model && (cell.structure == "full" ||
                                      (cell.structure == "layers" && cell.score == score && cell.healed == healed))) {
            ppl.points.push_back({static_cast<double>(cell.layers_removed), cell.perplexity});
            acc.points.push_back({cell.flops_per_answer / 1e9, 100 * cell.accuracy});
          }
        if (ppl.points.size() > 1) perplexity.push_back(ppl), accuracy.push_back(acc);
      }
  if (!perplexity.empty()) {
    Figure figure{"perplexity of the test text vs layers removed, by score, healed and not", "layers removed",
                  "perplexity (log scale)", 1000, 650};
    figure.settings = {"logscale y", "xtics 1"};
    for (const auto& one : perplexity) {
      PlotSeries drawn{one.title, one.points, "linespoints linewidth 2 pointsize 1.3"};
      drawn.sort_by_x = true;
      figure.series.push_back(std::move(drawn));
    }
    plot_figure(figure, out + "/perplexity_vs_layers_removed.png");
    if (!config.data.choices.empty())
      plot_series(accuracy, out + "/accuracy_vs_flops.png", "mean acc_norm vs FLOPs per token, by score, healed and not",
                  "GFLOP per token", "mean acc_norm (%)", "linespoints linewidth 2 pointsize 1.3");
    md << "## Layers removed\n\n![perplexity vs layers removed](perplexity_vs_layers_removed.png)\n\n"
       << (config.data.choices.empty() ? "" : "![mean acc_norm vs FLOPs per token](accuracy_vs_flops.png)\n\n");
  }
  layer_scores_section(out, report, md);
  md << "## Every cell\n\n| cell | removed | layers | parameters | perplexity | mean acc_norm | GFLOP / token | ms / window |\n"
     << "|---|---|---|---|---|---|---|---|\n";
  for (const auto& c : cells)
    md << fmt::format("| {} | {} | {} | {} | {:.2f} | {} | {:.3f} | {:.0f} |\n", c.label(), c.dropped.empty() ? "-" : c.dropped,
                      c.layers, c.parameters, c.perplexity, config.data.choices.empty() ? "-" : percent(c.accuracy),
                      c.flops_per_answer / 1e9, 1e3 * c.latency_seconds);
  md << "\nThe same as CSV: `results.csv` (with each cell's model folder).\n";
  write_file_atomically(out + "/report.md", md.str());
  progress << "report: " << out << "/report.md (plots beside it), results: " << out << "/results.csv\n";
}

}  // namespace

void write_sweep_report(const SweepConfig& config, const std::vector<SweepCell>& cells, const SweepReport& report,
                        std::ostream& progress) {
  if (config.data.text()) return write_text_sweep_report(config, cells, report, progress);
  const std::string out = config.output_dir;
  std::ostringstream md;
  md << "# coconut sweep: test-time compute vs accuracy\n\n"
     << fmt::format("Config: `{}`; {} cells; this invocation took {:.0f} s. Accuracy on {} questions per cell, of {} "
                    "(greedy, the reference's answer rule); FLOPs per answer from the exact accounting (prompt, thoughts, "
                    "generated tokens); latency per answer measured one question at a time on the first {}.\n\n",
                    config.source, cells.size(), report.seconds, cells.empty() ? 0 : cells[0].questions,
                    evaluated_on(config.data), config.latency_questions);
  if (cells.empty()) {
    write_file_atomically(out + "/report.md", md.str() + "No cells.\n");
    return;
  }

  // 1. Every cell against its compute, and the frontier; thought controls left out (a control tests
  // the thoughts, it is not a way to answer).
  std::vector<double> cost, accuracy;
  std::vector<size_t> answering;  // the cells that are not controls
  for (size_t i = 0; i < cells.size(); ++i)
    if (cells[i].structure != "control") {
      answering.push_back(i);
      cost.push_back(cells[i].flops_per_answer), accuracy.push_back(cells[i].accuracy);
    }
  std::vector<size_t> frontier;
  for (size_t i : pareto_frontier(cost, accuracy)) frontier.push_back(answering[i]);
  {
    std::vector<Series> by_model;
    for (const auto& model : config.models) {
      Series series{model.name + " (" + model.mode + ")", {}};
      for (const auto& cell : cells)
        if (cell.model == model.name && cell.structure != "control")
          series.points.push_back({cell.flops_per_answer / 1e6, 100 * cell.accuracy});
      by_model.push_back(series);
    }
    const double lo = *std::min_element(cost.begin(), cost.end()), hi = *std::max_element(cost.begin(), cost.end());
    Figure figure{"accuracy vs compute per answer: every cell, the Pareto frontier joined and labelled", "MFLOP per answer",
                  "accuracy (%)", 1100, 700};
    figure.yrange = {{0, 105}};
    figure.logscale_x = hi > 20 * lo && lo > 0;
    for (const auto& model : by_model) figure.series.push_back({model.title, model.points, "points pointtype 7 pointsize 1.3"});
    PlotSeries joined{"Pareto frontier", {}, "lines linewidth 2 linecolor 'black'"};
    joined.label_style = "left offset char 1,-0.6 rotate by 20 font ',8'";
    for (size_t i : frontier) {
      joined.points.push_back({cells[i].flops_per_answer / 1e6, 100 * cells[i].accuracy});
      joined.labels.push_back(cells[i].label());
    }
    figure.series.push_back(joined);
    plot_figure(figure, out + "/accuracy_vs_flops.png");
  }
  md << "## The Pareto frontier\n\nNo other cell is at least as accurate for at most the same FLOPs per answer:\n\n";
  std::vector<const SweepCell*> frontier_cells;
  for (size_t i : frontier) frontier_cells.push_back(&cells[i]);
  md << cells_table(frontier_cells) << "\n![accuracy vs FLOPs per answer](accuracy_vs_flops.png)\n\n";

  // 2. Depth: accuracy vs layers removed, per score, healed and not.
  std::vector<Series> depth;
  for (const auto& model : config.pruning.models)
    for (bool healed : config.pruning.heal)
      for (const auto& score : config.pruning.layer_scores) {
        const SweepCell* full = nullptr;
        for (const auto& cell : cells)
          if (cell.model == model && cell.structure == "full" && cell.latents == compared_latents(config, cell)) full = &cell;
        Series series{model + " " + score + (healed ? " healed" : ""), {}};
        if (full) series.points.push_back({0, 100 * full->accuracy});
        for (int64_t k : config.pruning.layers_removed)
          if (full)
            if (const auto* cell = find_cell(cells, model, "layers", score, k, 0, healed, full->latents))
              series.points.push_back({static_cast<double>(k), 100 * cell->accuracy});
        if (series.points.size() > 1) depth.push_back(series);
      }
  if (!depth.empty()) {
    const int64_t max_removed = *std::max_element(config.pruning.layers_removed.begin(), config.pruning.layers_removed.end());
    plot_series(depth, out + "/accuracy_vs_layers_removed.png", "accuracy vs layers removed, by score, healed and not",
                "layers removed", "accuracy (%)", "linespoints linewidth 2 pointsize 1.3", {"xtics 1"});
    md << "## Depth: layers removed\n\n"
       << (report_latents(config) >= 0 ? fmt::format("Coconut-mode models compared at {} thoughts. ", report_latents(config)) : "")
       << "Each score chooses which layers go (angular: the block of k consecutive layers whose input and output are "
          "closest, Gromov et al.; bi: the k layers of least block influence, ShortGPT; ablation: the block whose removal "
          "hurts the " << config.pruning.ablation_metric << " least).\n\n| model, score | ";
    for (int64_t k = 0; k <= max_removed; ++k)
      md << "-" << k << " |";
    md << "\n|---|";
    for (int64_t k = 0; k <= max_removed; ++k)
      md << "---|";
    md << "\n";
    for (const auto& series : depth) {
      md << "| " << series.title << " |";
      for (int64_t k = 0; k <= max_removed; ++k) {
        const auto point = std::find_if(series.points.begin(), series.points.end(), [&](const auto& p) { return p.first == k; });
        md << " " << (point == series.points.end() ? "" : fmt::format("{:.1f}%", point->second)) << " |";
      }
      md << "\n";
    }
    md << "\nLayers each score removed: ";
    std::set<std::string> seen;
    for (const auto& cell : cells)
      if (cell.structure == "layers" && !cell.healed && seen.insert(cell.model + cell.score + std::to_string(cell.layers_removed)).second)
        md << fmt::format("{} {} -{}: [{}]; ", cell.model, cell.score, cell.layers_removed, cell.dropped);
    md << "\n\n![accuracy vs layers removed](accuracy_vs_layers_removed.png)\n\n";
  }

  // Adaptive depth: early exit and learned routers against static layer removal at the same thoughts.
  const bool any_depth = !config.prefix_depths.empty() || !config.cascades.empty() || !config.cascade_flops.empty() ||
                         !config.cascade_risk.empty();
  if (!config.exit_thresholds.empty() || !config.router.penalties.empty() || any_depth) {
    std::vector<const SweepCell*> rows;
    std::vector<Series> adaptive;
    for (const auto& model : config.pruning.models) {
      Series exits{model + " early exit", {}}, removed{model + " layers removed", {}}, healed{model + " layers removed, healed", {}};
      std::map<std::string, Series> routers;  // per penalty, over the gate thresholds
      Series prefixes{model + " first K layers", {}}, cascades{model + " depth cascade", {}};
      for (const auto& cell : cells) {
        if (cell.model != model || cell.latents != compared_latents(config, cell)) continue;
        const std::pair<double, double> point{cell.flops_per_answer / 1e6, 100 * cell.accuracy};
        if (cell.structure == "full") rows.push_back(&cell);
        if (!config.exit_thresholds.empty() && (cell.structure == "exit" || cell.structure == "full")) exits.points.push_back(point);
        if (cell.structure == "exit" || cell.structure == "router" || cell.structure == "layers" || cell.structure == "prefix" ||
            cell.structure == "cascade")
          rows.push_back(&cell);
        if (!config.prefix_depths.empty() && (cell.structure == "prefix" || cell.structure == "full")) prefixes.points.push_back(point);
        if (cell.structure == "cascade") cascades.points.push_back(point);
        if (cell.structure == "router") {
          auto& series = routers[cell.score];
          series.title = model + " router " + cell.score;
          series.points.push_back(point);
        }
        if (cell.structure == "full" || (cell.structure == "layers" && !cell.healed)) removed.points.push_back(point);
        if (cell.structure == "full" || (cell.structure == "layers" && cell.healed)) healed.points.push_back(point);
      }
      for (auto* series : {&exits, &removed, &healed, &prefixes}) {
        std::sort(series->points.begin(), series->points.end());  // lines run left to right
        if (series->points.size() > 1) adaptive.push_back(*series);
      }
      std::sort(cascades.points.begin(), cascades.points.end());
      if (!cascades.points.empty()) adaptive.push_back(cascades);
      for (auto& [penalty, series] : routers) std::sort(series.points.begin(), series.points.end());
      for (const auto& [penalty, series] : routers) adaptive.push_back(series);
    }
    std::sort(rows.begin(), rows.end(), [](const SweepCell* a, const SweepCell* b) { return a->flops_per_answer < b->flops_per_answer; });
    if (!adaptive.empty())
      plot_series(adaptive, out + "/adaptive_vs_static.png", "adaptive depth vs static layer removal: accuracy vs compute per answer",
                  "MFLOP per answer", "accuracy (%)", "linespoints linewidth 2 pointsize 1.3");
    md << "## Adaptive depth vs static pruning\n\n";
    if (!config.exit_thresholds.empty())
      md << "Early exit: a thought or decoded token stops at the first layer (after " << config.exit_min_layers
         << ") that moves its state by less than the threshold in angular distance; the layers it skips still compute its "
            "K/V from the exit state, which the FLOPs count. ";
    if (!config.router.penalties.empty())
      md << "Router: a learned gate per layer decides for each thought and decoded token whether the layer runs (trained "
            "like healing, with a compute penalty on the expected layers run; one router per penalty p, evaluated at each "
            "gate threshold); a skipped layer still writes the position's K/V from its input, exactly what it would have "
            "written. ";
    if (!config.exit_thresholds.empty() || !config.router.penalties.empty())
      md << "For early exit and routers the prompt runs every layer. ";
    if (!config.prefix_depths.empty())
      md << "First K layers: the whole answer (prompt, thoughts, tokens) runs the model's first K layers, what a model trained "
            "with stochastic depth (layer_drop, prefix_drop) is made for. ";
    if (!config.cascades.empty() || !config.cascade_flops.empty() || !config.cascade_risk.empty())
      md << "Depth cascade: each question runs at the first depth of the cascade, and one whose least confident answer "
            "token is at or below the confidence goes on at the next depth from the kept prompt state; its FLOPs count every "
            "level it ran (a cascade calibrated to a FLOPs fraction or chosen for a risk had its confidence chosen on the valid "
            "questions; risk: the share the full model answers right and the cascade does not, within epsilon with "
            "probability 1 - delta for questions like those). ";
    md << "\n\n"
       << "| cell | layers per thought/token | accuracy | MFLOP / answer | latency / answer |\n|---|---|---|---|---|\n";
    for (const auto* c : rows)
      md << fmt::format("| {} | {:.2f} | {} | {} | {:.2f} ms |\n", c->label(),
                        c->structure == "exit" || c->structure == "router" || c->structure == "cascade" ? c->mean_layers : c->layers,
                        percent(c->accuracy), mflop(c->flops_per_answer), 1e3 * c->latency_seconds);
    md << "\n![adaptive depth vs static pruning](adaptive_vs_static.png)\n\n";
  }

  layer_scores_section(out, report, md);

  // Width: heads removed.
  if (!config.pruning.head_fractions.empty()) {
    std::vector<Series> width;
    for (const auto& model : config.pruning.models)
      for (bool healed : config.pruning.heal) {
        Series series{model + (healed ? " healed" : ""), {}};
        const SweepCell* full = nullptr;
        for (const auto& cell : cells)
          if (cell.model == model && cell.structure == "full" && cell.latents == compared_latents(config, cell)) full = &cell;
        if (!full) continue;
        series.points.push_back({0, 100 * full->accuracy});
        for (double fraction : config.pruning.head_fractions)
          if (const auto* cell = find_cell(cells, model, "heads", "grad", 0, fraction, healed, full->latents))
            series.points.push_back({100 * fraction, 100 * cell->accuracy});
        if (series.points.size() > 1) width.push_back(series);
      }
    if (!width.empty()) {
      plot_series(width, out + "/accuracy_vs_heads_removed.png",
                  "accuracy vs query heads removed (Michel et al. gradient importance), healed and not",
                  "query heads removed (%)", "accuracy (%)", "linespoints linewidth 2 pointsize 1.3");
      std::vector<const SweepCell*> rows;
      for (const auto& cell : cells)
        if (cell.structure == "heads" && cell.latents == compared_latents(config, cell)) rows.push_back(&cell);
      md << "## Width: attention heads removed (" << config.pruning.head_granularity << " granularity)\n\n"
         << cells_table(rows) << "\n![accuracy vs heads removed](accuracy_vs_heads_removed.png)\n\n";
    }
  }

  // Test-time thoughts.
  if (config.latents.size() > 1) {
    std::vector<Series> thoughts;
    std::map<std::string, size_t> index;
    for (const auto& cell : cells) {
      if (cell.mode != "coconut") continue;
      SweepCell variant = cell;
      variant.latents = -1;
      const std::string title = variant.label();
      if (!index.count(title)) index[title] = thoughts.size(), thoughts.push_back({title, {}});
      thoughts[index[title]].points.push_back({static_cast<double>(cell.latents), 100 * cell.accuracy});
    }
    if (!thoughts.empty()) {
      plot_series(thoughts, out + "/accuracy_vs_latents.png", "accuracy vs continuous thoughts at evaluation, per structural variant",
                  "continuous thoughts", "accuracy (%)", "linespoints linewidth 2 pointsize 1.3", {"xtics 1"});
      md << "## Test-time thoughts\n\n| variant |";
      for (int64_t k : config.latents) md << " " << k << " |";
      md << "\n|---|";
      for (size_t i = 0; i < config.latents.size(); ++i) md << "---|";
      md << "\n";
      for (const auto& series : thoughts) {
        md << "| " << series.title << " |";
        for (int64_t k : config.latents) {
          const auto point = std::find_if(series.points.begin(), series.points.end(), [&](const auto& p) { return p.first == k; });
          md << " " << (point == series.points.end() ? "" : fmt::format("{:.1f}%", point->second)) << " |";
        }
        md << "\n";
      }
      md << "\n![accuracy vs thoughts](accuracy_vs_latents.png)\n\n";
    }
  }

  // Thought controls: each Coconut model's accuracy with its thoughts replaced, beside the normal run.
  if (!config.thought_controls.empty()) {
    md << "## Thought controls\n\nThe same questions with every continuous thought replaced: zero (no thoughts, the markers "
          "kept), noise (Gaussian noise of the thought's RMS), shuffle (another question's thoughts), mean (the mean thought "
          "of the valid questions), token (the embedding of the thought's likeliest token). `coconut eval --thought-control` "
          "gives the same run with McNemar's test against the normal one.\n\n| model, thoughts | normal |";
    for (const auto& control : config.thought_controls) md << " " << control << " |";
    md << "\n|---|---|";
    for (size_t i = 0; i < config.thought_controls.size(); ++i) md << "---|";
    md << "\n";
    for (const auto& normal : cells) {
      if (normal.structure != "full" || normal.mode != "coconut") continue;
      md << "| " << normal.label() << " | " << percent(normal.accuracy) << " |";
      for (const auto& control : config.thought_controls) {
        const auto found = std::find_if(cells.begin(), cells.end(), [&](const SweepCell& cell) {
          return cell.model == normal.model && cell.structure == "control" && cell.score == control && cell.latents == normal.latents;
        });
        md << " " << (found == cells.end() ? std::string("") : percent(found->accuracy)) << " |";
      }
      md << "\n";
    }
    md << "\n";
  }

  std::vector<const SweepCell*> all;
  for (const auto& cell : cells) all.push_back(&cell);
  md << "## Every cell\n\n" << cells_table(all) << "\nThe same as CSV: `results.csv` (with each cell's model folder).\n";
  write_file_atomically(out + "/report.md", md.str());
  progress << "report: " << out << "/report.md (plots beside it), results: " << out << "/results.csv\n";
}

}  // namespace coconut
