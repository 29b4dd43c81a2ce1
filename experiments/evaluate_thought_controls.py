#!/usr/bin/env python3
"""Thought controls on the shipped Coconut models (issue 71): each model answers its questions
normally and with every continuous thought replaced (zero, noise, shuffle, mean, token), by
`coconut eval --thought-control`, which also gives McNemar's exact test against the normal run.

    experiments/evaluate_thought_controls.py [--out results/thought_controls] [--models a,b] [--seeds 3] [--sets released,generated]

Data: the released validation sets (data/prosqa/valid.json, data/prontoqa/valid.json) and
generated test questions in the released shape, seed 5001 (`coconut data --task prosqa` and
`--task prontoqa`; no model was chosen on them). The baselines (ProntoQA's CoT, no-CoT and
pause-as-thought models) answer the same questions, plainly (OUT/baselines.csv). The mean control averages the thoughts of a calibration set that is
neither: ProsQA's generated selection questions (seed 992, as experiments/recipes/prosqa-coconut
chose on), ProntoQA's first 300 training questions. noise and shuffle run with seeds 0..N-1.
Writes OUT/controls.csv (one row per model, data, control, seed) and OUT/controls.md (the table).
Resumable: a run whose summary exists is read, not redone. SmolLM2's Coconut adapter
(smollm2-prontoqa-coconut-chain) runs over its base, `./run fetch-model smollm2-135m`, e.g.
    experiments/evaluate_thought_controls.py --out results/thought_controls_smollm2 --models smollm2-prontoqa-coconut-chain --sets released --seeds 1"""
import argparse
import csv
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COCONUT = os.path.join(ROOT, "build", "coconut")
MODELS = {  # name: task
    "prosqa-coconut": "prosqa",
    "prosqa-coconut-anydepth": "prosqa",
    "prontoqa-coconut": "prontoqa",
    "prontoqa-coconut-anydepth": "prontoqa",
    "smollm2-prontoqa-coconut-chain": "prontoqa",
}
# Models shipped as adapters: name -> the base they apply to (`./run fetch-model smollm2-135m`),
# evaluated in bf16 at batch 32 (a 135M model decoding 75 tokens per answer on the CPU).
ADAPTER_BASES = {"smollm2-prontoqa-coconut-chain": ".models/smollm2-135m"}


def model_arguments(model):
    """`coconut eval`'s arguments that load MODEL (a folder of models/, or an adapter over its base)."""
    if model in ADAPTER_BASES:
        return ["--model", ADAPTER_BASES[model], "--adapter", f"models/{model}", "--dtype", "bfloat16", "--batch-size", "32"]
    return ["--model", f"models/{model}"]
BASELINES = {"prontoqa": ["prontoqa-cot", "prontoqa-nocot", "prontoqa-pause-as-thought"]}
CONTROLS = ["zero", "noise", "shuffle", "mean", "token"]
SEEDED = {"noise", "shuffle"}


def run(command, log):
    with open(log, "w") as out:
        if subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT) != 0:
            sys.exit(f"failed: {' '.join(command)} (see {log})")


def prosqa_questions(out, seed, name, count):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        run([COCONUT, "data", "--task", "prosqa", "--count", str(count), "--seed", str(seed), "--people", "4",
             "--names-from", "data/prosqa/valid.json", "--concepts", "15", "25", "--path-steps", "3", "6",
             "--shape", "released", "--out", path], path + ".log")
    return path


def prontoqa_questions(out, seed, name, count):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        run([COCONUT, "data", "--task", "prontoqa", "--count", str(count), "--seed", str(seed), "--out", path], path + ".log")
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/thought_controls")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--generated", type=int, default=500, help="generated test questions per task")
    parser.add_argument("--sets", default="released,generated", help="which question sets: released, generated or both")
    args = parser.parse_args()
    for model in args.models.split(","):
        if model in ADAPTER_BASES and not os.path.isdir(os.path.join(ROOT, ADAPTER_BASES[model])):
            sys.exit(f"{model} is an adapter over {ADAPTER_BASES[model]}, which is missing: run ./run fetch-model smollm2-135m")
    os.makedirs(args.out, exist_ok=True)
    data = {
        "prosqa": [("released", "data/prosqa/valid.json"),
                   ("generated", prosqa_questions(args.out, 5001, "prosqa_generated_test.json", args.generated))],
        "prontoqa": [("released", "data/prontoqa/valid.json"),
                     ("generated", prontoqa_questions(args.out, 5001, "prontoqa_generated_test.json", args.generated))],
    }
    sets = args.sets.split(",")
    data = {task: [(name, path) for name, path in pairs if name in sets] for task, pairs in data.items()}
    calibration = {"prosqa": prosqa_questions(args.out, 992, "prosqa_selection_1000.json", 1000)}
    prontoqa_calibration = os.path.join(args.out, "prontoqa_train_300.json")
    if not os.path.exists(prontoqa_calibration):
        with open(os.path.join(ROOT, "data/prontoqa/train.json")) as f:
            questions = json.load(f)[:300]
        with open(prontoqa_calibration, "w") as f:
            json.dump(questions, f)
    calibration["prontoqa"] = prontoqa_calibration

    rows = []
    for model in args.models.split(","):
        task = MODELS[model]
        for data_name, data_path in data[task]:
            for control in CONTROLS:
                for seed in range(args.seeds if control in SEEDED else 1):
                    stem = os.path.join(args.out, f"{model}_{data_name}_{control}" + (f"_s{seed}" if control in SEEDED else ""))
                    if not os.path.exists(stem + ".json"):
                        command = [COCONUT, "eval", *model_arguments(model), "--data", data_path, "--thought-control", control,
                                   "--control-seed", str(seed), "--summary", stem + ".json", "--out", stem + ".jsonl", "--force"]
                        if control == "mean":
                            command += ["--thought-calibration", calibration[task]]
                        run(command, stem + ".log")
                    with open(stem + ".json") as f:
                        summary = json.load(f)
                    c = summary["thought_control"]
                    rows.append({"model": model, "data": data_name, "questions": summary["questions"], "control": control,
                                 "seed": seed if control in SEEDED else "", "normal": c["uncontrolled_accuracy"],
                                 "controlled": summary["accuracy"], "only_normal_right": c["only_uncontrolled_right"],
                                 "only_controlled_right": c["only_controlled_right"], "mcnemar_p": c["mcnemar_p"],
                                 "thoughts": summary["mean_latent_thoughts"], "tokens": summary["mean_generated_tokens"]})
                    print(f"{model} {data_name} {control} {rows[-1]['seed']}: {100 * rows[-1]['normal']:.1f}% -> "
                          f"{100 * rows[-1]['controlled']:.1f}% (p = {rows[-1]['mcnemar_p']:.3g})", flush=True)

    baselines = []
    for task, models in BASELINES.items():
        if not any(MODELS[m] == task for m in args.models.split(",")):
            continue
        for model in models:
            for data_name, data_path in data[task]:
                stem = os.path.join(args.out, f"{model}_{data_name}")
                if not os.path.exists(stem + ".json"):
                    run([COCONUT, "eval", *model_arguments(model), "--data", data_path, "--summary", stem + ".json",
                         "--out", stem + ".jsonl", "--force"], stem + ".log")
                with open(stem + ".json") as f:
                    summary = json.load(f)
                baselines.append({"model": model, "data": data_name, "questions": summary["questions"], "accuracy": summary["accuracy"],
                                  "thoughts": summary["mean_latent_thoughts"], "tokens": summary["mean_generated_tokens"]})
                print(f"{model} {data_name}: {100 * baselines[-1]['accuracy']:.1f}%", flush=True)
    if baselines:
        with open(os.path.join(args.out, "baselines.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(baselines[0]))
            writer.writeheader()
            writer.writerows(baselines)

    with open(os.path.join(args.out, "controls.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    # The table: per model and data, the normal accuracy and each control's (seeded ones: mean over
    # seeds, with the largest p-value of the seeds).
    lines = ["| model | data | questions | normal | " + " | ".join(CONTROLS) + " |",
             "|---|---|---|---|" + "---|" * len(CONTROLS)]
    for model in args.models.split(","):
        for data_name, _ in data[MODELS[model]]:
            cells = [r for r in rows if r["model"] == model and r["data"] == data_name]
            line = f"| {model} | {data_name} | {cells[0]['questions']} | {100 * cells[0]['normal']:.1f}% |"
            for control in CONTROLS:
                runs = [r for r in cells if r["control"] == control]
                accuracy = sum(r["controlled"] for r in runs) / len(runs)
                p = max(r["mcnemar_p"] for r in runs)
                line += f" {100 * accuracy:.1f}% (p {p:.2g}) |"
            lines.append(line)
    with open(os.path.join(args.out, "controls.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
