// The small synthetic task of the CPU demo: follow a random mapping for several hops.
//   question: "q b m a j b ... . start b hops 3"   (pairs "x y" mean x maps to y, in random order)
//   steps:    "b a", "a j", "j q"                 (one lookup each)
//   answer:   "q"
// A chain of thought needs one lookup per step; answering directly needs all hops composed in one
// forward pass, which small models do poorly — the gap Coconut's latent thoughts can close.
// Every word is one token for a word-level tokenizer.
#pragma once

#include <cstdint>
#include <vector>

#include "data/example.h"

namespace coconut {

struct HopsOptions {
  int symbols = 10;   // size of the mapping (a permutation of the first `symbols` letters)
  int min_hops = 3;
  int max_hops = 5;
};

std::vector<Example> generate_hops(int count, uint64_t seed, const HopsOptions& options = {});

}  // namespace coconut
