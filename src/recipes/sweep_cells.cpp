// The sweep's cells: what identifies one across runs, its label, the results.csv format (and the
// older one without the router's own threshold column), and the Pareto frontier.
#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "recipes/sweep.h"

namespace coconut {

// ---------------------------------------------------------------------------------------------
// Cells, CSV, Pareto

std::string SweepCell::key() const {
  // One threshold slot: a cell has at most one of the two (a router cell's gate, or early exit).
  return fmt::format("{}|{}|{}|{}|{:.4f}|{}|{}|{:.5f}", model, structure, score, layers_removed, head_fraction, healed ? 1 : 0,
                     latents, structure == "router" ? router_threshold : exit_threshold);
}

std::string SweepCell::label() const {
  std::string text = model;
  if (structure == "layers") text += fmt::format(" -{}L {}", layers_removed, score);
  if (structure == "heads") text += fmt::format(" -{:.0f}% heads", 100 * head_fraction);
  if (structure == "exit") text += fmt::format(" exit<{:g}", exit_threshold);
  if (structure == "router") text += fmt::format(" router {} gate>{:g}", score, router_threshold);
  if (structure == "prefix") text += " first " + score.substr(5) + " layers";
  if (structure == "cascade") text += " cascade " + (dropped.empty() || score == dropped ? score : score + " (" + dropped + ")");
  if (structure == "control") text += " thoughts " + score;
  if (healed) text += " healed";
  if (latents >= 0) text += fmt::format(", {} thoughts", latents);
  return text;
}

namespace {
const char* kCsvHeader =
    "model,mode,structure,score,layers_removed,dropped,head_fraction,healed,latents,accuracy,generated_tokens,"
    "latent_thoughts,flops_per_answer,latency_seconds,parameters,layers,questions,exit_threshold,router_threshold,mean_layers,"
    "model_dir,perplexity";
// Before text sweeps, without the perplexity column.
const char* kCsvHeaderWithoutPerplexity =
    "model,mode,structure,score,layers_removed,dropped,head_fraction,healed,latents,accuracy,generated_tokens,"
    "latent_thoughts,flops_per_answer,latency_seconds,parameters,layers,questions,exit_threshold,router_threshold,mean_layers,"
    "model_dir";
// Before the router's gate had a column of its own, a router cell kept it in exit_threshold.
const char* kCsvHeaderWithoutRouterThreshold =
    "model,mode,structure,score,layers_removed,dropped,head_fraction,healed,latents,accuracy,generated_tokens,"
    "latent_thoughts,flops_per_answer,latency_seconds,parameters,layers,questions,exit_threshold,mean_layers,model_dir";
}

std::string cells_to_csv(const std::vector<SweepCell>& cells) {
  std::ostringstream csv;
  csv << kCsvHeader << "\n";
  for (const auto& c : cells)
    csv << fmt::format("{},{},{},{},{},{},{:.4f},{},{},{:.6f},{:.4f},{:.4f},{:.1f},{:.6f},{},{},{},{:.5f},{:.5f},{:.4f},{},{:.6g}\n",
                       c.model, c.mode, c.structure, c.score, c.layers_removed, c.dropped, c.head_fraction, c.healed ? 1 : 0,
                       c.latents, c.accuracy, c.generated_tokens, c.latent_thoughts, c.flops_per_answer, c.latency_seconds,
                       c.parameters, c.layers, c.questions, c.exit_threshold, c.router_threshold, c.mean_layers, c.model_dir,
                       c.perplexity);
  return csv.str();
}

std::vector<SweepCell> cells_from_csv(const std::string& text, const std::string& source) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) ||
      (line != kCsvHeader && line != kCsvHeaderWithoutPerplexity && line != kCsvHeaderWithoutRouterThreshold))
    throw std::invalid_argument(source + ": not a sweep results file (its header differs)");
  const bool router_column = line != kCsvHeaderWithoutRouterThreshold, perplexity_column = line == kCsvHeader;
  const size_t expected = perplexity_column ? 22 : router_column ? 21 : 20;
  std::vector<SweepCell> cells;
  int line_number = 1;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.empty()) continue;
    std::vector<std::string> fields;
    std::stringstream row(line);
    std::string field;
    while (std::getline(row, field, ',')) fields.push_back(field);
    if (!line.empty() && line.back() == ',') fields.emplace_back();
    if (fields.size() != expected)
      throw std::invalid_argument(fmt::format("{}:{}: expected {} fields, found {}", source, line_number, expected, fields.size()));
    try {
      SweepCell c;
      c.model = fields[0], c.mode = fields[1], c.structure = fields[2], c.score = fields[3];
      c.layers_removed = std::stoll(fields[4]);
      c.dropped = fields[5];
      c.head_fraction = std::stod(fields[6]);
      c.healed = fields[7] == "1";
      c.latents = std::stoll(fields[8]);
      c.accuracy = std::stod(fields[9]), c.generated_tokens = std::stod(fields[10]), c.latent_thoughts = std::stod(fields[11]);
      c.flops_per_answer = std::stod(fields[12]), c.latency_seconds = std::stod(fields[13]);
      c.parameters = std::stoll(fields[14]), c.layers = std::stoll(fields[15]), c.questions = std::stoll(fields[16]);
      size_t next = 17;
      c.exit_threshold = std::stod(fields[next++]);
      if (router_column) {
        c.router_threshold = std::stod(fields[next++]);
      } else if (c.structure == "router") {
        c.router_threshold = c.exit_threshold;
        c.exit_threshold = 0;
      }
      c.mean_layers = std::stod(fields[next++]);
      c.model_dir = fields[next++];
      if (perplexity_column) c.perplexity = std::stod(fields[next]);
      cells.push_back(c);
    } catch (const std::logic_error&) {
      throw std::invalid_argument(fmt::format("{}:{}: a number field does not parse", source, line_number));
    }
  }
  return cells;
}

std::vector<size_t> pareto_frontier(const std::vector<double>& cost, const std::vector<double>& accuracy) {
  if (cost.size() != accuracy.size()) throw std::invalid_argument("pareto_frontier: cost and accuracy differ in length");
  std::vector<size_t> order(cost.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Cheapest first; at equal cost the most accurate first, so it is the one kept.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return cost[a] != cost[b] ? cost[a] < cost[b] : accuracy[a] > accuracy[b];
  });
  std::vector<size_t> frontier;
  double best = -std::numeric_limits<double>::infinity();
  for (size_t i : order)
    if (accuracy[i] > best) {
      frontier.push_back(i);
      best = accuracy[i];
    }
  return frontier;
}

}  // namespace coconut
