// ProsQA-style graph reasoning (Coconut paper, appendix): a random DAG of fictional concepts with
// people at its roots; "Is Tom a X or Y?" where exactly one of X, Y is reachable from Tom; the steps
// walk the shortest path; the answer names the reachable one. Seeded and reproducible.
#pragma once

#include <cstdint>
#include <vector>

#include "data/example.h"

namespace coconut {

struct ProsqaOptions {
  int min_concepts = 16, max_concepts = 24;  // concept nodes (people come on top)
  int min_steps = 3, max_steps = 6;          // length of the reasoning path (person edge included)
  int people = 3;
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

struct GraphStatistics {
  double nodes = 0, edges = 0, steps = 0, question_words = 0;
  int min_steps = 0, max_steps = 0;
};
// Averages over examples that have ProsQA's extra fields.
GraphStatistics graph_statistics(const std::vector<Example>& examples);

}  // namespace coconut
