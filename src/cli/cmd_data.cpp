// coconut data: write a generated dataset (ProsQA-style graphs, ProntoQA questions, the demo's hop
// lookups, icot multiplication) in Coconut's JSON, or print statistics of a dataset file.
#include <cstdio>
#include <memory>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "data/example.h"
#include "data/hops.h"
#include "data/sums.h"
#include "data/prontoqa.h"
#include "data/prosqa.h"
#include "util/output_path.h"

namespace coconut::cli {
namespace {

struct DataFlags {
  std::string task, out, stats, names_from;
  std::vector<int> concepts, path_steps;  // prosqa: MIN MAX each (empty: the generator's defaults)
  int people = 0;                         // prosqa: 0 = the generator's default
  std::string shape = "funnel";           // prosqa: ProsqaShape (funnel | dead-ends | released)
  int count = 1000, digits = 0, modulus = 10;  // digits 0: the task's default (multiplication 4, sums 8)
  uint64_t seed = 0;
  bool force = false;
};

int run_data(const DataFlags& flags) {
  if (!flags.stats.empty()) {
    const auto examples = load_dataset(flags.stats);
    double steps = 0, words = 0;
    for (const auto& example : examples) {
      steps += static_cast<double>(example.steps.size());
      size_t count = 0;
      for (size_t i = 0; i < example.question.size(); ++i)
        if (example.question[i] != ' ' && (i == 0 || example.question[i - 1] == ' ')) ++count;
      words += static_cast<double>(count);
    }
    const auto n = static_cast<double>(examples.size());
    nlohmann::ordered_json summary = {{"examples", examples.size()}, {"mean_steps", steps / n}, {"mean_question_words", words / n}};
    // ProsQA-format graphs: the figures the generator is matched to the released set by.
    const auto graphs = graph_statistics(examples);
    if (graphs.nodes > 0)
      summary["prosqa_graphs"] = {{"nodes", graphs.nodes},
                                  {"edges", graphs.edges},
                                  {"min_steps", graphs.min_steps},
                                  {"max_steps", graphs.max_steps},
                                  {"root_reaches", graphs.root_reaches},
                                  {"answer_in_degree", graphs.answer_in_degree},
                                  {"other_option_in_degree", graphs.other_option_in_degree},
                                  {"options_are_leaves", graphs.options_are_leaves},
                                  {"answer_reached_by_others", graphs.target_reached_by_others}};
    std::printf("%s\n", summary.dump().c_str());
    return 0;
  }
  if (flags.task.empty() || flags.out.empty()) throw std::invalid_argument("give --task and --out (or --stats FILE)");
  check_output_path(flags.out, OutputKind::kFile, "--out", flags.force);
  std::vector<Example> examples;
  if (flags.task == "prosqa") {
    ProsqaOptions options;
    if (!flags.names_from.empty()) {
      std::tie(options.people_names, options.concept_names) = prosqa_symbol_vocabulary(load_dataset(flags.names_from));
      if (options.concept_names.empty()) throw std::invalid_argument(flags.names_from + ": no idx_to_symbol fields");
      std::fprintf(stderr, "name pools from %s: %zu people, %zu concepts\n", flags.names_from.c_str(),
                   options.people_names.size(), options.concept_names.size());
    }
    if (!flags.concepts.empty()) std::tie(options.min_concepts, options.max_concepts) = std::tie(flags.concepts[0], flags.concepts[1]);
    if (!flags.path_steps.empty()) std::tie(options.min_steps, options.max_steps) = std::tie(flags.path_steps[0], flags.path_steps[1]);
    if (flags.people > 0) options.people = flags.people;
    options.shape = flags.shape == "dead-ends" ? ProsqaShape::kDeadEnds
                    : flags.shape == "released" ? ProsqaShape::kReleased
                                                : ProsqaShape::kFunnel;
    examples = generate_prosqa(flags.count, flags.seed, options);
  }
  else if (flags.task == "prontoqa")
    examples = generate_prontoqa(flags.count, flags.seed);
  else if (flags.task == "hops")
    examples = generate_hops(flags.count, flags.seed);
  else if (flags.task == "sums")
    examples = generate_sums(flags.count, flags.seed, {flags.digits > 0 ? flags.digits : 8, flags.modulus});
  else if (flags.task == "multiplication")
    examples = generate_multiplication(flags.digits > 0 ? flags.digits : 4, flags.count, flags.seed);
  else
    throw std::invalid_argument("--task: '" + flags.task + "' is not prosqa, prontoqa, hops, sums or multiplication");
  save_coconut_json(flags.out, examples);
  std::fprintf(stderr, "wrote %zu %s examples to %s\n", examples.size(), flags.task.c_str(), flags.out.c_str());
  return 0;
}

const bool registered = register_command({"data", "generate a dataset (prosqa, prontoqa, hops, sums, multiplication) or print statistics",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<DataFlags>();
  app.add_option("--task", flags->task, "prosqa | prontoqa (questions in the released shape, data/prontoqa.h) | hops | sums | multiplication");
  app.add_option("--count", flags->count, "examples")->capture_default_str()
      ->check(in_range(1, 1e8));
  app.add_option("--seed", flags->seed, "generator seed")->capture_default_str();
  app.add_option("--digits", flags->digits, "multiplication: digits per operand (default 4); sums: digits per question (default 8)")
      ->check(in_range(1, 64));
  app.add_option("--modulus", flags->modulus, "sums: the modulus")->capture_default_str()
      ->check(in_range(2, 1e9));
  app.add_option("--names-from", flags->names_from, "prosqa: take the people and concept names (only) from this ProsQA file");
  // Smaller graphs for a curriculum: fewer concepts and shorter paths mean shorter questions.
  app.add_option("--concepts", flags->concepts, "prosqa: MIN MAX concept nodes per graph (default 16 24)")
      ->expected(2)->check(CLI::PositiveNumber);
  app.add_option("--path-steps", flags->path_steps, "prosqa: MIN MAX steps of the answer's shortest path from the root, its first edge from the person "
                 "included (default 3 6; MIN >= 2, and the concepts at least twice MAX)")->expected(2)->check(CLI::PositiveNumber);
  app.add_option("--people", flags->people, "prosqa: at most N people per graph, each graph drawing 2, 3, 4... as the released set does (60%, 31%, 7%...; default 3, at least 2)")->check(CLI::PositiveNumber);
  app.add_option("--shape", flags->shape, "prosqa: how the root's part lies around the answer's path: funnel (default: nearly every "
                 "concept leads to the answer, whose depth is uniform) or dead-ends (as the released graphs: a path with dead ends off it, "
                 "the released depths of both options) or released (dead-ends, and the released concept counts, edge densities, edges back up "
                 "and a parent for every concept)")->check(CLI::IsMember({"funnel", "dead-ends", "released"}));
  app.add_option("--out", flags->out, "output file (Coconut JSON)");
  app.add_flag("--force", flags->force, "replace --out even when it is not a regular file");
  app.add_option("--stats", flags->stats, "print statistics of this dataset instead");
  return [flags] { return run_data(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
