#!/usr/bin/env python3
"""The table of experiments/eval_layer_set_cascade.sh: every scheme's accuracy and realised MFLOP per
answer on the released questions, then for each cascade the paired tests (McNemar's exact test,
two-sided, on the questions where the two disagree) against the full model and against every static
model that costs at most the cascade's FLOPs (the best of them is the target's comparison).

    experiments/layer_set_cascade_report.py OUT_DIR
"""
import glob
import json
import os
import sys

from mcnemar import mcnemar



def main():
    out = sys.argv[1]
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
        name = os.path.basename(path)[: -len(".jsonl")]
        with open(path) as f:
            rows = sorted((json.loads(line) for line in f), key=lambda row: row["index"])
        runs[name] = {"correct": [row["correct"] for row in rows], "flops": sum(row["flops"] for row in rows) / len(rows)}
    full = runs["full"]
    print("| scheme | accuracy | MFLOP / answer | of full |")
    print("|---|---|---|---|")
    for name, run in sorted(runs.items(), key=lambda item: item[1]["flops"]):
        accuracy = sum(run["correct"]) / len(run["correct"])
        print(f"| {name} | {100 * accuracy:.1f}% | {run['flops'] / 1e6:,.0f} | {run['flops'] / full['flops']:.3f} |")
    statics = {name: run for name, run in runs.items() if name.startswith(("static_", "healed_"))}
    print()
    print("| cascade | against | accuracy difference (points) | cascade right only / other right only | p |")
    print("|---|---|---|---|---|")
    for name, run in sorted(runs.items()):
        if not name.startswith("cascade_"):
            continue
        accuracy = sum(run["correct"]) / len(run["correct"])
        cheaper = [other for other, static in statics.items() if static["flops"] <= run["flops"]]
        for other in ["full"] + sorted(cheaper, key=lambda o: -sum(runs[o]["correct"])):
            b, c, p = mcnemar(run["correct"], runs[other]["correct"])
            difference = 100 * (accuracy - sum(runs[other]["correct"]) / len(runs[other]["correct"]))
            print(f"| {name} | {other} | {difference:+.1f} | {b} / {c} | {p:.3g} |")


if __name__ == "__main__":
    main()
