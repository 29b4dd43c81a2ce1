#include "data/prontoqa.h"

#include <algorithm>
#include <array>
#include <random>
#include <string>

namespace coconut {

namespace {

const char* kNames[] = {"Fae", "Rex", "Sally", "Max", "Alex", "Sam", "Polly", "Stella", "Wren"};
const char* kClasses[] = {"wumpus", "yumpus", "zumpus", "dumpus", "rompus", "numpus", "tumpus", "vumpus", "impus",
                          "jompus", "gorpus", "shumpus", "lempus", "sterpus", "grimpus", "lorpus", "brimpus"};
// Families of adjectives that exclude each other.
const std::vector<std::vector<const char*>> kFamilies = {
    {"blue", "red", "brown", "orange"},       {"small", "large"},
    {"metallic", "wooden", "luminous", "liquid"}, {"transparent", "opaque"},
    {"nervous", "happy", "feisty", "shy"},    {"bright", "dull"},
    {"sweet", "sour", "spicy", "bitter"},     {"floral", "fruity", "earthy"},
    {"hot", "cold", "temperate"},             {"kind", "mean", "angry", "amenable", "aggressive"},
    {"melodic", "muffled", "discordant", "loud"}, {"slow", "moderate", "fast"},
    {"windy", "sunny", "overcast", "rainy", "snowy"}};

std::string article(const std::string& word) { return word[0] == 'a' || word[0] == 'e' || word[0] == 'i' || word[0] == 'o' || word[0] == 'u' ? "an" : "a"; }
std::string capitalised(std::string text) {
  text[0] = static_cast<char>(text[0] - 'a' + 'A');
  return text;
}

// One rule in one of the three forms the released questions use: "Xes are [not] Y." (Y plural when
// a class) half the time, else "Each X is [not] [a] Y." or "Every ...".
std::string rule(std::mt19937_64& rng, const std::string& subject, const std::string& object, bool object_is_class, bool negated) {
  const int form = std::uniform_int_distribution<int>(0, 3)(rng);  // 0, 1: plural; 2: Each; 3: Every
  const std::string no = negated ? "not " : "";
  if (form < 2) return capitalised(subject) + "es are " + no + (object_is_class ? object + "es" : object) + ".";
  return std::string(form == 2 ? "Each " : "Every ") + subject + " is " + no + (object_is_class ? article(object) + " " : "") + object + ".";
}

}  // namespace

std::vector<Example> generate_prontoqa(int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  std::vector<Example> examples;
  examples.reserve(static_cast<size_t>(std::max(count, 0)));
  for (int n = 0; n < count; ++n) {
    const std::string name = kNames[std::uniform_int_distribution<int>(0, 8)(rng)];
    std::vector<std::string> classes(std::begin(kClasses), std::end(kClasses));
    std::shuffle(classes.begin(), classes.end(), rng);
    // Roles: chain C1..C5 = 0..4, R = 5, D1..D5 = 6..10, E = 11, Ep = 12, X = 13.
    const auto chain = [&](int k) { return classes[static_cast<size_t>(k)]; };
    const std::string root = classes[5], entity_class = classes[11], entity_parent = classes[12], contrary = classes[13];
    std::vector<int> families(kFamilies.size());
    for (size_t i = 0; i < families.size(); ++i) families[i] = static_cast<int>(i);
    std::shuffle(families.begin(), families.end(), rng);
    // Property slots: P = 0, C1..C4 = 1..4, D1..D5 = 5..9, E = 10; one family each.
    std::array<std::string, 11> adjectives;
    std::array<bool, 11> negated{};
    for (int slot = 0; slot < 11; ++slot) {
      const auto& family = kFamilies[static_cast<size_t>(families[static_cast<size_t>(slot)])];
      adjectives[static_cast<size_t>(slot)] = family[static_cast<size_t>(std::uniform_int_distribution<int>(0, static_cast<int>(family.size()) - 1)(rng))];
      negated[static_cast<size_t>(slot)] = !chance(slot == 0 ? 102.0 / 193.0 : slot <= 4 ? 34.0 / 47.0 : 2.0 / 3.0);
    }
    std::vector<std::string> proof;  // the rules the steps quote, C1's first
    for (int k = 0; k < 4; ++k) proof.push_back(rule(rng, chain(k), chain(k + 1), true, false));
    proof.push_back(rule(rng, chain(4), adjectives[0], false, negated[0]));
    std::vector<std::string> rules = proof;
    rules.push_back(rule(rng, chain(4), root, true, false));
    for (int k = 0; k < 4; ++k) rules.push_back(rule(rng, chain(k), adjectives[static_cast<size_t>(1 + k)], false, negated[static_cast<size_t>(1 + k)]));
    for (int k = 0; k < 5; ++k) {
      const std::string parent = classes[static_cast<size_t>(6 + k)];
      rules.push_back(rule(rng, chain(k), parent, true, false));
      rules.push_back(rule(rng, parent, adjectives[static_cast<size_t>(5 + k)], false, negated[static_cast<size_t>(5 + k)]));
    }
    rules.push_back(rule(rng, entity_class, entity_parent, true, false));
    rules.push_back(rule(rng, entity_class, adjectives[10], false, negated[10]));
    rules.push_back(rule(rng, contrary, adjectives[0], false, !negated[0]));
    std::shuffle(rules.begin(), rules.end(), rng);

    std::string facts[2] = {name + " is " + article(chain(0)) + " " + chain(0) + ".",
                            name + " is " + article(entity_class) + " " + entity_class + "."};
    if (chance(0.5)) std::swap(facts[0], facts[1]);
    const bool answer = chance(0.5);
    const bool query_negated = negated[0] != !answer;  // False asks the opposite of the conclusion
    Example example;
    for (const auto& sentence : rules) example.question += sentence + " ";
    example.question += facts[0] + " " + facts[1] + " True or false: " + name + " is " + (query_negated ? "not " : "") + adjectives[0] + ".";
    for (int k = 0; k < 5; ++k)
      example.steps.push_back(name + " is " + article(chain(k)) + " " + chain(k) + ". " + proof[static_cast<size_t>(k)]);
    example.steps.push_back(name + " is " + (negated[0] ? "not " : "") + adjectives[0] + ".");
    example.answer = answer ? "True" : "False";
    examples.push_back(std::move(example));
  }
  return examples;
}

}  // namespace coconut
