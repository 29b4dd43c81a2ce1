#!/usr/bin/env python3
"""Issue 54's comparison of depth policies on ProsQA, from the folders experiments/eval_depth_policies.sh
writes: one any-depth model per seed (its prefixes, fewer thoughts, the calibrated cascades and a
range of confidences) against static models pruned and healed the same way (and, for reference, the
unhealed static sub-stacks of the parent from docs/anydepth_prosqa/substacks.csv).

Writes OUT.csv (one row per scheme, seed and setting) and OUT.png (accuracy against realised MFLOP
per answer, every scheme), and prints the tables and tests in Markdown:
- a random policy at the cascade's mean FLOPs (each question at full depth with the probability
  that spends those FLOPs, else at the cascade's first depth): its expected accuracy, exactly;
- McNemar's exact test (two-sided, on the questions where the two disagree) between the cascade and
  the full model of the same seed, and between the cascade and each static model.

  experiments/depth_policy_report.py OUT POLICY_DIR... --static DEPTH=DIR... [--substacks CSV]
"""
import argparse
import csv
import glob
import json
import os
import statistics
import subprocess

from mcnemar import mcnemar as paired_mcnemar


def summary(folder, name):
    with open(os.path.join(folder, name + ".json")) as f:
        return json.load(f)


def answers(folder, name):
    with open(os.path.join(folder, name + ".jsonl")) as f:
        return [json.loads(line) for line in f]


def mcnemar(first, second):
    """McNemar's test of two answer lists (records with "correct"), question by question."""
    return paired_mcnemar([x["correct"] for x in first], [y["correct"] for y in second])


def random_policy(shallow, deep, target_flops):
    """Expected accuracy and FLOPs of sending each question to `deep` with probability p, else
    `shallow`, p chosen so the mean FLOPs equal target_flops."""
    f_shallow = statistics.mean(a["flops"] for a in shallow)
    f_deep = statistics.mean(a["flops"] for a in deep)
    p = min(1.0, max(0.0, (target_flops - f_shallow) / (f_deep - f_shallow)))
    accuracy = statistics.mean((1 - p) * a["correct"] + p * b["correct"] for a, b in zip(shallow, deep))
    return accuracy, (1 - p) * f_shallow + p * f_deep, p


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("policies", nargs="+")
    parser.add_argument("--static", nargs="+", required=True, help="DEPTH=DIR of experiments/eval_depth_policies.sh --static")
    parser.add_argument("--substacks", default="docs/anydepth_prosqa/substacks.csv")
    parser.add_argument("--layer-sets", help="OUT_DIR of experiments/eval_layer_set_cascade.sh: the parent's cascade over "
                        "layer sets (without 1, 3, 5, 7, then without 1, 5) at each calibration, plotted beside the rest")
    args = parser.parse_args()

    rows = []  # scheme, seed, setting, accuracy, mflop, extra
    def add(scheme, seed, setting, accuracy, flops, extra=""):
        rows.append({"scheme": scheme, "seed": seed, "setting": setting, "accuracy": round(accuracy, 4),
                     "mflop_per_answer": round(flops / 1e6, 1), "note": extra})

    static = {}
    for item in args.static:
        depth, folder = item.split("=", 1)
        s = summary(folder, "full")
        static[int(depth)] = (folder, s)
        add("static, pruned and healed", 0, f"{depth} layers", s["accuracy"], s["mean_flops"])
    if args.layer_sets:  # seed: the calibration set (2: runs/anydepth_data/calibrate.json; 3, 4: calibrate_seedS.json)
        for path in sorted(glob.glob(os.path.join(args.layer_sets, "cascade_without_1_3_5_7-without_1_5_at*.json"))):
            name = os.path.basename(path)[: -len(".json")]
            if name.endswith(".calibration"):
                continue
            fraction, _, seed = name.split("_at", 1)[1].partition("_calibration_seed")
            s = summary(args.layer_sets, name)
            add("parent, layer sets per question (without 1,3,5,7 then without 1,5)", int(seed or 2),
                f"calibrated to {float(fraction):.0%} FLOPs", s["accuracy"], s["mean_flops"])
    if os.path.exists(args.substacks):
        with open(args.substacks) as f:
            for r in csv.DictReader(f):
                if r["model"] == "models/prosqa-coconut" and r["dropped"] in ("none", "1", "1,5", "1,3,5", "1,3,5,7"):
                    add("static, parent's odd layers removed (not healed)", 0, f"{r['layers']} layers",
                        float(r["accuracy"]), float(r["mflop_per_answer"]) * 1e6)

    per_seed = []
    for seed, folder in enumerate(args.policies):
        result = {"folder": folder}
        for depth in range(4, 9):
            s = summary(folder, f"depth{depth}")
            result[f"depth{depth}"] = s
            add("any-depth: prefix", seed, f"first {depth} layers", s["accuracy"], s["mean_flops"])
        for thoughts in (0, 2, 4):
            s = summary(folder, f"thoughts{thoughts}")
            add("any-depth: fewer thoughts (full depth)", seed, f"{thoughts} thoughts", s["accuracy"], s["mean_flops"])
        for name in ("cascade_5-8", "cascade_5-6-7-8"):
            s = summary(folder, name)
            calibration = summary(folder, name + ".calibration")
            result[name] = s
            result[name + ".calibration"] = calibration
            add("any-depth: cascade, calibrated to 70% FLOPs", seed, name.replace("cascade_", "").replace("-", ","),
                s["accuracy"], s["mean_flops"], f"confidence {s['depth_cascade']['confidence']:.4f}, deepened {s['depth_cascade']['deepened']:.3f}")
        for name in sorted(n[:-5] for n in os.listdir(folder) if n.startswith("cascade_5-8_at") and n.endswith(".json")):
            s = summary(folder, name)
            add("any-depth: cascade 5,8 at fixed confidences", seed, name.split("_at")[1], s["accuracy"], s["mean_flops"])
        cascade = answers(folder, "cascade_5-8")
        accuracy, flops, p = random_policy(answers(folder, "depth5"), answers(folder, "depth8"), result["cascade_5-8"]["mean_flops"])
        result["random"] = (accuracy, flops, p)
        add("random depth 5 or 8 at the cascade's FLOPs", seed, f"p(8) = {p:.3f}", accuracy, flops)
        result["tests"] = {"full": mcnemar(cascade, answers(folder, "depth8"))}
        for depth, (static_folder, _) in static.items():
            result["tests"][f"static{depth}"] = mcnemar(cascade, answers(static_folder, "full"))
        for name in ("depth8", "depth5", "cascade_5-8"):
            try:
                result[name + "_batch1"] = summary(folder, name + "_batch1")
            except FileNotFoundError:
                pass
        per_seed.append(result)

    with open(args.out + ".csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)

    def mean_sd(values):
        values = list(values)
        return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)

    print(f"## Fixed depth: any-depth prefixes ({len(per_seed)} seeds, mean ± sd) against static models\n")
    print("| layers | MFLOP / answer | any-depth prefix | static, pruned and healed the same way |")
    print("|---|---|---|---|")
    for depth in range(8, 3, -1):
        m, sd = mean_sd(100 * r[f"depth{depth}"]["accuracy"] for r in per_seed)
        flops = per_seed[0][f"depth{depth}"]["mean_flops"] / 1e6
        st = f"{100 * static[depth][1]['accuracy']:.1f}%" if depth in static else "-"
        print(f"| {depth} | {flops:,.0f} | {m:.1f} ± {sd:.1f}% | {st} |")
    print("\n## Per-question depth: the cascade, calibrated on generated questions to 70% of the full model's FLOPs\n")
    print("| seed | cascade | confidence | deepened | accuracy | MFLOP (of full) | full model | random 5/8, same FLOPs | McNemar vs full (b/c, p) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed, r in enumerate(per_seed):
        full = r["depth8"]
        for name in ("cascade_5-8", "cascade_5-6-7-8"):
            s = r[name]
            line = f"| {seed} | {name[8:].replace('-', ',')} | {s['depth_cascade']['confidence']:.4f} | {s['depth_cascade']['deepened']:.3f} | "
            line += f"{100 * s['accuracy']:.1f}% | {s['mean_flops'] / 1e6:,.0f} ({s['mean_flops'] / full['mean_flops']:.3f}) | {100 * full['accuracy']:.1f}% | "
            if name == "cascade_5-8":
                b, c, p = r["tests"]["full"]
                line += f"{100 * r['random'][0]:.1f}% | {b}/{c}, {p:.2f} |"
            else:
                line += "| |"
            print(line)
    print("\n## The cascade (5,8) against each static model, McNemar (cascade right only / static right only, p)\n")
    print("| seed | " + " | ".join(f"static {d} ({100 * static[d][1]['accuracy']:.1f}%, {static[d][1]['mean_flops'] / 1e6:,.0f} MFLOP)" for d in sorted(static)) + " |")
    print("|---|" + "---|" * len(static))
    for seed, r in enumerate(per_seed):
        print(f"| {seed} | " + " | ".join("{}/{}, {:.3f}".format(*r["tests"][f"static{d}"]) for d in sorted(static)) + " |")
    print("\n## Latency per answer (seconds; batch 16 and batch 1)\n")
    print("| seed | full depth | first 5 layers | cascade 5,8 |")
    print("|---|---|---|---|")
    for seed, r in enumerate(per_seed):
        cells = []
        for name in ("depth8", "depth5", "cascade_5-8"):
            batch1 = r.get(name + "_batch1")
            cells.append(f"{r[name]['mean_latency_seconds'] * 1e3:.2f} ms / " + (f"{batch1['mean_latency_seconds'] * 1e3:.2f} ms" if batch1 else "-"))
        print(f"| {seed} | " + " | ".join(cells) + " |")
    for depth, (folder, _) in sorted(static.items()):
        try:
            b1 = summary(folder, "full_batch1")
            print(f"\nstatic {depth}: {static[depth][1]['mean_latency_seconds'] * 1e3:.2f} ms / {b1['mean_latency_seconds'] * 1e3:.2f} ms", end="")
        except FileNotFoundError:
            pass
    print()

    # The plot: one series per scheme (seed 0 for the any-depth curves, every seed's calibrated cascade).
    series = {}
    for row in rows:
        if row["scheme"].startswith("any-depth: prefix") or row["scheme"].startswith("any-depth: cascade 5,8 at") or row["scheme"].startswith("any-depth: fewer"):
            if row["seed"] != 0:
                continue
        series.setdefault(row["scheme"], []).append((row["mflop_per_answer"], 100 * row["accuracy"]))
    data = args.out + ".dat"
    with open(data, "w") as f:
        for name, points in series.items():
            f.write(f'"{name}"\n')
            for x, y in sorted(points):
                f.write(f"{x} {y}\n")
            f.write("\n\n")
    plot = [f'set terminal pngcairo size 1000,650 font ",10"', f'set output "{args.out}.png"',
            'set xlabel "realised MFLOP per answer (prompt, thoughts, answer, every level run)"', 'set ylabel "accuracy (%)"',
            'set title "ProsQA, 300 released validation questions: depth policies from one parent"', 'set key bottom right', 'set grid',
            'set yrange [85:98]']
    styles = {"any-depth: cascade, calibrated to 70% FLOPs": "points pt 7 ps 1.6", "random depth 5 or 8 at the cascade's FLOPs": "points pt 6 ps 1.4",
              "static, pruned and healed": "linespoints pt 5 lw 2", "static, parent's odd layers removed (not healed)": "linespoints pt 4 dt 2",
              "parent, layer sets per question (without 1,3,5,7 then without 1,5)": "points pt 9 ps 1.8"}
    plot.append("plot " + ", ".join(f'"{data}" index {i} using 1:2 with {styles.get(name, "linespoints pt 7 ps 0.8")} title "{name}"'
                                    for i, name in enumerate(series)))
    subprocess.run(["gnuplot"], input="\n".join(plot), text=True, check=True)
    os.remove(data)


if __name__ == "__main__":
    main()
