#!/usr/bin/env python3
"""Build data/gsm8k/train.json, GSM8K's training problems in Coconut's form, from openai/grade-school-math.

    python3 data/make_gsm8k_train.py TRAIN_JSONL [--valid data/gsm8k/valid.json] [--out data/gsm8k/train.json]

TRAIN_JSONL: grade_school_math/data/train.jsonl of github.com/openai/grade-school-math (MIT),
commit 3101c7d5072418e28b9008a6636bde82a006892c, 7,473 problems, sha256 below (checked).

Coconut's form is what data/gsm8k/valid.json holds (Coconut's preprocessing of the implicit-CoT
release): the question as written, the steps the solution's calculator annotations `<<expr=value>>`
in order (the prose around them dropped), the answer the text after `####` as written (thousands
separators kept, as valid.json keeps them). Every problem of valid.json is one of train.jsonl's (all
500, by the question with whitespace collapsed): those are dropped, so training never sees the
validation set, and each is checked to convert to exactly its valid.json entry (question, steps,
answer), so this conversion is Coconut's; valid.json writes a problem without annotations with the
one empty step [""], here it has no steps. The 89 such problems left stay (CoT writes the answer
alone for them).
GSM8K's test split is not read. Standard library only; the output is deterministic (train.jsonl's order).
"""
import argparse
import hashlib
import json
import os
import re
import sys

TRAIN_SHA256 = "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"
ANNOTATION = re.compile(r"<<([^<>]*)>>")


def normalized(question):
    return " ".join(question.split()).lower()


def coconut_problem(row, where):
    solution = row["answer"]
    if "####" not in solution:
        sys.exit(f"{where}: the solution has no '#### answer' line")
    steps = ["<<" + expression + ">>" for expression in ANNOTATION.findall(solution)]
    for step in steps:
        if "=" not in step:
            sys.exit(f"{where}: the annotation {step} has no '='")
    answer = solution.split("####")[-1].strip()
    if not re.fullmatch(r"-?[0-9][0-9,]*(\.[0-9]+)?", answer):
        sys.exit(f"{where}: the answer {answer!r} is not a number")
    return {"question": row["question"], "steps": steps, "answer": answer}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("train_jsonl")
    parser.add_argument("--valid", default="data/gsm8k/valid.json")
    parser.add_argument("--out", default="data/gsm8k/train.json")
    args = parser.parse_args()

    with open(args.train_jsonl, "rb") as f:
        raw = f.read()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != TRAIN_SHA256:
        sys.exit(f"{args.train_jsonl}: sha256 {digest}, not the pinned {TRAIN_SHA256} (another revision of train.jsonl?)")
    rows = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    with open(args.valid) as f:
        held_out = {normalized(problem["question"]): problem for problem in json.load(f)}

    problems, dropped = [], 0
    for number, row in enumerate(rows, 1):
        problem = coconut_problem(row, f"{args.train_jsonl}:{number}")
        valid = held_out.get(normalized(row["question"]))
        if valid is None:
            problems.append(problem)
            continue
        dropped += 1
        if problem != dict(valid, steps=[step for step in valid["steps"] if step]):
            sys.exit(f"{args.train_jsonl}:{number} converts to {problem}, but {args.valid} has it as {valid}")
    if dropped != len(held_out):
        sys.exit(f"{args.valid}: {len(held_out)} questions, but {dropped} of them were found in {args.train_jsonl}")

    temporary = args.out + ".tmp"
    with open(temporary, "w") as f:
        json.dump(problems, f, ensure_ascii=False)
    os.replace(temporary, args.out)
    no_steps = sum(1 for p in problems if not p["steps"])
    steps = sum(len(p["steps"]) for p in problems)
    print(f"{args.out}: {len(problems)} problems ({dropped} of {args.valid} dropped, {no_steps} without steps), "
          f"{steps / len(problems):.2f} steps per problem")


if __name__ == "__main__":
    main()
