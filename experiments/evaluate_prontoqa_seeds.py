#!/usr/bin/env python3
"""ProntoQA's Coconut and pause-as-thought arms over their seeds (issue 71): every seed's model
answers the released 200 and 500 generated questions, compared question by question (McNemar's
exact test) with the Coconut model of the same seed, and each arm's seeds with one another.

    experiments/evaluate_prontoqa_seeds.py [--out results/prontoqa_seeds] [--seeds 0,1,2]

Seed 0 of each arm is the shipped model (models/prontoqa-coconut, models/prontoqa-pause-as-thought);
seed s > 0 is what experiments/recipes/prontoqa-coconut.sh s and prontoqa-pause-as-thought.sh s
leave in runs/ (runs/prontoqa_coconut_s$s/final, runs/prontoqa_pause_s$s/final). A seed whose model
is missing is skipped and named. Generated questions: `coconut data --task prontoqa --count 500
--seed 5001`, as experiments/evaluate_thought_controls.py draws them (no model was chosen on them).
Writes OUT/seeds.csv (one row per arm, seed and set), OUT/agreement.csv (each pair of seeds of an
arm: the share of questions both answer alike) and prints the means. Resumable: an evaluation
whose summary exists is read, not redone."""
import argparse
import csv
import itertools
import json
import os
import statistics
import sys

from evaluate_thought_controls import COCONUT, ROOT, prontoqa_questions, run
from mcnemar import mcnemar

ARMS = {  # arm: (the shipped seed 0, the recipe's run folder for seed s)
    "coconut": ("models/prontoqa-coconut", "runs/prontoqa_coconut_s{seed}/final"),
    "pause_as_thought": ("models/prontoqa-pause-as-thought", "runs/prontoqa_pause_s{seed}/final"),
}


def model_path(arm, seed):
    shipped, trained = ARMS[arm]
    return shipped if seed == 0 else trained.format(seed=seed)


def answers(out, arm, seed, data_name, data_path):
    """The model's records on the set, one per question, in the set's order (evaluated once)."""
    stem = os.path.join(out, f"{arm}_s{seed}_{data_name}")
    if not os.path.exists(stem + ".json"):
        run([COCONUT, "eval", "--model", model_path(arm, seed), "--data", data_path, "--summary", stem + ".json",
             "--out", stem + ".jsonl", "--force"], stem + ".log")
    with open(stem + ".jsonl") as f:
        records = sorted((json.loads(line) for line in f if line.strip()), key=lambda r: r["index"])
    return records


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/prontoqa_seeds")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--generated", type=int, default=500, help="generated test questions")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sets = [("released", "data/prontoqa/valid.json"),
            ("generated", prontoqa_questions(args.out, 5001, "prontoqa_generated_test.json", args.generated))]
    seeds = [int(s) for s in args.seeds.split(",")]
    present = {arm: [s for s in seeds if os.path.exists(os.path.join(ROOT, model_path(arm, s), "model.safetensors"))]
               for arm in ARMS}
    for arm in ARMS:
        missing = sorted(set(seeds) - set(present[arm]))
        if missing:
            print(f"{arm}: no model for seed(s) {missing} ({model_path(arm, missing[0])}): skipped", file=sys.stderr)

    rows, agreement = [], []
    for data_name, data_path in sets:
        records = {(arm, s): answers(args.out, arm, s, data_name, data_path) for arm in ARMS for s in present[arm]}
        for (arm, seed), answered in records.items():
            # Against Coconut of the same seed where it exists, else Coconut's shipped seed 0.
            reference = ("coconut", seed) if ("coconut", seed) in records else ("coconut", 0)
            right = [r["correct"] for r in answered]
            only_coconut, only_arm, p = mcnemar([r["correct"] for r in records[reference]], right) \
                if reference in records and reference != (arm, seed) else ("", "", "")
            rows.append({"arm": arm, "seed": seed, "data": data_name, "questions": len(answered),
                         "accuracy": round(statistics.mean(right), 4),
                         "answers_true": round(statistics.mean(r["predicted"] == "True" for r in answered), 4),
                         "thoughts": statistics.mean(r["latent_thoughts"] for r in answered),
                         "tokens": round(statistics.mean(r["generated_tokens"] for r in answered), 2),
                         "coconut_seed": reference[1], "only_coconut_right": only_coconut, "only_arm_right": only_arm,
                         "mcnemar_p": f"{p:.3g}" if p != "" else ""})
        for arm in ARMS:
            for a, b in itertools.combinations(present[arm], 2):
                same = statistics.mean(x["predicted"] == y["predicted"] for x, y in zip(records[(arm, a)], records[(arm, b)]))
                agreement.append({"arm": arm, "data": data_name, "seed_a": a, "seed_b": b, "same_answer": round(same, 4)})

    for name, table in (("seeds.csv", rows), ("agreement.csv", agreement)):
        if table:
            with open(os.path.join(args.out, name), "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(table[0]))
                writer.writeheader()
                writer.writerows(table)
    for arm in ARMS:
        for data_name, _ in sets:
            accuracies = [r["accuracy"] for r in rows if r["arm"] == arm and r["data"] == data_name]
            if accuracies:
                spread = f" ± {100 * statistics.stdev(accuracies):.1f}" if len(accuracies) > 1 else ""
                print(f"{arm} {data_name}: {100 * statistics.mean(accuracies):.1f}%{spread} over seeds "
                      f"{present[arm]} ({', '.join(f'{100 * a:.1f}%' for a in accuracies)})")
    for row in (r for r in rows if r["mcnemar_p"] != ""):
        print(f"{row['arm']} seed {row['seed']} {row['data']}: {100 * row['accuracy']:.1f}%, p = {row['mcnemar_p']} "
              f"against coconut seed {row['coconut_seed']}")


if __name__ == "__main__":
    main()
