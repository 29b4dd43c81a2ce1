#!/usr/bin/env python3
"""The ProntoQA questions whose query is positive ("True or false: Max is wooden.", no "not"): for
them the answer is the polarity of the chain's conclusion, the one-bit readout that stage 6's first
run trains (experiments/recipes/prontoqa-coconut-stage6.sh says why).

    python3 experiments/prontoqa_positive_queries.py data/prontoqa/train.json OUT.json

Standard library only.
"""
import json
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    questions = json.load(open(sys.argv[1]))
    positive = [q for q in questions if " not " not in q["question"].split("True or false:")[-1]]
    json.dump(positive, open(sys.argv[2], "w"))
    print(len(positive), "of", len(questions), "questions have a positive query")


if __name__ == "__main__":
    main()
