#!/usr/bin/env python3
"""The table of experiments/recipes/prosqa-matched-arms.sh: each arm's accuracy per seed on the
released validation file and on the generated selection set, its mean and sample standard deviation
over the seeds, what an answer costs, and McNemar's exact test against the Coconut arm of the same
seed (the same questions, paired).

    python3 experiments/matched_arms_report.py RUN_DIR OUT_DIR

Reads RUN_DIR/{trunk,ARM_sSEED}_{valid,sel}.log (`coconut eval`'s summary) and .jsonl (its
per-question records); writes OUT_DIR/arms.csv, OUT_DIR/arms.md and OUT_DIR/arms.png (gnuplot:
each seed a point, the mean a bar). Standard library and gnuplot only.
"""
import csv
import json
import os
import re
import statistics
import subprocess
import sys

from mcnemar import mcnemar

ARMS = [("coconut", "Coconut"), ("pause_as_thought", "pause-as-thought"), ("cot", "CoT"), ("no_cot", "no-CoT")]
SETS = [("valid", "released validation (300)"), ("sel", "generated, released shape (1,000, seed 992)")]


def load(run_dir, run, split):
    summary = json.load(open(os.path.join(run_dir, f"{run}_{split}.log")))
    records = [json.loads(line) for line in open(os.path.join(run_dir, f"{run}_{split}.jsonl"))]
    records.sort(key=lambda record: record["index"])
    return summary, [bool(record["correct"]) for record in records]


def scored_row(run_dir, run, arm, seed, split, reference=None):
    """One run's scores on one set as a CSV row; McNemar against `reference` (Coconut's right/wrong
    on the same questions) where given. Returns the row and the run's right/wrong list."""
    summary, correct = load(run_dir, run, split)
    row = {"arm": arm, "seed": seed, "set": split, "questions": len(correct), "correct": sum(correct),
           "accuracy": sum(correct) / len(correct), "thoughts": summary["mean_latent_thoughts"],
           "tokens": summary["mean_generated_tokens"], "mflops": summary["mean_flops"] / 1e6,
           "only_coconut": "", "only_arm": "", "p_vs_coconut": ""}
    if reference is not None and len(reference) == len(correct):
        row["only_coconut"], row["only_arm"], row["p_vs_coconut"] = mcnemar(reference, correct)
    return row, correct


def seeds_of(run_dir, arm):
    pattern = re.compile(rf"^{arm}_s(\d+)_valid\.log$")
    return sorted(int(m.group(1)) for m in map(pattern.match, os.listdir(run_dir)) if m)


def spread(values):
    mean = statistics.mean(values)
    if len(values) < 2:
        return f"{100 * mean:.1f}%"
    return f"{100 * mean:.1f} ± {100 * statistics.stdev(values):.1f}%"


def main(run_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    coconut = {}
    for split, _ in SETS:
        for seed in seeds_of(run_dir, "coconut"):
            coconut[(split, seed)] = load(run_dir, f"coconut_s{seed}", split)[1]
    if os.path.exists(os.path.join(run_dir, "trunk_valid.log")):
        for split, _ in SETS:
            rows.append(scored_row(run_dir, "trunk", "trunk", "", split)[0])
    for arm, _ in ARMS:
        for seed in seeds_of(run_dir, arm):
            for split, _ in SETS:
                reference = coconut.get((split, seed)) if arm != "coconut" else None
                rows.append(scored_row(run_dir, f"{arm}_s{seed}", arm, seed, split, reference)[0])
    later = second_round(run_dir, rows)
    with open(os.path.join(out_dir, "arms.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)

    lines = ["| arm | seeds | " + " | ".join(name for _, name in SETS) +
             " | thoughts + tokens per answer | MFLOP per answer | McNemar p against Coconut, per seed (released; generated) |",
             "|---|---|---|---|---|---|---|"]
    for arm, name in [("trunk", "the trunk (start of every arm)")] + ARMS:
        mine = [row for row in rows if row["arm"] == arm]
        if not mine:
            continue
        seeds = sorted({row["seed"] for row in mine}, key=str)
        cells = []
        for split, _ in SETS:
            per_seed = [row["accuracy"] for row in mine if row["set"] == split]
            listed = ", ".join(f"{100 * value:.1f}" for value in per_seed)
            cells.append(spread(per_seed) + (f" ({listed})" if len(per_seed) > 1 else ""))
        valid = [row for row in mine if row["set"] == "valid"]
        thoughts = f"{statistics.mean(r['thoughts'] for r in valid):.1f}"
        if arm == "pause_as_thought":  # its pause tokens are prompt tokens: eval counts no thoughts
            trained = json.load(open(os.path.join(run_dir, f"{arm}_s{valid[0]['seed']}", "final", "coconut.json")))
            thoughts = f"{min(trained['stage'], trained['max_latent_stage'])} pause tokens"
        cost = (f"{thoughts} + {statistics.mean(r['tokens'] for r in valid):.1f}",
                f"{statistics.mean(r['mflops'] for r in valid):,.0f}")
        tests = []
        for split, _ in SETS:
            ps = [row["p_vs_coconut"] for row in mine if row["set"] == split and row["p_vs_coconut"] != ""]
            tests.append(" / ".join(f"{p:.2g}" for p in ps) if ps else "-")
        lines.append(f"| {name} | {len([s for s in seeds if s != '']) or '-'} | " + " | ".join(cells) +
                     f" | {cost[0]} | {cost[1]} | {'; '.join(tests)} |")
    lines += later
    with open(os.path.join(out_dir, "arms.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows, out_dir)


def second_round(run_dir, rows):
    """Rows (into `rows` too, arm ARM_r2) and a table for a second round of seed 0 (runs ARM_s0r2),
    each arm from its own first round, McNemar against Coconut's second round."""
    runs = [(arm, name) for arm, name in ARMS if os.path.exists(os.path.join(run_dir, f"{arm}_s0r2_valid.log"))]
    if not runs:
        return []
    lines = ["", "Seed 0, a second round (32,000 more graphs, each arm from its first round's weights):", "",
             "| arm | " + " | ".join(f"{title}: round 1 -> 2" for _, title in SETS) + " | McNemar p against Coconut, round 2 |",
             "|---|---|---|---|"]
    reference = {split: load(run_dir, "coconut_s0r2", split)[1] for split, _ in SETS
                 if os.path.exists(os.path.join(run_dir, f"coconut_s0r2_{split}.log"))}
    for arm, name in runs:
        cells, tests = [], []
        for split, _ in SETS:
            first = load(run_dir, f"{arm}_s0", split)[1]
            row, _ = scored_row(run_dir, f"{arm}_s0r2", arm + "_r2", 0, split, reference.get(split) if arm != "coconut" else None)
            if row["p_vs_coconut"] != "":
                tests.append(f"{row['p_vs_coconut']:.2g}")
            rows.append(row)
            cells.append(f"{100 * sum(first) / len(first):.1f} -> {100 * row['accuracy']:.1f}%")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'; '.join(tests) or '-'} |")
    return lines


def plot(rows, out_dir):
    """Accuracy per arm: a bar at the mean over seeds, each seed a point, seed 0's second round a
    triangle, one panel per question set."""
    names = [("trunk", "trunk")] + ARMS
    data = os.path.join(out_dir, "arms.dat")
    with open(data, "w") as f:
        for split, _ in SETS:  # one block per set: "x mean" rows, then a blank line, then "x seed-accuracy" rows
            for x, (arm, _) in enumerate(names):
                values = [row["accuracy"] for row in rows if row["arm"] == arm and row["set"] == split]
                if values:
                    f.write(f"{x} {100 * statistics.mean(values)}\n")
            f.write("\n\n")
            for x, (arm, _) in enumerate(names):
                for row in rows:
                    if row["arm"] == arm and row["set"] == split:
                        f.write(f"{x} {100 * row['accuracy']}\n")
            f.write("\n\n")
            seconds = [(x, row) for x, (arm, _) in enumerate(names) for row in rows if row["arm"] == arm + "_r2" and row["set"] == split]
            for x, row in seconds or [(-9, {"accuracy": 0})]:  # gnuplot needs a point in every block
                f.write(f"{x} {100 * row['accuracy']}\n")
            f.write("\n\n")
    tics = ", ".join(f"'{label}' {x}" for x, (_, label) in enumerate(names))
    script = [
        "set terminal pngcairo size 1100,420 font ',10' noenhanced",
        f"set output '{os.path.join(out_dir, 'arms.png')}'",
        "set multiplot layout 1,2 title 'ProsQA at 4 layers: four arms from one checkpoint, the same training'",
        "set style fill solid 0.35", "set boxwidth 0.6", "set grid ytics", "set yrange [50:100]", "set ytics 5",
        f"set xtics ({tics})", "set xrange [-0.6:4.6]", "set ylabel 'accuracy (%)'", "set key top left",
    ]
    for index, (_, title) in enumerate(SETS):
        script += [f"set title '{title}'",
                   f"plot '{data}' index {3 * index} using 1:2 with boxes title 'mean over seeds (one round)', "
                   f"'{data}' index {3 * index + 1} using 1:2 with points pointtype 7 pointsize 1.2 title 'each seed', "
                   f"'{data}' index {3 * index + 2} using 1:2 with points pointtype 9 pointsize 1.6 title 'seed 0, two rounds'"]
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
