#!/usr/bin/env python3
"""Did a stage-1 Coconut model make the first hop inside its thought? Reads `coconut eval --out`
predictions on ProntoQA and sorts each answer by its first written step (two sentences):
  step2    gold step 2 (the thought stood for step 1)
  restart  gold step 1 again
  skip     a later gold step (3, 4, ...)
  other    none of the gold steps

    python3 experiments/prontoqa_first_step.py predictions.jsonl data/prontoqa/valid.json

docs/results-prontoqa.md, "What blocks the conversion". Standard library only.
"""
import json
import re
import sys


def normal(text):
    return re.sub(r"\s+", " ", text.strip().lower())


def first_step(text):
    sentences = re.split(r"(?<=\.)\s", text.strip())
    return normal(" ".join(sentences[:2]))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    predictions = [json.loads(line) for line in open(sys.argv[1])]
    questions = json.load(open(sys.argv[2]))
    if len(predictions) != len(questions):
        sys.exit(f"{sys.argv[1]}: {len(predictions)} predictions for {len(questions)} questions in {sys.argv[2]}")
    counts = {"step2": 0, "restart": 0, "skip": 0, "other": 0}
    for prediction, question in zip(predictions, questions):
        first = first_step(prediction["generated"])
        steps = [normal(step) for step in question["steps"]]
        if len(steps) > 1 and first.startswith(steps[1]):
            counts["step2"] += 1
        elif first.startswith(steps[0]):
            counts["restart"] += 1
        elif any(first.startswith(step) for step in steps[2:]):
            counts["skip"] += 1
        else:
            counts["other"] += 1
    counts["correct"] = sum(bool(p.get("correct")) for p in predictions)
    counts["questions"] = len(predictions)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
