// The synthetic task of the CPU demo: a running sum modulo m.
//   question: "3 7 1 8"            (n digits)
//   steps:    "3", "0", "1", "9"   (the running sum mod m after each digit)
//   answer:   "9"
// Each step needs one addition of the previous sum and the next digit; answering directly needs
// the whole sum in one forward pass, which a small model does poorly (sums mod m are parity-like
// for a transformer). With a word-level tokenizer every digit and every step is one token, so step
// i sits at a constant distance from digit i and a chain of thought needs no content-based
// retrieval, the skill that tiny models trained from scratch on a CPU never acquired on ProntoQA /
// ProsQA.
#pragma once

#include <cstdint>
#include <vector>

#include "data/example.h"

namespace coconut {

struct SumsOptions {
  int digits = 8;     // n, the question's length
  int modulus = 10;   // m; digits are 0 .. m-1
};

std::vector<Example> generate_sums(int count, uint64_t seed, const SumsOptions& options = {});

}  // namespace coconut
