// The ProsQA-style generator: the released set's phrasing, its invariants (exactly one option
// reachable, steps = a path), reproducibility, and statistics next to the real valid set.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "data/prosqa.h"
#include "support/temp_dir.h"

using namespace coconut;

TEST(Prosqa, GeneratedExamplesHaveTheReleasedShapeAndInvariants) {
  const auto examples = generate_prosqa(200, 11);
  ASSERT_EQ(examples.size(), 200u);
  for (const auto& example : examples) {
    const auto& names = example.extra["idx_to_symbol"];
    const std::string root = names[0], target = names[example.extra["target"].get<int>()];
    EXPECT_EQ(example.answer, root + " is a " + target + ".");
    EXPECT_EQ(example.steps.front().rfind(root + " is a ", 0), 0u);
    EXPECT_EQ(example.steps.back(), "Every " + example.steps.back().substr(6, example.steps.back().find(' ', 6) - 6) +
                                        " is a " + target + ".");
    EXPECT_NE(example.question.find("Is " + root + " a "), std::string::npos);
    // Every step is a statement of the question.
    for (const auto& step : example.steps) EXPECT_NE(example.question.find(step), std::string::npos) << step;
  }
  // The answer's shortest path takes every length in min_steps..max_steps (3-6), each about as often:
  // before the levels bounded the edges, shortcuts left 77% of the paths at the shortest length.
  std::map<size_t, int> lengths;
  for (const auto& example : examples) ++lengths[example.steps.size()];
  EXPECT_EQ(lengths.begin()->first, 3u);
  EXPECT_EQ(lengths.rbegin()->first, 6u);
  for (const auto& [length, count] : lengths) EXPECT_GE(count, 30) << length << " steps";
  EXPECT_EQ(generate_prosqa(5, 11)[4].question, examples[4].question);  // seeded
  EXPECT_NE(generate_prosqa(5, 12)[4].question, examples[4].question);
}

TEST(Prosqa, StatisticsNextToTheRealValidSet) {
  const auto real = graph_statistics(load_dataset(coconut::testing::test_data("prosqa/valid.json")));
  const auto generated = graph_statistics(generate_prosqa(300, 1));
  std::printf("%-10s %8s %8s %8s %10s %6s\n", "", "nodes", "edges", "steps", "q. words", "steps");
  std::printf("%-10s %8.1f %8.1f %8.2f %10.1f %3d-%d\n", "real", real.nodes, real.edges, real.steps, real.question_words,
              real.min_steps, real.max_steps);
  std::printf("%-10s %8.1f %8.1f %8.2f %10.1f %3d-%d\n", "generated", generated.nodes, generated.edges, generated.steps,
              generated.question_words, generated.min_steps, generated.max_steps);
  EXPECT_NEAR(generated.nodes, real.nodes, 0.25 * real.nodes);
  EXPECT_NEAR(generated.edges, real.edges, 0.25 * real.edges);
  EXPECT_NEAR(generated.steps, real.steps, 1.0);
  EXPECT_EQ(generated.min_steps, real.min_steps);
  EXPECT_LE(generated.max_steps, real.max_steps);
  // The root's part of the graph and the other people's are joined by a few edges that do not lead
  // to the answer (released: 9% of the answers are reachable from another person too; 95% before
  // the generator kept the sides apart, 0% while it kept them wholly apart).
  std::printf("answer reachable from another person: real %.3f, generated %.3f\n", real.target_reached_by_others,
              generated.target_reached_by_others);
  EXPECT_GT(real.target_reached_by_others, 0.05);
  EXPECT_LT(real.target_reached_by_others, 0.15);
  EXPECT_LE(generated.target_reached_by_others, real.target_reached_by_others + 0.05);
  EXPECT_GE(generated.target_reached_by_others, real.target_reached_by_others - 0.05);  // the parts joined, not apart
  // The shape around the options (released: the root reaches 12.4 nodes, the answer has in-degree
  // 1.5 and the other option 2.1, both are leaves; the generator before the levels bounded its edges:
  // 7.3, 2.3, 3.0, and 44% leaves).
  std::printf("root reaches %.1f / %.1f, in-degree of the answer %.2f / %.2f and the other option %.2f / %.2f, "
              "options leaves %.2f / %.2f (real / generated)\n",
              real.root_reaches, generated.root_reaches, real.answer_in_degree, generated.answer_in_degree,
              real.other_option_in_degree, generated.other_option_in_degree, real.options_are_leaves,
              generated.options_are_leaves);
  EXPECT_NEAR(generated.root_reaches, real.root_reaches, 0.15 * real.root_reaches);
  EXPECT_NEAR(generated.answer_in_degree, real.answer_in_degree, 0.3);
  EXPECT_LE(generated.answer_in_degree, generated.other_option_in_degree);
  EXPECT_EQ(real.options_are_leaves, 1.0);
  EXPECT_EQ(generated.options_are_leaves, 1.0);
}

TEST(Prosqa, NamePoolsFromTheReleasedSymbolsOnly) {
  const auto released = coconut::load_dataset(coconut::testing::test_data("prosqa/valid.json"));
  const auto [people, concepts] = coconut::prosqa_symbol_vocabulary(released);
  EXPECT_GE(people.size(), 10u);
  EXPECT_GE(concepts.size(), 30u);
  for (const auto& name : people) EXPECT_TRUE(std::isupper(static_cast<unsigned char>(name[0]))) << name;
  coconut::ProsqaOptions options;
  options.people_names = people;
  options.concept_names = concepts;
  std::set<std::string> allowed(people.begin(), people.end());
  allowed.insert(concepts.begin(), concepts.end());
  for (const auto& example : coconut::generate_prosqa(20, 4, options))
    for (const auto& symbol : example.extra["idx_to_symbol"]) EXPECT_TRUE(allowed.count(symbol.get<std::string>())) << symbol;
  options.concept_names.resize(5);
  EXPECT_THROW(coconut::generate_prosqa(1, 4, options), std::invalid_argument);
}

TEST(Prosqa, OneStepQuestionsAskWhichPersonAFactIsAbout) {
  // --path-steps 1 1: the answer is a child of the root and the other option a child of person 1,
  // so only matching the root's name tells them apart (a first-hop curriculum).
  coconut::ProsqaOptions options;
  options.min_steps = options.max_steps = 1;
  options.min_concepts = 8;
  options.max_concepts = 10;
  for (const auto& example : coconut::generate_prosqa(50, 3, options)) {
    ASSERT_EQ(example.steps.size(), 1u) << example.question;
    const auto graph = prosqa_graph(example);
    ASSERT_TRUE(graph.has_value());
    const int target = example.extra["target"].get<int>(), negative = example.extra["neg_target"].get<int>();
    const auto& root_children = graph->children[static_cast<size_t>(graph->root)];
    EXPECT_NE(std::find(root_children.begin(), root_children.end(), target), root_children.end()) << example.question;
    EXPECT_TRUE(graph->children[static_cast<size_t>(target)].empty());
    EXPECT_TRUE(graph->children[static_cast<size_t>(negative)].empty());
    const auto sets = reachable_within_hops(*graph);
    ASSERT_FALSE(sets.empty());
    const auto& reachable = sets.back();
    EXPECT_EQ(std::find(reachable.begin(), reachable.end(), negative), reachable.end()) << example.question;
  }
  options.min_steps = 0;
  EXPECT_THROW(coconut::generate_prosqa(1, 3, options), std::invalid_argument);
}

TEST(Prosqa, GraphFromJsonOrPythonLiteralFieldsAndReachableSetsByHop) {
  // 0 -> 1 -> 2 -> 1 (a cycle), 0 -> 3; node 4 unreachable.
  Example json_form{"q", {}, "a"}, literal_form{"q", {}, "a"};
  json_form.extra = {{"idx_to_symbol", {"Tom", "a", "b", "c", "d"}},
                     {"edges", {{0, 1}, {1, 2}, {0, 3}, {2, 1}}},
                     {"root", 0}};
  literal_form.extra = {{"idx_to_symbol", "['Tom', 'a', 'b', 'c', 'd']"}, {"edges", "[[0, 1], [1, 2], [0, 3], [2, 1]]"}, {"root", "0"}};
  for (const auto* example : {&json_form, &literal_form}) {
    const auto graph = prosqa_graph(*example);
    ASSERT_TRUE(graph.has_value());
    EXPECT_EQ(graph->names, (std::vector<std::string>{"Tom", "a", "b", "c", "d"}));
    EXPECT_EQ(graph->root, 0);
    EXPECT_EQ(reachable_within_hops(*graph), (std::vector<std::vector<int>>{{1, 3}, {1, 2, 3}}));  // no root
  }
  EXPECT_FALSE(prosqa_graph(Example{"q", {}, "a"}).has_value());
  auto lonely = json_form;  // a root without edges reaches nothing: no sets
  lonely.extra["root"] = 4;
  EXPECT_TRUE(reachable_within_hops(*prosqa_graph(lonely)).empty());
  auto bad = json_form;
  bad.extra["edges"] = {{0, 9}};
  EXPECT_THROW_WITH(prosqa_graph(bad), "edges", "node 9", "5 nodes");
  bad = literal_form;
  bad.extra["root"] = "7";
  EXPECT_THROW_WITH(prosqa_graph(bad), "root", "node 7");
  bad.extra["edges"] = "[[0, 1";
  EXPECT_THROW_WITH(prosqa_graph(bad), "'edges'", "neither JSON nor a Python literal");
}

namespace {

// A node index field of a ProsQA example: a JSON number (generated) or a Python literal (released).
int node_field(const Example& example, const char* key) {
  const auto& value = example.extra[key];
  return value.is_string() ? std::stoi(value.get<std::string>()) : value.get<int>();
}

}  // namespace

TEST(Prosqa, EveryReleasedAndGeneratedGraphReachesItsTargetAtItsChainLengthAndNeverTheOther) {
  ProsqaOptions dead_ends, released_shape;
  dead_ends.shape = ProsqaShape::kDeadEnds;
  released_shape.shape = ProsqaShape::kReleased;
  released_shape.min_concepts = 15;
  released_shape.max_concepts = 25;
  for (const auto& examples : {load_dataset(coconut::testing::test_data("prosqa/valid.json")), generate_prosqa(100, 3),
                               generate_prosqa(300, 3, dead_ends), generate_prosqa(300, 3, released_shape)}) {
    for (const auto& example : examples) {
      const auto graph = prosqa_graph(example);
      ASSERT_TRUE(graph.has_value()) << example.question;
      const auto sets = reachable_within_hops(*graph);
      const int target = node_field(example, "target"), other = node_field(example, "neg_target");
      const auto holds = [](const std::vector<int>& set, int node) { return std::find(set.begin(), set.end(), node) != set.end(); };
      // The steps walk a shortest path: the target first enters the set after as many hops as steps.
      const auto hops = static_cast<size_t>(example.steps.size());
      ASSERT_LE(hops, sets.size()) << example.question;
      EXPECT_TRUE(holds(sets[hops - 1], target)) << example.question;
      if (hops >= 2) {
        EXPECT_FALSE(holds(sets[hops - 2], target)) << example.question;
      }
      EXPECT_FALSE(holds(sets.back(), other)) << example.question;
      for (const auto& set : sets) EXPECT_FALSE(holds(set, graph->root)) << example.question;
    }
  }
}

namespace {

// What a model could answer from without finding the root's part of the graph: over a set's graphs,
// the share whose answer has a single shortest path from the root, the share whose answer has more
// ancestors (nodes that reach it, people included) than the other option, and the share whose
// answer lies 3 or 4 edges deep.
struct ShapeFigures {
  double single_shortest_path = 0, answer_has_more_ancestors = 0, answer_3_or_4_deep = 0;
};

// A breadth-first search from the root: each node's depth (-1 where unreached) and the nodes it
// reached, in the order it reached them (the root first).
struct BreadthFirst {
  std::vector<int> depth, order;
};

BreadthFirst breadth_first(const ProsqaGraph& graph) {
  BreadthFirst search{std::vector<int>(graph.children.size(), -1), {graph.root}};
  search.depth[static_cast<size_t>(graph.root)] = 0;
  for (size_t head = 0; head < search.order.size(); ++head)
    for (int child : graph.children[static_cast<size_t>(search.order[head])])
      if (search.depth[static_cast<size_t>(child)] < 0) {
        search.depth[static_cast<size_t>(child)] = search.depth[static_cast<size_t>(search.order[head])] + 1;
        search.order.push_back(child);
      }
  return search;
}

ShapeFigures shape_figures(const std::vector<Example>& examples) {
  ShapeFigures figures;
  for (const auto& example : examples) {
    const auto graph = prosqa_graph(example);
    const auto nodes = graph->children.size();
    // Shortest paths from the root, counted in breadth-first order (a node's parents one level up
    // come before it).
    const auto [depth, order] = breadth_first(*graph);
    std::vector<int> paths(nodes, 0);
    paths[static_cast<size_t>(graph->root)] = 1;
    for (int node : order)
      for (int child : graph->children[static_cast<size_t>(node)])
        if (depth[static_cast<size_t>(child)] == depth[static_cast<size_t>(node)] + 1)
          paths[static_cast<size_t>(child)] += paths[static_cast<size_t>(node)];
    // Ancestors: the nodes a search backwards along the edges reaches from the option.
    std::vector<std::vector<int>> parents(nodes);
    for (size_t node = 0; node < nodes; ++node)
      for (int child : graph->children[node]) parents[static_cast<size_t>(child)].push_back(static_cast<int>(node));
    const auto ancestors = [&](int option) {
      std::vector<bool> seen(nodes, false);
      std::vector<int> stack = {option};
      int count = 0;
      while (!stack.empty()) {
        const int current = stack.back();
        stack.pop_back();
        for (int parent : parents[static_cast<size_t>(current)])
          if (!seen[static_cast<size_t>(parent)]) {
            seen[static_cast<size_t>(parent)] = true;
            ++count;
            stack.push_back(parent);
          }
      }
      return count;
    };
    const int target = node_field(example, "target"), other = node_field(example, "neg_target");
    figures.single_shortest_path += paths[static_cast<size_t>(target)] == 1;
    figures.answer_has_more_ancestors += ancestors(target) > ancestors(other);
    figures.answer_3_or_4_deep += depth[static_cast<size_t>(target)] == 3 || depth[static_cast<size_t>(target)] == 4;
  }
  const auto count = static_cast<double>(examples.size());
  return {figures.single_shortest_path / count, figures.answer_has_more_ancestors / count, figures.answer_3_or_4_deep / count};
}

}  // namespace

// The funnel shape (the default) hands a model two cues the released graphs do not: nearly every
// concept the root reaches leads to the answer, so the answer has many shortest paths and the most
// ancestors. The dead-ends and released shapes are the released one in these respects (measured,
// 300 graphs each: released 0.56 / 0.65 / 0.86; dead ends 0.61 / 0.76 / 0.88; released shape 0.56 /
// 0.75 / 0.88; funnel 0.03 / 0.97 / 0.49 in single shortest path, ancestors, depth).
TEST(Prosqa, DeadEndsShapeHasTheReleasedPathsAncestorsAndDepths) {
  const auto released = shape_figures(load_dataset(coconut::testing::test_data("prosqa/valid.json")));
  ProsqaOptions options;
  const auto funnel = shape_figures(generate_prosqa(300, 1, options));
  options.shape = ProsqaShape::kDeadEnds;
  const auto dead_ends = shape_figures(generate_prosqa(300, 1, options));
  options.shape = ProsqaShape::kReleased;  // dead ends and more drawn as released (the test below)
  options.min_concepts = 15;
  options.max_concepts = 25;
  const auto released_shape = shape_figures(generate_prosqa(300, 1, options));
  for (const auto& [name, figures] :
       {std::pair{"released", released}, {"funnel", funnel}, {"dead ends", dead_ends}, {"released shape", released_shape}})
    std::printf("%-14s single shortest path %.2f, answer has more ancestors %.2f, answer 3-4 deep %.2f\n", name,
                figures.single_shortest_path, figures.answer_has_more_ancestors, figures.answer_3_or_4_deep);
  for (const auto& figures : {dead_ends, released_shape}) {
    EXPECT_NEAR(figures.single_shortest_path, released.single_shortest_path, 0.15);
    EXPECT_NEAR(figures.answer_has_more_ancestors, released.answer_has_more_ancestors, 0.12);
    EXPECT_NEAR(figures.answer_3_or_4_deep, released.answer_3_or_4_deep, 0.06);
  }
  EXPECT_LT(funnel.single_shortest_path, released.single_shortest_path - 0.3);  // what the test tells apart
  EXPECT_GT(funnel.answer_has_more_ancestors, dead_ends.answer_has_more_ancestors + 0.05);
}

namespace {

// A set's sizes and densities, over its graphs: the mean and standard deviation of edges per node,
// the share of graphs with 19-23 concepts, the share of the edges among the nodes the root reaches
// that end nearer the root than they start (breadth-first depth), and the concepts per graph that
// no edge enters.
struct SizeFigures {
  double edges_per_node_mean = 0, edges_per_node_spread = 0, concepts_19_to_23 = 0, back_up_edges = 0, concepts_without_parent = 0;
};

SizeFigures size_figures(const std::vector<Example>& examples) {
  SizeFigures figures;
  std::vector<double> densities;
  double back_up = 0, root_part_edges = 0;
  for (const auto& example : examples) {
    const auto graph = prosqa_graph(example);
    const auto nodes = graph->children.size();
    size_t edges = 0, concepts = 0;
    std::vector<int> in_degree(nodes, 0);
    for (const auto& children : graph->children) {
      edges += children.size();
      for (int child : children) ++in_degree[static_cast<size_t>(child)];
    }
    for (size_t node = 0; node < nodes; ++node) {
      if (std::islower(static_cast<unsigned char>(graph->names[node][0])) == 0) continue;  // people are capitalised
      ++concepts;
      figures.concepts_without_parent += in_degree[node] == 0;
    }
    densities.push_back(static_cast<double>(edges) / static_cast<double>(nodes));
    figures.concepts_19_to_23 += concepts >= 19 && concepts <= 23;
    const auto [depth, order] = breadth_first(*graph);
    for (int from : order)
      for (int to : graph->children[static_cast<size_t>(from)]) {
        ++root_part_edges;
        back_up += depth[static_cast<size_t>(to)] < depth[static_cast<size_t>(from)];
      }
  }
  const auto count = static_cast<double>(examples.size());
  for (double density : densities) figures.edges_per_node_mean += density / count;
  for (double density : densities)
    figures.edges_per_node_spread += (density - figures.edges_per_node_mean) * (density - figures.edges_per_node_mean) / count;
  figures.edges_per_node_spread = std::sqrt(figures.edges_per_node_spread);
  figures.concepts_19_to_23 /= count;
  figures.concepts_without_parent /= count;
  figures.back_up_edges = back_up / root_part_edges;
  return figures;
}

}  // namespace

// The released shape also draws the released set's concept counts and edge densities, edges back up
// towards the root, and a parent for every concept; the dead-ends shape draws none of these. Measured
// over 300 graphs each (released / released shape / dead ends): edges per node 1.59 / 1.57 / 1.55,
// spread 0.18 / 0.20 / 0.05; 19-23 concepts 0.76 / 0.78 / 0.60; edges back up 0.100 / 0.080 / 0.003;
// concepts without a parent 0 / 0 / 0.58.
TEST(Prosqa, ReleasedShapeHasTheReleasedSizesDensitiesAndBackEdges) {
  const auto released = size_figures(load_dataset(coconut::testing::test_data("prosqa/valid.json")));
  ProsqaOptions options;
  options.people = 4;
  options.shape = ProsqaShape::kDeadEnds;
  const auto dead_ends = size_figures(generate_prosqa(300, 1, options));
  options.shape = ProsqaShape::kReleased;
  options.min_concepts = 15;
  options.max_concepts = 25;
  const auto released_shape = size_figures(generate_prosqa(300, 1, options));
  for (const auto& [name, figures] : {std::pair{"released", released}, {"released shape", released_shape}, {"dead ends", dead_ends}})
    std::printf("%-14s edges per node %.3f (spread %.3f), 19-23 concepts %.2f, edges back up %.3f, concepts without a parent %.2f\n",
                name, figures.edges_per_node_mean, figures.edges_per_node_spread, figures.concepts_19_to_23, figures.back_up_edges,
                figures.concepts_without_parent);
  EXPECT_NEAR(released_shape.edges_per_node_mean, released.edges_per_node_mean, 0.05);
  EXPECT_NEAR(released_shape.edges_per_node_spread, released.edges_per_node_spread, 0.05);
  EXPECT_NEAR(released_shape.concepts_19_to_23, released.concepts_19_to_23, 0.08);
  EXPECT_NEAR(released_shape.back_up_edges, released.back_up_edges, 0.03);
  EXPECT_EQ(released_shape.concepts_without_parent, released.concepts_without_parent);
  // What the test tells apart: the dead-ends shape misses on every one of these.
  EXPECT_LT(dead_ends.edges_per_node_spread, released.edges_per_node_spread - 0.08);
  EXPECT_LT(dead_ends.back_up_edges, released.back_up_edges - 0.05);
  EXPECT_GT(dead_ends.concepts_without_parent, 0.2);
}
