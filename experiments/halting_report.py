#!/usr/bin/env python3
"""The table of experiments/eval_halting.sh: per scheme (a fixed thought count, or halting with the
confidence chosen on the calibration questions) the accuracy on the released questions, the thoughts
taken, the one-position passes a question waits for (its thoughts, then the tokens after them and
the answer, for every peek undone and the answer kept), realised MFLOP per answer and the latency
per answer at batch 16 and at batch 1 (best of the rounds); then McNemar's exact test (two-sided, on
the questions where the two disagree) of each halting scheme against the model with all its
thoughts and against every fixed count. Writes OUT_DIR/halting.csv.

    experiments/halting_report.py OUT_DIR
"""
import csv
import glob
import json
import os
import sys

from mcnemar import mcnemar



def passes(row):
    """One-position passes after the prompt's prefill: thoughts, then per answer read its n tokens
    (the tokens after the thoughts give the first; n - 1 are fed back)."""
    levels = row.get("cascade") or [{"generated_tokens": row["generated_tokens"]}]
    return row["latent_thoughts"] + sum(level["generated_tokens"] for level in levels)


def main():
    out = sys.argv[1]
    choices = {}
    with open(os.path.join(out, "choices.txt")) as f:
        for line in f:
            name, scheme, peek, confidence = line.split()
            choices[name] = f"{scheme}@{confidence}, peek {'the whole answer' if peek == '0' else peek + ' token'}"
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
        name = os.path.basename(path)[: -len(".jsonl")]
        with open(path) as f:
            rows = sorted((json.loads(line) for line in f), key=lambda row: row["index"])
        with open(os.path.join(out, name + ".json")) as f:
            summary = json.load(f)
        rounds = [json.load(open(p))["mean_latency_seconds"] for p in glob.glob(os.path.join(out, f"batch1_{name}_round*.json"))]
        n = len(rows)
        runs[name] = {
            "correct": [row["correct"] for row in rows],
            "accuracy": sum(row["correct"] for row in rows) / n,
            "thoughts": sum(row["latent_thoughts"] for row in rows) / n,
            "passes": sum(passes(row) for row in rows) / n,
            "flops": sum(row["flops"] for row in rows) / n,
            "latency16": summary["mean_latency_seconds"],
            "latency1": min(rounds) if rounds else float("nan"),
        }
    statics = sorted((name for name in runs if name.startswith("static_")), key=lambda name: int(name.split("_")[1]))
    full = runs[statics[-1]]
    header = ["scheme", "setting", "accuracy", "thoughts", "passes", "mflop", "of_full_flops", "ms_batch16", "ms_batch1",
              "of_full_ms_batch1"]
    table = []
    for name in statics + sorted(choices):
        run = runs[name]
        setting = choices.get(name, f"{name.split('_')[1]} thoughts")
        table.append([name, setting, f"{100 * run['accuracy']:.1f}", f"{run['thoughts']:.2f}", f"{run['passes']:.2f}",
                      f"{run['flops'] / 1e6:.1f}", f"{run['flops'] / full['flops']:.4f}", f"{1e3 * run['latency16']:.2f}",
                      f"{1e3 * run['latency1']:.2f}", f"{run['latency1'] / full['latency1']:.3f}"])
    with open(os.path.join(out, "halting.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(table)
    print("| scheme | accuracy | thoughts | passes | MFLOP / answer | of full | ms / answer, batch 16 | ms / answer, batch 1 | of full |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in table:
        print(f"| {row[1]} | {row[2]}% | {row[3]} | {row[4]} | {float(row[5]):,.1f} | {row[6]} | {row[7]} | {row[8]} | {row[9]} |")
    print()
    print("| halting | against | accuracy difference (points) | halting right only / other right only | p |")
    print("|---|---|---|---|---|")
    for name in sorted(choices):
        for other in reversed(statics):
            b, c, p = mcnemar(runs[name]["correct"], runs[other]["correct"])
            difference = 100 * (runs[name]["accuracy"] - runs[other]["accuracy"])
            print(f"| {choices[name]} | {other.split('_')[1]} thoughts | {difference:+.1f} | {b} / {c} | {p:.3g} |")


if __name__ == "__main__":
    main()
