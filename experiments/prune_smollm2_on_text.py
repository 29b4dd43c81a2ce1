#!/usr/bin/env python3
"""Depth pruning of SmolLM2-135M measured as the field measures it, on plain text (issue 69).

    python3 experiments/prune_smollm2_on_text.py [--model .models/smollm2-135m] [--out results/smollm2_text_pruning]
        [--counts 2,4,6,8,10,12] [--scores angular,bi,ablation] [--healed NAME=ADAPTER ...] [--full] [--plots-only]

1. Layer scores on the calibration text (data/text/wikipedia-calibration.txt, never the test text), with
   `coconut score-layers` in float32: angular distance of every n-layer block (Gromov et al.), block
   influence of each layer (ShortGPT), and the calibration loss with each n-layer block removed (ablation).
2. For each score and each count k, the layers it removes: angular, the k-layer block of least angular
   distance between its input and output; bi, the k layers of least block influence, contiguous or not;
   ablation, the k-layer block whose removal raises the calibration loss least (the rules of
   `coconut prune --drop-block k --metric ...`).
3. Each variant, unhealed (`eval-lm --drop-layers`, bfloat16 on the CPU), on fixed subsets: perplexity of
   the first 16,384 tokens of data/text/wikipedia-test.txt and of the first 8,192 of
   data/text/shakespeare-tempest.txt (another source), windows of 512; acc and acc_norm on the first 250
   items of data/text/wiki-describe.jsonl and of data/text/wiki-continuation.jsonl, with per-item scores
   for paired bootstrap intervals against the unpruned model.
4. `--healed NAME=ADAPTER`: a pruned and healed variant, an adapter over the unpruned model whose
   coconut.json names the layers it drops (`eval-lm --adapter`), measured the same way.
5. `--full`: the unpruned model and the healed variants on the whole test text, the whole play and every
   item of both multiple-choice sets (<out>/full.csv).
Writes <out>/scores_*.csv, <out>/variants/*.json, <out>/depth_pruning.csv and plots (gnuplot). Each
variant's results are kept: a run stopped part way resumes where it was.
"""
import argparse
import csv
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINARY = ROOT / "build" / "coconut"
CALIBRATION = ROOT / "data/text/wikipedia-calibration.txt"
TEXTS = {"wikipedia": (ROOT / "data/text/wikipedia-test.txt", 16384), "tempest": (ROOT / "data/text/shakespeare-tempest.txt", 8192)}
CHOICES = {"describe": ROOT / "data/text/wiki-describe.jsonl", "continuation": ROOT / "data/text/wiki-continuation.jsonl"}
SUBSET_ITEMS = 250
WINDOW = 512
CHANCE = 0.25  # four choices an item


def run(arguments, log):
    started = time.time()
    result = subprocess.run([str(BINARY)] + [str(a) for a in arguments], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"coconut {' '.join(map(str, arguments))} failed:\n{result.stderr[-3000:]}")
    print(f"  {time.time() - started:6.1f} s  coconut {arguments[0]} {' '.join(map(str, arguments[1:6]))} ...", file=log, flush=True)
    return result


def measure_scores(model, out, counts, scores, log):
    files = {}
    for score in scores:
        path = out / f"scores_{score}.csv"
        files[score] = path
        if path.exists() and score != "ablation":  # ablation: one file per block size, joined again for new sizes
            continue
        common = ["score-layers", "--model", model, "--data", CALIBRATION, "--window", 256, "--dtype", "float32", "--force"]
        if score == "angular":
            run(common + ["--samples", 32, "--metric", "angular", "--all-blocks", "--out", path, "--plot", out / "angular.png"], log)
        elif score == "bi":
            run(common + ["--samples", 32, "--metric", "bi", "--out", path, "--plot", out / "bi.png"], log)
        else:  # one CSV per block size, then joined
            parts = []
            for k in counts:
                part = out / f"scores_ablation_{k}.csv"
                if not part.exists():
                    run(common + ["--samples", 16, "--metric", "ablation", "--block", k, "--out", part], log)
                parts.append(part)
            rows = [line for i, p in enumerate(parts) for j, line in enumerate(p.read_text().splitlines()) if i == 0 or j > 0]
            path.write_text("\n".join(rows) + "\n")
    return files


def read_scores(path):
    with open(path) as file:
        return [{"start": int(r["start_layer"]), "size": int(r["block_size"]), "score": float(r["score"])}
                for r in csv.DictReader(file) if r["score"] not in ("", "nan")]


def layers_removed(score, rows, k, layers):
    if score == "bi":
        singles = sorted((r for r in rows if r["size"] == 1), key=lambda r: (r["score"], r["start"]))
        return sorted(r["start"] for r in singles[:k])
    blocks = [r for r in rows if r["size"] == k and r["start"] + k <= layers]
    best = min(blocks, key=lambda r: (r["score"], r["start"]))
    return list(range(best["start"], best["start"] + k))


def evaluate(model, removed, path, log, adapter="", full=False):
    """Perplexities and accuracies of the model without `removed` (or with `adapter`, which names its own)."""
    if path.exists():
        return json.loads(path.read_text())
    drop = ["--drop-layers", ",".join(map(str, removed))] if removed and not adapter else []
    common = ["eval-lm", "--model", model, "--weights", "dense", "--dtype", "bfloat16", "--force"] + drop
    if adapter:
        common += ["--adapter", adapter]
    record = {"removed": removed, "adapter": adapter}
    for name, (text, tokens) in TEXTS.items():
        summary = path.with_suffix(f".{name}.json")
        run(common + ["--text", text, "--window", WINDOW, "--limit", 0 if full else tokens, "--summary", summary], log)
        record[f"ppl_{name}"] = json.loads(summary.read_text())["perplexity"]
        record[f"tokens_{name}"] = json.loads(summary.read_text())["scored_tokens"]
    for name, items in CHOICES.items():
        summary, per_item = path.with_suffix(f".{name}.json"), path.with_suffix(f".{name}.items.jsonl")
        run(common + ["--choices", items, "--limit", 0 if full else SUBSET_ITEMS, "--summary", summary, "--out", per_item], log)
        result = json.loads(summary.read_text())
        record[f"acc_{name}"], record[f"acc_norm_{name}"] = result["acc"], result["acc_norm"]
        record[f"items_{name}"] = [{"label": r["label"], "pred_norm": r["pred_norm"]}
                                   for r in map(json.loads, per_item.read_text().splitlines())]
    path.write_text(json.dumps(record))
    return record


def mean_acc_norm(record):
    return sum(record[f"acc_norm_{name}"] for name in CHOICES) / len(CHOICES)


def paired_bootstrap(base, variant, resamples=2000, seed=0):
    """95% interval of (variant - base) mean acc_norm over both tasks' items, items resampled in pairs."""
    pairs = [(b["pred_norm"] == b["label"], v["pred_norm"] == v["label"])
             for name in CHOICES for b, v in zip(base[f"items_{name}"], variant[f"items_{name}"])]
    rng = random.Random(seed)
    differences = sorted(sum(v - b for b, v in (rng.choice(pairs) for _ in pairs)) / len(pairs) for _ in range(resamples))
    return differences[int(0.025 * resamples)], differences[int(0.975 * resamples) - 1]


def flops_per_token(config, removed, context=WINDOW):
    """2 x multiply-accumulates of one token's forward at `context` positions of attention (eval/cost.h's count)."""
    d, inter, heads, kv = (config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"))
    head_dim = d // heads
    per_layer = 2 * (d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d + 3 * d * inter)
    per_layer += 2 * 2 * heads * head_dim * context  # scores and weighted sum over the context
    return per_layer * (config["num_hidden_layers"] - len(removed)) + 2 * d * config["vocab_size"]


def plot(out, rows):
    data = out / "depth_pruning.dat"
    scores = sorted({r["score"] for r in rows if r["k"] > 0})
    style = lambda name: "with points pointtype 7 pointsize 1.5" if name.startswith("healed") else "with linespoints"
    with open(data, "w") as file:  # one block per score, each from the unpruned model (k = 0)
        for score in scores:
            file.write(f"# {score}\n")
            healed = score.startswith("healed")
            for r in sorted((r for r in rows if r["score"] == score or (r["k"] == 0 and not healed)), key=lambda r: r["k"]):
                file.write(f"{r['k']} {r['ppl_wikipedia']} {r['ppl_tempest']} {r['mean_acc_norm']} {r['gflops']}\n")
            file.write("\n\n")
    script = [
        "set terminal pngcairo size 1200,450 font ',10' noenhanced",
        f"set output '{out / 'depth_pruning.png'}'",
        "set multiplot layout 1,3",
        "set key top left", "set grid", "set xlabel 'layers removed (of 30); lines unhealed, dots healed'",
        "set ylabel 'perplexity (log scale)'", "set logscale y",
        "set title 'Wikipedia test text'",
        "plot " + ", ".join(f"'{data}' index {i} using 1:2 {style(s)} linecolor {i + 1} title '{s}'" for i, s in enumerate(scores)),
        "set title 'The Tempest (another source)'",
        "plot " + ", ".join(f"'{data}' index {i} using 1:3 {style(s)} linecolor {i + 1} title '{s}'" for i, s in enumerate(scores)),
        "unset logscale y", "set ylabel 'mean acc_norm (2 tasks, 500 items)'", "set title 'zero-shot multiple choice'",
        "set yrange [0.2:*]", "set key bottom left",
        "plot " + ", ".join(f"'{data}' index {i} using 1:4 {style(s)} linecolor {i + 1} title '{s}'" for i, s in enumerate(scores)) +
        f", {CHANCE} with lines dashtype 2 linecolor rgb 'gray' title 'chance'",
        "unset multiplot",
    ]
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / ".models/smollm2-135m"))
    parser.add_argument("--out", default=str(ROOT / "results/smollm2_text_pruning"))
    parser.add_argument("--counts", default="2,4,6,8,10,12")
    parser.add_argument("--scores", default="angular,bi,ablation")
    parser.add_argument("--healed", action="append", default=[], help="NAME=ADAPTER: a pruned and healed variant")
    parser.add_argument("--full", action="store_true", help="also the whole test sets, for the unpruned model and --healed")
    parser.add_argument("--plots-only", action="store_true", help="tabulate and plot what was measured")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "variants").mkdir(parents=True, exist_ok=True)
    counts = [int(k) for k in args.counts.split(",")]
    scores = args.scores.split(",")
    config = json.loads((Path(args.model) / "config.json").read_text())
    layers = config["num_hidden_layers"]
    log = sys.stderr

    variants = {("none", 0): []}
    if not args.plots_only:
        files = measure_scores(args.model, out, counts, scores, log)
        for score in scores:
            rows = read_scores(files[score])
            for k in counts:
                variants[(score, k)] = layers_removed(score, rows, k, layers)
    else:
        for path in sorted((out / "variants").glob("*-*.json")):
            score, k = path.stem.rsplit("-", 1)
            if path.name.count(".") == 1 and k.isdigit() and score in ("angular", "bi", "ablation", "none"):
                variants[(score, int(k))] = json.loads(path.read_text())["removed"]
    results = {}
    for (score, k), removed in variants.items():
        path = out / "variants" / f"{score}-{k}.json"
        if args.plots_only and not path.exists():
            continue
        print(f"{score} k={k}: layers {removed}", file=log, flush=True)
        results[(score, k)] = evaluate(args.model, removed, path, log)
    healed = dict(entry.split("=", 1) for entry in args.healed)
    for name, adapter in healed.items():
        removed = json.loads((Path(adapter) / "coconut.json").read_text()).get("dropped_layers", [])
        print(f"healed {name}: layers {removed}, adapter {adapter}", file=log, flush=True)
        results[(f"healed {name}", len(removed))] = evaluate(args.model, removed, out / "variants" / f"healed-{name}.json", log,
                                                            adapter)
    if args.full:
        full_rows = []
        for name, adapter in [("unpruned", "")] + list(healed.items()):
            removed = json.loads((Path(adapter) / "coconut.json").read_text()).get("dropped_layers", []) if adapter else []
            print(f"full test sets: {name}", file=log, flush=True)
            record = evaluate(args.model, removed, out / "variants" / f"full-{name}.json", log, adapter, full=True)
            full_rows.append({"variant": name, "layers_removed": " ".join(map(str, removed)),
                              **{key: record[key] for key in record if key.startswith(("ppl_", "tokens_", "acc"))},
                              "mean_acc_norm": mean_acc_norm(record), "items": sum(len(record[f"items_{n}"]) for n in CHOICES)})
            if name != "unpruned":
                full_rows[-1]["delta_low"], full_rows[-1]["delta_high"] = paired_bootstrap(
                    json.loads((out / "variants" / "full-unpruned.json").read_text()), record)
        with open(out / "full.csv", "w", newline="") as file:
            fields = sorted({key for row in full_rows for key in row}, key=lambda key: (key != "variant", key))
            writer = csv.DictWriter(file, fieldnames=fields)
            writer.writeheader()
            writer.writerows(full_rows)

    base = results[("none", 0)]
    rows = []
    for (score, k), record in sorted(results.items(), key=lambda item: (item[0][0], item[0][1])):
        if score.startswith("healed"):
            k = len(record["removed"])
        low, high = paired_bootstrap(base, record) if k else (0.0, 0.0)
        rows.append({"score": score, "k": k, "layers_removed": " ".join(map(str, record["removed"])),
                     "ppl_wikipedia": record["ppl_wikipedia"], "ppl_tempest": record["ppl_tempest"],
                     "acc_describe": record["acc_describe"], "acc_norm_describe": record["acc_norm_describe"],
                     "acc_continuation": record["acc_continuation"], "acc_norm_continuation": record["acc_norm_continuation"],
                     "mean_acc_norm": mean_acc_norm(record), "delta_low": low, "delta_high": high,
                     "gflops": flops_per_token(config, record["removed"]) / 1e9})
    with open(out / "depth_pruning.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    plot(out, rows)
    print(f"wrote {out / 'depth_pruning.csv'} and {out / 'depth_pruning.png'}", file=log)


if __name__ == "__main__":
    main()
