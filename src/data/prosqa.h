// ProsQA-style graph reasoning (Coconut paper, appendix): a random DAG of fictional concepts with
// people at its roots; "Is Tom a X or Y?" where exactly one of X, Y is reachable from Tom; the steps
// walk the shortest path; the answer names the reachable one. Seeded and reproducible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/example.h"

namespace coconut {

// How the root's part of a graph is laid out around the answer's path. Measured on 5,000 graphs of
// each (people 4, names from the released set) against the 300 released validation graphs, whose
// structure only was counted:
// - kFunnel (the default, and all data made before 2026-11-26): the answer's depth is uniform in
//   min_steps..max_steps and the other option's in 1..answer-1; the root's concepts sit at levels
//   1..answer depth and any of them may take an edge one level down, the answer's path included, so
//   nearly all of them lead to the answer: 6.6 shortest paths to it (released 1.6), 3.0 dead ends
//   (6.2), the answer always the deepest node (86%) and the option with more ancestors in 98% of the
//   graphs (70%). A model can pick "the option with more above it" without finding the root's part.
// - kDeadEnds: the answer's depth drawn as released (3: 41%, 4: 44%, 5: 12%, 6: 2%) and the other
//   option's (1: 21%, 2: 53%, 3: 24%, 4: 2%, never deeper than the answer); the answer's path is a
//   spine that other concepts hang off (one in 12 edges drawn onto it kept; no second parent for
//   its concepts), and the other option's part funnels into it: 2.3 shortest paths, 5.8 dead ends,
//   the answer the deepest node in 85% and the option with more ancestors in 80%, in-degree of the
//   answer 1.46 and of the other option 2.17 (released 1.50, 2.09).
// - kReleased: kDeadEnds, and also drawn as released: concepts per graph (15-25, mostly 19-23),
//   edges per node (mean edges_per_node, spread 0.19), edges back up to a shallower concept (8% of
//   the root part's; released 10%), a parent for every concept, the root's part 45-80% of the
//   concepts, and one in 5 edges drawn onto the answer's path kept: edges per node 1.57 (released
//   1.59), a single shortest path to the answer in 56% of the graphs (56%). Concept counts under
//   15 (curricula) are drawn uniformly.
enum class ProsqaShape { kFunnel, kDeadEnds, kReleased };

struct ProsqaOptions {
  int min_concepts = 16, max_concepts = 24;  // concept nodes (people come on top)
  int min_steps = 3, max_steps = 6;          // edges of the answer's shortest path (person edge included), uniform (kFunnel)
  ProsqaShape shape = ProsqaShape::kFunnel;
  int people = 3;                            // at most: each graph draws 2 (60%), 3 (31%), 4 (7%), ... as released
  double edges_per_node = 1.6;               // the released set has ~36 edges on ~23 nodes
  // Name pools (empty = the built-in ones: 14 people, 340 onset+rime concepts). To train for the
  // released set, give its symbol vocabulary (see prosqa_symbol_vocabulary).
  std::vector<std::string> people_names, concept_names;
};

// The people (capitalised) and concept names of a ProsQA-format set's `idx_to_symbol` fields:
// the symbol vocabulary only, no graphs or answers.
std::pair<std::vector<std::string>, std::vector<std::string>> prosqa_symbol_vocabulary(const std::vector<Example>& examples);

// Each example carries the released set's extra fields: edges, idx_to_symbol, root, target, neg_target.
std::vector<Example> generate_prosqa(int count, uint64_t seed, const ProsqaOptions& options = {});

// The graph of a ProsQA-format example, from its extra fields `idx_to_symbol`, `edges` and `root`,
// written as JSON values (the generator's) or as Python-literal strings (the released files':
// "['Tom', ...]", "[[0, 2], ...]", "1"). nullopt when the example has no such fields; a field that is
// there but malformed (an index out of range, a name that is not a string) throws, naming it.
struct ProsqaGraph {
  std::vector<std::string> names;              // node index -> name
  std::vector<std::vector<int>> children;      // node index -> nodes one edge away
  int root = 0;
};
std::optional<ProsqaGraph> prosqa_graph(const Example& example);

// What a breadth-first search from the root holds after h edges: the nodes within h edges of the
// root (the root itself left out: it is in every set, so a thought could satisfy them all by naming
// it), for h = 1, 2, ... until the set stops growing (the last set is every node the root reaches).
// Each set in node order. The targets of the reachable-set supervision of
// continuous thoughts (reasoning/training_loss.h: thought_reachable_loss).
std::vector<std::vector<int>> reachable_within_hops(const ProsqaGraph& graph);

struct GraphStatistics {
  double nodes = 0, edges = 0, steps = 0, question_words = 0;
  // The share of questions whose answer (the `target` node) a person other than the root also
  // reaches: how far apart the root's part of the graph and the others' are.
  double target_reached_by_others = 0;
  // Mean nodes the root reaches (itself left out), and the mean in-degree of the answer and of the
  // other option (released: 12.4, 1.5, 2.1; a generator whose answer had the larger in-degree
  // taught a cue that reverses on the released questions).
  double root_reaches = 0, answer_in_degree = 0, other_option_in_degree = 0;
  // The share of questions whose two options are both leaves (no edge out; released: all).
  double options_are_leaves = 0;
  int min_steps = 0, max_steps = 0;
};
// Averages over examples that have ProsQA's extra fields.
GraphStatistics graph_statistics(const std::vector<Example>& examples);

}  // namespace coconut
