#!/usr/bin/env python3
"""Associative-recall questions in ProsQA's words and format: a dense lesson in the name match.

Usage: prosqa_recall_data.py NAMES.json COUNT SEED OUT.json [--facts N] [--recalls M] [--no-copula]

Each question is N facts with distinct subjects ("Sally is a zhorpus." for a person, "Every rempus
is a numpus." for a concept; each subject has exactly one fact), then ProsQA's query about two of
its people ("Is Sally a zhorpus or rompus?", the other option the other person's object). The
chain of thought is M of the facts again, in a random order, and the answer is the root's fact.
Trained as CoT, every restated fact's object is a recall target (the subject is not predictable,
the object is): M lessons per question in "find the fact whose subject is this name and copy its
object", where a ProsQA question gives one (its answer). With --no-copula "X is a Y." is written
"X Y." (the query kept), as in experiments/recipes/prosqa-coconut/1_name_match.sh.
The people and concepts are those of NAMES.json (a ProsQA file: the released validation set), so
a model trained here has ProsQA's vocabulary. Standard library only.
"""
import argparse
import json
import random


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("names")
    parser.add_argument("count", type=int)
    parser.add_argument("seed", type=int)
    parser.add_argument("out")
    parser.add_argument("--facts", type=int, default=16)
    parser.add_argument("--recalls", type=int, default=8)
    parser.add_argument("--no-copula", action="store_true")
    args = parser.parse_args()
    people, concepts = set(), set()
    for example in json.load(open(args.names)):
        for symbol in example["idx_to_symbol"]:
            (people if symbol[0].isupper() else concepts).add(symbol)
    people, concepts = sorted(people), sorted(concepts)
    copula = " " if args.no_copula else " is a "
    rng = random.Random(args.seed)
    questions = []
    for _ in range(args.count):
        person_count = rng.randint(2, min(6, args.facts // 2))
        subjects = rng.sample(people, person_count) + rng.sample(concepts, args.facts - person_count)
        rng.shuffle(subjects)
        facts = {}
        for subject in subjects:
            facts[subject] = rng.choice([c for c in concepts if c != subject])
        root, other = rng.sample([s for s in subjects if s in people], 2)
        while facts[other] == facts[root]:
            facts[other] = rng.choice([c for c in concepts if c != facts[root]])

        def sentence(subject):
            return (subject if subject in people else "Every " + subject) + copula + facts[subject] + "."

        options = [facts[root], facts[other]]
        rng.shuffle(options)
        query = f"Is {root} a {options[0]} or {options[1]}?"
        questions.append({
            "question": " ".join(sentence(s) for s in subjects) + " " + query,
            "steps": [sentence(s) for s in rng.sample(subjects, args.recalls)],
            "answer": sentence(root),
        })
    json.dump(questions, open(args.out, "w"))
    print(f"wrote {len(questions)} recall questions to {args.out}")


if __name__ == "__main__":
    main()
