// ProntoQA questions in the released shape (Coconut's release of ProntoQA, Saparov & He 2023:
// 5 hops over a fictional ontology with the generator's "relevant" distractors; data/prontoqa),
// generated here so that models can be measured on questions no training run or choice has seen.
// Every released question has the same structure, which this draws directly:
//  - 14 of the 17 class names in fixed roles: the proof chain C1 -> ... -> C5, a parent R of C5, one
//    more parent Di of each Ci, a second class E of the entity with its parent Ep, and a class X;
//  - 11 of the 13 property families (colour, size, material, ...), an adjective uniform in each;
//  - 23 rules in a random order: the 4 chain edges, C5's property P (the conclusion), C5 -> R, a
//    property of each of C1..C4, the 5 edges Ci -> Di and a property of each Di, E -> Ep and a
//    property of E, and X with P of the opposite polarity (the distractor for the query);
//  - the facts "Name is a C1." and "Name is a E." in a random order, then "True or false: Name is
//    [not] P." for True or the opposite for False (each half the questions);
//  - each rule written as "Xes are [not] Y." (half), "Each X is ..." or "Every X is ..." (a quarter each);
//  - 6 steps: "Name is a Ck. " + the rule that takes Ck on, as the question words it, for k = 1..5,
//    then "Name is [not] P.".
// Polarities as the original generator's rejection walk gives them (matched to the 9,200 released
// questions: P positive 0.533, C1..C4's 0.726, the others' 0.67): 102/193, 34/47 and 2/3.
// Seeded and reproducible; the words are the released set's, so a model trained on it reads them.
#pragma once

#include <cstdint>
#include <vector>

#include "data/example.h"

namespace coconut {

std::vector<Example> generate_prontoqa(int count, uint64_t seed);

}  // namespace coconut
