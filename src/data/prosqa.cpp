#include "data/prosqa.h"

#include <algorithm>
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

}  // namespace

std::vector<Example> generate_prosqa(int count, uint64_t seed, const ProsqaOptions& options) {
  if (options.min_steps < 2 || options.max_steps < options.min_steps || options.people < 2 ||
      options.min_concepts < 2 * options.max_steps || options.max_concepts < options.min_concepts)
    throw std::invalid_argument("generate_prosqa: need 2 <= min_steps <= max_steps, 2+ people, min_concepts >= 2 * max_steps");
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
  while (static_cast<int>(examples.size()) < count) {
    const int concepts = uniform(options.min_concepts, options.max_concepts);
    const int wanted_steps = uniform(options.min_steps, options.max_steps);
    // Names: people first (index 0 is the root), then concepts.
    std::vector<std::string> names;
    std::vector<std::string> people = people_pool;
    std::shuffle(people.begin(), people.end(), rng);
    names.assign(people.begin(), people.begin() + options.people);
    std::shuffle(pool.begin(), pool.end(), rng);
    names.insert(names.end(), pool.begin(), pool.begin() + concepts);
    const int total = static_cast<int>(names.size());
    // Concepts split into the root's side (reachable) and the other side; no edge goes from the
    // root's side to the other, so the negative target stays unreachable from the root.
    std::vector<int> side(static_cast<size_t>(total), 0), level(static_cast<size_t>(total), 0);
    for (int node = options.people; node < total; ++node) {
      side[static_cast<size_t>(node)] = node - options.people < concepts / 2 ? 0 : 1;
      level[static_cast<size_t>(node)] = uniform(1, options.max_steps);
    }
    std::set<std::pair<int, int>> edges;
    // The answer path: root -> c1 -> ... -> target with levels 1..wanted_steps on side 0, and a
    // decoy path of the same length on side 1 from another person.
    const auto chain = [&](int person, int chain_side) {
      std::vector<int> members;
      for (int node = options.people; node < total; ++node)
        if (side[static_cast<size_t>(node)] == chain_side) members.push_back(node);
      std::shuffle(members.begin(), members.end(), rng);
      members.resize(static_cast<size_t>(wanted_steps));
      int previous = person;
      for (int i = 0; i < wanted_steps; ++i) {
        level[static_cast<size_t>(members[static_cast<size_t>(i)])] = i + 1;
        edges.insert({previous, members[static_cast<size_t>(i)]});
        previous = members[static_cast<size_t>(i)];
      }
      return previous;
    };
    const int target = chain(0, 0);
    const int negative = chain(1, 1);
    // Distractor edges: from lower to higher level, each within one side: the root and side 0
    // among themselves, the other people and side 1 among themselves. So, as in the released set,
    // the root's part of the graph and the others' part are apart: the answer is reachable from
    // the root alone (in the released validation set from another person in 9% of the questions;
    // when the others could reach into side 0 it was 95%, and the target then had the larger
    // in-degree, where in the released set the other option has: a cue that reverses).
    const int wanted_edges = static_cast<int>(options.edges_per_node * total);
    for (int attempt = 0; static_cast<int>(edges.size()) < wanted_edges && attempt < 50 * wanted_edges; ++attempt) {
      const int from = uniform(0, total - 1), to = uniform(options.people, total - 1);
      const bool from_person = from < options.people;
      if (from == to || (!from_person && level[static_cast<size_t>(from)] >= level[static_cast<size_t>(to)])) continue;
      const int from_side = from_person ? (from == 0 ? 0 : 1) : side[static_cast<size_t>(from)];
      if (from_side != side[static_cast<size_t>(to)]) continue;
      edges.insert({from, to});
    }
    std::vector<std::vector<int>> out(static_cast<size_t>(total));
    for (const auto& [from, to] : edges) out[static_cast<size_t>(from)].push_back(to);
    const auto path = shortest_path(out, 0, target);
    if (static_cast<int>(path.size()) - 1 < options.min_steps || !shortest_path(out, 0, negative).empty()) continue;

    Example example;
    std::vector<std::string> statements;
    for (const auto& [from, to] : edges)
      statements.push_back(from < options.people ? names[static_cast<size_t>(from)] + " is a " + names[static_cast<size_t>(to)] + "."
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
    if (graph && example.extra.contains("target")) {
      const auto target = graph_field(example, "target");
      if (!target.is_number_integer() || target.get<int64_t>() < 0 || target.get<size_t>() >= graph->names.size())
        throw std::invalid_argument("ProsQA field 'target' names node " + target.dump() + ", not one of the " +
                                    std::to_string(graph->names.size()) + " nodes");
      const auto is_other_person = [&](size_t node) {
        const std::string& name = graph->names[node];
        return static_cast<int>(node) != graph->root && !name.empty() && std::isupper(static_cast<unsigned char>(name[0]));
      };
      for (size_t node = 0; node < graph->names.size(); ++node)
        if (is_other_person(node) && !shortest_path(graph->children, static_cast<int>(node), target.get<int>()).empty()) {
          statistics.target_reached_by_others += 1;
          break;
        }
    }
  }
  if (counted == 0) return {};
  statistics.nodes /= counted;
  statistics.edges /= counted;
  statistics.steps /= counted;
  statistics.question_words /= counted;
  statistics.target_reached_by_others /= counted;
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
