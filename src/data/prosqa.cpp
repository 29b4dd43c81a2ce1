#include "data/prosqa.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <random>
#include <cctype>
#include <set>
#include <sstream>
#include <stdexcept>

namespace coconut {

namespace {

const char* kPeople[] = {"Tom", "Alex", "Davis", "Sam", "Max", "Polly", "Rex", "Sally", "Stella", "Wren", "Fae", "Jack", "Sterling", "Bob"};
const char* kOnsets[] = {"sh", "t", "r", "f", "g", "br", "l", "y", "b", "scr", "d", "w", "v", "st", "gr", "j", "n", "z",
                         "k", "m", "p", "h", "sl", "sn", "pl", "cr", "fl", "gl", "thr", "bl", "dr", "tr", "ch", "sp"};
const char* kRimes[] = {"umpus", "impus", "empus", "ompus", "orpus", "erpus", "oompus", "ampus", "ipus", "upus"};

// Shortest path from `from` to `to` over `edges` (node lists), empty if unreachable.
std::vector<int> shortest_path(const std::vector<std::vector<int>>& out, int from, int to) {
  std::vector<int> parent(out.size(), -1);
  std::vector<bool> seen(out.size(), false);
  std::queue<int> queue;
  queue.push(from);
  seen[static_cast<size_t>(from)] = true;
  while (!queue.empty()) {
    const int node = queue.front();
    queue.pop();
    if (node == to) break;
    for (int next : out[static_cast<size_t>(node)])
      if (!seen[static_cast<size_t>(next)]) {
        seen[static_cast<size_t>(next)] = true;
        parent[static_cast<size_t>(next)] = node;
        queue.push(next);
      }
  }
  if (!seen[static_cast<size_t>(to)]) return {};
  std::vector<int> path = {to};
  while (path.back() != from) path.push_back(parent[static_cast<size_t>(path.back())]);
  std::reverse(path.begin(), path.end());
  return path;
}

// Released validation graphs (300): the answer's depth from the root 3: 124, 4: 133, 5: 36, 6: 7;
// the other option's from its person 1: 64, 2: 160, 3: 71, 4: 5. Depths the released set does not
// have (answers 1, 2 or 7+ deep: curricula) weigh as its rarest, 7 and 5.
constexpr double kAnswerDepthWeights[] = {7, 7, 7, 124, 133, 36, 7};
constexpr double kOtherOptionDepthWeights[] = {0, 64, 160, 71, 5};
// kDeadEnds: one concept of the root's part in kBelowAnswerOdds sits a level below the answer; a
// distractor edge from a shallower level onto a concept of the answer's path (which would make a
// second shortest path) is kept once in kOntoPathOdds.
constexpr int kBelowAnswerOdds = 40, kOntoPathOdds = 12;
// kReleased: concepts per graph as released (15: 7, 16: 5, 17: 19, ... 25: 3 of the 300; counts
// outside 15..25 weigh as its rarest), and the spread of its edges per node (standard deviation 0.19
// about the mean; 5% of the graphs under 1.28, 5% over 1.90).
constexpr double kConceptWeights[] = {3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 7, 5, 19, 25, 41, 57, 62, 37, 32, 12, 3};
constexpr double kEdgesPerNodeSpread = 0.19, kFewestEdgesPerNode = 1.2, kMostEdgesPerNode = 2.2;
// kReleased: a distractor edge drawn (uniform 0..1) under kReleasedDownBelow goes one level down,
// from there to kBackUpFrom it stays on its level, and above that it goes back up (the parents and
// the chains all go down: released, 70% of the root part's edges go down, 20% stay, 9% go up).
constexpr double kReleasedDownBelow = 0.45, kBackUpFrom = 0.75, kReleasedRankJitter = 3.0;
// kReleased: its wider rank spread leaves fewer edges that could make a second shortest path, so
// more of them are kept (released: the answer has one shortest path in 56% of the graphs).
constexpr int kReleasedOntoPathOdds = 5;

// A number in low..high drawn with `weights` (indexed by the number; past its end, its last).
template <size_t N>
int draw_weighted(std::mt19937_64& rng, const double (&weights)[N], int low, int high) {
  std::vector<double> in_range;
  for (int value = low; value <= high; ++value) in_range.push_back(weights[std::min(static_cast<size_t>(value), N - 1)]);
  return low + std::discrete_distribution<int>(in_range.begin(), in_range.end())(rng);
}

}  // namespace

std::vector<Example> generate_prosqa(int count, uint64_t seed, const ProsqaOptions& options) {
  if (options.min_steps < 1 || options.max_steps < options.min_steps || options.people < 2 ||
      options.min_concepts < 2 * options.max_steps || options.max_concepts < options.min_concepts)
    throw std::invalid_argument("generate_prosqa: need 1 <= min_steps <= max_steps, 2+ people, min_concepts >= 2 * max_steps");
  std::mt19937_64 rng(seed);
  const auto uniform = [&](int low, int high) { return std::uniform_int_distribution<int>(low, high)(rng); };
  std::vector<std::string> pool = options.concept_names;
  if (pool.empty())
    for (const char* onset : kOnsets)
      for (const char* rime : kRimes) pool.push_back(std::string(onset) + rime);
  std::vector<std::string> people_pool = options.people_names;
  if (people_pool.empty()) people_pool.assign(std::begin(kPeople), std::end(kPeople));
  if (static_cast<int>(pool.size()) < options.max_concepts || static_cast<int>(people_pool.size()) < options.people)
    throw std::invalid_argument("generate_prosqa: the name pools are smaller than max_concepts / people");

  std::vector<Example> examples;
  // kReleased is kDeadEnds with more drawn as released; kDeadEnds draws as it did when it was made.
  const bool released = options.shape == ProsqaShape::kReleased;
  const bool dead_ends = options.shape == ProsqaShape::kDeadEnds || released;
  // A concept's rank (the order edges follow) is its level plus up to this much: the more, the more
  // edges can go back up a level.
  const double rank_jitter = released ? kReleasedRankJitter : 1.5;
  const int onto_path_odds = released ? kReleasedOntoPathOdds : kOntoPathOdds;
  while (static_cast<int>(examples.size()) < count) {
    const int concepts = released ? draw_weighted(rng, kConceptWeights, options.min_concepts, options.max_concepts)
                                  : uniform(options.min_concepts, options.max_concepts);
    const int wanted_steps = dead_ends ? draw_weighted(rng, kAnswerDepthWeights, options.min_steps, options.max_steps)
                                       : uniform(options.min_steps, options.max_steps);
    // People per graph as released (2: 60%, 3: 31%, 4: 7%, 5-6: 2%), at most options.people.
    std::vector<double> people_weights = {0, 0, 60, 31, 7, 1.7, 0.3};
    people_weights.resize(static_cast<size_t>(options.people) + 1, 0.3);
    const int people = std::discrete_distribution<int>(people_weights.begin(), people_weights.end())(rng);
    // Names: people first (index 0 is the root, 1 the other option's person), then concepts.
    std::vector<std::string> names;
    std::vector<std::string> people_names = people_pool;
    std::shuffle(people_names.begin(), people_names.end(), rng);
    names.assign(people_names.begin(), people_names.begin() + people);
    std::shuffle(pool.begin(), pool.end(), rng);
    names.insert(names.end(), pool.begin(), pool.begin() + concepts);
    const int total = static_cast<int>(names.size());
    // As in the released set (counted over its 300 validation graphs): the answer's shortest path
    // from the root has min_steps..max_steps edges (3-6); both options are leaves; the answer is the
    // deepest node the root reaches in 86%; the other option lies closer to its person (1-4 edges,
    // mostly 2), which is the only person that reaches it in 96%. Each concept gets a side (0: the
    // root's, 1: person 1's) and a level, its intended distance from its side's person; an edge may
    // only go down one level at most (level[to] <= level[from] + 1), so no edge shortens a path below
    // its level, and only forward in a rank order, so the graph stays acyclic. No edge goes from
    // side 0 to side 1, so the root never reaches the other option.
    const int negative_steps = dead_ends ? draw_weighted(rng, kOtherOptionDepthWeights, 1, wanted_steps)
                                         : uniform(1, std::max(1, wanted_steps - 1));
    // kDeadEnds: a concept of the root's part may hang one level below the answer (released: the
    // answer is the deepest node the root reaches in 86% of the graphs).
    const int deepest_level = dead_ends ? wanted_steps + 1 : wanted_steps;
    // kReleased: the root's part takes 45-80% of the concepts (released: the root reaches 9-16 nodes
    // in 80% of the graphs), the other parts the rest.
    const int others_side =
        std::max(negative_steps, released ? static_cast<int>(std::lround(concepts * std::uniform_real_distribution<double>(0.2, 0.55)(rng)))
                                          : concepts * 2 / 5);
    std::vector<int> side(static_cast<size_t>(total), 0), level(static_cast<size_t>(total), 0);
    std::vector<double> rank(static_cast<size_t>(total), -1);  // mostly by level: a few edges go back up a level
    for (int node = people; node < total; ++node) {
      side[static_cast<size_t>(node)] = node - people < concepts - others_side ? 0 : 1;
      // kDeadEnds: half the concepts drawn at the answer's level are drawn again (released: a third
      // of the graphs have no other node at the answer's depth).
      int node_level = uniform(1, wanted_steps);
      if (dead_ends && node_level == wanted_steps && uniform(0, 1) == 0) node_level = uniform(1, wanted_steps);
      if (dead_ends && uniform(0, kBelowAnswerOdds - 1) == 0) node_level = deepest_level;
      level[static_cast<size_t>(node)] = node_level;
      rank[static_cast<size_t>(node)] = level[static_cast<size_t>(node)] + rank_jitter * std::uniform_real_distribution<double>(0, 1)(rng);
    }
    side[1] = 1;
    std::set<std::pair<int, int>> edges;
    // A chain person -> c1 -> ... -> c_length on one side, levels 1..length and ranks increasing
    // along it; returns its concepts in order.
    const auto chain = [&](int person, int chain_side, int length) {
      std::vector<int> members;
      for (int node = people; node < total; ++node)
        if (side[static_cast<size_t>(node)] == chain_side) members.push_back(node);
      std::shuffle(members.begin(), members.end(), rng);
      members.resize(static_cast<size_t>(length));
      int previous = person;
      double previous_rank = -1;
      for (int i = 0; i < length; ++i) {
        const auto member = static_cast<size_t>(members[static_cast<size_t>(i)]);
        level[member] = i + 1;
        rank[member] = std::max(previous_rank + 0.01, level[member] + rank_jitter * std::uniform_real_distribution<double>(0, 1)(rng));
        previous_rank = rank[member];
        edges.insert({previous, members[static_cast<size_t>(i)]});
        previous = members[static_cast<size_t>(i)];
      }
      return members;
    };
    const auto answer_path = chain(0, 0, wanted_steps);
    const int target = answer_path.back();
    const auto negative_path = chain(1, 1, negative_steps);
    const int negative = negative_path.back();
    std::vector<bool> on_answer_path(static_cast<size_t>(total), false);  // its concepts, the answer included
    for (int node : answer_path) on_answer_path[static_cast<size_t>(node)] = true;
    if (released) {
      // kReleased: every concept gets a parent (released: none lacks one). Taken in rank order, a
      // concept off both chains moves up to one level below the deepest concept of its side ranked
      // before it (the options left out), or to level 1 when only its side's person is.
      std::vector<int> by_rank;
      for (int node = people; node < total; ++node) by_rank.push_back(node);
      std::sort(by_rank.begin(), by_rank.end(), [&](int a, int b) { return rank[static_cast<size_t>(a)] < rank[static_cast<size_t>(b)]; });
      std::vector<bool> on_chain = on_answer_path;
      for (int node : negative_path) on_chain[static_cast<size_t>(node)] = true;
      int deepest_so_far[2] = {0, 0};  // per side, over the concepts ranked before (the options left out)
      for (int ranked : by_rank) {
        const auto node = static_cast<size_t>(ranked);
        if (!on_chain[node]) level[node] = std::min(level[node], deepest_so_far[side[node]] + 1);
        if (ranked != target && ranked != negative) deepest_so_far[side[node]] = std::max(deepest_so_far[side[node]], level[node]);
      }
    }
    std::vector<std::vector<int>> by_side_and_level(static_cast<size_t>(2 * (deepest_level + 1)));
    for (int node = 0; node < 2; ++node) by_side_and_level[static_cast<size_t>(side[static_cast<size_t>(node)])].push_back(node);
    for (int node = people; node < total; ++node)
      by_side_and_level[static_cast<size_t>(2 * level[static_cast<size_t>(node)] + side[static_cast<size_t>(node)])].push_back(node);
    // Every other concept gets a parent one level up where one comes before it in rank (released:
    // 2.5 nodes without a parent a graph, the people included), so the root reaches about 13.
    for (int node = people; node < total; ++node) {
      const auto index = static_cast<size_t>(node);
      if (node == target || node == negative) continue;
      if (dead_ends && on_answer_path[index]) continue;  // its one parent is the path's node before it
      std::vector<int> parents;
      const auto add_parents_at = [&](int parent_level) {  // the concepts there ranked before it, the options left out
        for (int parent : by_side_and_level[static_cast<size_t>(2 * parent_level + side[index])])
          if (parent != target && parent != negative && rank[static_cast<size_t>(parent)] < rank[index]) parents.push_back(parent);
      };
      add_parents_at(level[index] - 1);
      if (released && parents.empty())  // kReleased: failing that, one as deep or deeper (there is one)
        for (int parent_level = level[index]; parent_level <= deepest_level; ++parent_level) add_parents_at(parent_level);
      if (!parents.empty()) edges.insert({parents[static_cast<size_t>(uniform(0, static_cast<int>(parents.size()) - 1))], node});
    }
    // Distractor edges within a side. Each picks its source (the root, person 1 or a concept), then
    // the level of its end: one down (released: 70% of the edges in the root's part), the same (22%)
    // or higher up (8%). Few end on the answer (released: in-degree 1.5 for the answer, 2.1 for the
    // other option).
    const double edges_per_node =
        released ? std::clamp(std::normal_distribution<double>(options.edges_per_node, kEdgesPerNodeSpread)(rng), kFewestEdgesPerNode,
                              kMostEdgesPerNode)
                 : options.edges_per_node;
    const int wanted_edges = static_cast<int>(edges_per_node * total);
    // The joining edges below add about one per person; kReleased leaves room for two.
    const int distractors_until = wanted_edges - (released ? 2 : people);
    const auto random_source = [&] {
      const int pick = uniform(0, concepts + 1);
      return pick < 2 ? pick : people + pick - 2;
    };
    for (int attempt = 0; static_cast<int>(edges.size()) < distractors_until && attempt < 50 * wanted_edges; ++attempt) {
      const int from = random_source();
      if (from == target || from == negative) continue;  // the options stay leaves
      const auto from_index = static_cast<size_t>(from);
      const double draw = std::uniform_real_distribution<double>(0, 1)(rng);
      if (released && from >= 2 && draw >= kBackUpFrom) {
        // kReleased: an edge back up to any shallower concept ranked after it (released: 9% of the
        // edges in the root's part end nearer the root than they start). None shortens a path.
        std::vector<int> shallower;
        for (int node = people; node < total; ++node)
          if (side[static_cast<size_t>(node)] == side[from_index] && level[static_cast<size_t>(node)] < level[from_index] &&
              rank[static_cast<size_t>(node)] > rank[from_index])
            shallower.push_back(node);
        if (!shallower.empty()) edges.insert({from, shallower[static_cast<size_t>(uniform(0, static_cast<int>(shallower.size()) - 1))]});
        continue;
      }
      const int to_level = from < 2 || draw < (released ? kReleasedDownBelow : 0.7) ? level[from_index] + 1
                           : draw < 0.92          ? level[from_index]
                                                  : uniform(1, std::max(1, level[from_index] - 1));
      if (to_level > deepest_level) continue;
      const auto& candidates = by_side_and_level[static_cast<size_t>(2 * to_level + side[from_index])];
      if (candidates.empty()) continue;
      int to = candidates[static_cast<size_t>(uniform(0, static_cast<int>(candidates.size()) - 1))];
      // kDeadEnds: the other option's part funnels into it (released in-degree 2.1, the answer's 1.5).
      if (dead_ends && side[from_index] == 1 && to_level == negative_steps && uniform(0, 2) == 0) to = negative;
      if (to == from || rank[from_index] >= rank[static_cast<size_t>(to)]) continue;
      // kDeadEnds: what the root's part adds hangs off the answer's path, and seldom joins it again
      // on a path as short (the answer's further parents lie as deep as it).
      if (dead_ends ? on_answer_path[static_cast<size_t>(to)] && level[from_index] < level[static_cast<size_t>(to)] &&
                          uniform(0, onto_path_odds - 1) != 0
                    : to == target && uniform(0, 4) != 0)
        continue;
      edges.insert({from, to});
    }
    // Edges that join the parts, from person 1's side and from the further people (released: 73% of
    // the graphs have nodes both the root and another person reach, 2.0 on average; 83% of such
    // edges end on a leaf, and the answer is reachable from another person in 9%). They end on a
    // concept that does not lead to the answer (or, for a further person, to the other option),
    // bar one in eight that may end anywhere on the root's side.
    std::vector<std::vector<int>> out(static_cast<size_t>(total));
    for (const auto& [from, to] : edges) out[static_cast<size_t>(from)].push_back(to);
    // Which concepts lead to each option, before any joining edge: those edges start outside the
    // side they end on, so they change neither.
    std::vector<bool> leads_to_option(static_cast<size_t>(total), false);
    for (int node = people; node < total; ++node) {
      const int option = side[static_cast<size_t>(node)] == 0 ? target : negative;
      leads_to_option[static_cast<size_t>(node)] = node == option || !shortest_path(out, node, option).empty();
    }
    const auto joining_end = [&](int end_side) {
      const bool anywhere = end_side == 0 && uniform(0, 7) == 0;
      std::vector<int> ends;
      for (int node = people; node < total; ++node)
        if (side[static_cast<size_t>(node)] == end_side && (anywhere || !leads_to_option[static_cast<size_t>(node)]))
          ends.push_back(node);
      return ends.empty() ? -1 : ends[static_cast<size_t>(uniform(0, static_cast<int>(ends.size()) - 1))];
    };
    std::vector<std::pair<int, int>> joining;
    for (int k = uniform(0, 3); k > 0; --k) {
      const int from = people + concepts - others_side + uniform(0, others_side - 1);  // a concept of side 1
      if (from != negative) joining.push_back({from, joining_end(0)});
    }
    for (int person = 2; person < people; ++person)  // one edge each (released: 1.15), seven in ten to the root's side
      for (int k = uniform(0, 6) == 0 ? 2 : 1; k > 0; --k) joining.push_back({person, joining_end(uniform(0, 9) < 7 ? 0 : 1)});
    for (const auto& [from, to] : joining)
      if (to >= 0 && edges.insert({from, to}).second) out[static_cast<size_t>(from)].push_back(to);
    const auto path = shortest_path(out, 0, target);
    if (static_cast<int>(path.size()) - 1 != wanted_steps || !shortest_path(out, 0, negative).empty())
      throw std::logic_error("generate_prosqa: a graph broke its construction (answer path of " +
                             std::to_string(static_cast<int>(path.size()) - 1) + " edges, " + std::to_string(wanted_steps) + " wanted)");

    Example example;
    std::vector<std::string> statements;
    for (const auto& [from, to] : edges)
      statements.push_back(from < people ? names[static_cast<size_t>(from)] + " is a " + names[static_cast<size_t>(to)] + "."
                                         : "Every " + names[static_cast<size_t>(from)] + " is a " + names[static_cast<size_t>(to)] + ".");
    std::shuffle(statements.begin(), statements.end(), rng);
    const bool target_first = uniform(0, 1) == 0;
    const std::string& first = names[static_cast<size_t>(target_first ? target : negative)];
    const std::string& second = names[static_cast<size_t>(target_first ? negative : target)];
    for (const auto& statement : statements) example.question += statement + " ";
    example.question += "Is " + names[0] + " a " + first + " or " + second + "?";
    for (size_t i = 0; i + 1 < path.size(); ++i)
      example.steps.push_back(i == 0 ? names[0] + " is a " + names[static_cast<size_t>(path[1])] + "."
                                     : "Every " + names[static_cast<size_t>(path[i])] + " is a " + names[static_cast<size_t>(path[i + 1])] + ".");
    example.answer = names[0] + " is a " + names[static_cast<size_t>(target)] + ".";
    nlohmann::json edge_list = nlohmann::json::array();
    for (const auto& [from, to] : edges) edge_list.push_back({from, to});
    example.extra = {{"edges", edge_list}, {"idx_to_symbol", names}, {"root", 0}, {"target", target}, {"neg_target", negative}};
    examples.push_back(std::move(example));
  }
  return examples;
}

namespace {

// A field of ProsQA's extra fields as JSON: the released files hold Python literals in strings
// ("['Tom', 'Alex']"), which are JSON once their quotes are double (names hold no quotes).
nlohmann::json graph_field(const Example& example, const char* key) {
  const auto& value = example.extra.at(key);
  if (!value.is_string()) return value;
  std::string text = value.get<std::string>();
  std::replace(text.begin(), text.end(), '\'', '"');
  auto parsed = nlohmann::json::parse(text, nullptr, false);
  if (parsed.is_discarded())
    throw std::invalid_argument(std::string("ProsQA field '") + key +
                                "' is neither JSON nor a Python literal: " + value.get<std::string>().substr(0, 80));
  return parsed;
}

}  // namespace

std::optional<ProsqaGraph> prosqa_graph(const Example& example) {
  if (!example.extra.contains("idx_to_symbol") || !example.extra.contains("edges") || !example.extra.contains("root"))
    return std::nullopt;
  const auto fail = [&](const std::string& what) -> void {
    throw std::invalid_argument("ProsQA graph of question '" + example.question.substr(0, 60) + "...': " + what);
  };
  ProsqaGraph graph;
  const auto names = graph_field(example, "idx_to_symbol");
  if (!names.is_array() || names.empty()) fail("idx_to_symbol must be a non-empty list of names");
  for (const auto& name : names) {
    if (!name.is_string()) fail("idx_to_symbol holds a value that is not a name: " + name.dump());
    graph.names.push_back(name.get<std::string>());
  }
  const auto count = static_cast<int64_t>(graph.names.size());
  const auto index = [&](const nlohmann::json& value, const char* field) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= count)
      fail(std::string(field) + " names node " + value.dump() + ", not one of the " + std::to_string(count) + " nodes");
    return value.get<int>();
  };
  graph.children.resize(graph.names.size());
  const auto edges = graph_field(example, "edges");
  if (!edges.is_array()) fail("edges must be a list of [from, to] pairs");
  for (const auto& edge : edges) {
    if (!edge.is_array() || edge.size() != 2) fail("edges holds " + edge.dump() + ", not a [from, to] pair");
    graph.children[static_cast<size_t>(index(edge[0], "edges"))].push_back(index(edge[1], "edges"));
  }
  auto root = graph_field(example, "root");
  if (root.is_string()) root = nlohmann::json::parse(root.get<std::string>(), nullptr, false);  // "1" quoted twice
  graph.root = index(root, "root");
  return graph;
}

std::vector<std::vector<int>> reachable_within_hops(const ProsqaGraph& graph) {
  std::vector<bool> reached(graph.names.size(), false);
  reached[static_cast<size_t>(graph.root)] = true;
  std::vector<int> frontier = {graph.root};
  std::vector<std::vector<int>> sets;
  while (true) {
    std::vector<int> next;
    for (int node : frontier)
      for (int child : graph.children[static_cast<size_t>(node)])
        if (!reached[static_cast<size_t>(child)]) {
          reached[static_cast<size_t>(child)] = true;
          next.push_back(child);
        }
    if (next.empty()) break;
    std::vector<int> within;
    for (size_t node = 0; node < reached.size(); ++node)
      if (reached[node] && static_cast<int>(node) != graph.root) within.push_back(static_cast<int>(node));
    sets.push_back(std::move(within));
    frontier = std::move(next);
  }
  return sets;
}

GraphStatistics graph_statistics(const std::vector<Example>& examples) {
  GraphStatistics statistics;
  int counted = 0;
  statistics.min_steps = 1 << 30;
  for (const auto& example : examples) {
    if (!example.extra.contains("edges") || !example.extra.contains("idx_to_symbol")) continue;
    ++counted;
    statistics.nodes += static_cast<double>(example.extra["idx_to_symbol"].size());
    statistics.edges += static_cast<double>(example.extra["edges"].size());
    statistics.steps += static_cast<double>(example.steps.size());
    std::istringstream words(example.question);
    std::string word;
    while (words >> word) statistics.question_words += 1;
    statistics.min_steps = std::min(statistics.min_steps, static_cast<int>(example.steps.size()));
    statistics.max_steps = std::max(statistics.max_steps, static_cast<int>(example.steps.size()));
    const auto graph = prosqa_graph(example);
    if (!graph || !example.extra.contains("target") || !example.extra.contains("neg_target")) continue;
    const auto node_field = [&](const char* key) {
      const auto value = graph_field(example, key);
      if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<size_t>() >= graph->names.size())
        throw std::invalid_argument(std::string("ProsQA field '") + key + "' names node " + value.dump() + ", not one of the " +
                                    std::to_string(graph->names.size()) + " nodes");
      return value.get<int>();
    };
    const int target = node_field("target"), other_option = node_field("neg_target");
    const auto is_other_person = [&](size_t node) {
      const std::string& name = graph->names[node];
      return static_cast<int>(node) != graph->root && !name.empty() && std::isupper(static_cast<unsigned char>(name[0]));
    };
    for (size_t node = 0; node < graph->names.size(); ++node)
      if (is_other_person(node) && !shortest_path(graph->children, static_cast<int>(node), target).empty()) {
        statistics.target_reached_by_others += 1;
        break;
      }
    const auto sets = reachable_within_hops(*graph);
    statistics.root_reaches += sets.empty() ? 0.0 : static_cast<double>(sets.back().size());
    for (const auto& children : graph->children) {
      statistics.answer_in_degree += static_cast<double>(std::count(children.begin(), children.end(), target));
      statistics.other_option_in_degree += static_cast<double>(std::count(children.begin(), children.end(), other_option));
    }
    statistics.options_are_leaves +=
        graph->children[static_cast<size_t>(target)].empty() && graph->children[static_cast<size_t>(other_option)].empty() ? 1.0 : 0.0;
  }
  if (counted == 0) return {};
  statistics.nodes /= counted;
  statistics.edges /= counted;
  statistics.steps /= counted;
  statistics.question_words /= counted;
  for (double* share : {&statistics.target_reached_by_others, &statistics.root_reaches, &statistics.answer_in_degree,
                        &statistics.other_option_in_degree, &statistics.options_are_leaves})
    *share /= counted;
  return statistics;
}

std::pair<std::vector<std::string>, std::vector<std::string>> prosqa_symbol_vocabulary(const std::vector<Example>& examples) {
  std::set<std::string> people, concepts;
  for (const auto& example : examples) {
    if (!example.extra.contains("idx_to_symbol")) continue;
    for (const auto& symbol : example.extra["idx_to_symbol"]) {
      const std::string name = symbol.get<std::string>();
      if (name.empty()) continue;
      (std::isupper(static_cast<unsigned char>(name[0])) ? people : concepts).insert(name);
    }
  }
  return {std::vector<std::string>(people.begin(), people.end()), std::vector<std::string>(concepts.begin(), concepts.end())};
}

}  // namespace coconut
