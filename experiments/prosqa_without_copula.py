#!/usr/bin/env python3
"""A ProsQA file with the copula left out of its facts, chains and answers: "Every A is a B." ->
"Every A B.", "Tom is a C." -> "Tom C."; the query ("Is Tom a X or Y?") and the graph fields kept.

    python3 experiments/prosqa_without_copula.py IN.json OUT.json

The spelling of the name-match runs (docs/results-prosqa.md, "The name match"): the object follows its subject, so
finding a fact by its subject is the textbook induction pattern. Used on generated files and on the
released validation set alike (the same questions, respelled; scored on the respelled answer).
Standard library only.
"""
import json
import re
import sys

FACT = re.compile(r"\b(\w+) is a (\w+)\.")


def without_copula(text):
    return FACT.sub(r"\1 \2.", text)


def main(source, out):
    data = json.load(open(source))
    for example in data:
        example["question"] = without_copula(example["question"])
        example["steps"] = [without_copula(step) for step in example["steps"]]
        example["answer"] = without_copula(example["answer"])
    json.dump(data, open(out, "w"))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
