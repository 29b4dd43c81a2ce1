#!/usr/bin/env python3
"""Width pruning of SmolLM2-135M at the FLOPs of its depth cuts, measured as the depth cuts are (issue 69).

    python3 experiments/prune_smollm2_width_on_text.py [--model .models/smollm2-135m] [--out results/smollm2_text_pruning]
        [--counts 2,4,6,8] [--metrics activation,wanda,taylor] [--healed NAME=ADAPTER ...] [--full] [--plots-only]

1. For each k in --counts, the FLOPs ratio of the model without k of its 30 layers (one token at context 512,
   eval/cost.h's count); every layer's MLP is cut to the widest uniform width within that ratio
   (`coconut prune --mlp-flops-ratio`), keeping the channels a metric ranks highest on the calibration text
   (data/text/wikipedia-calibration.txt, 32 windows of 256 tokens, float32; never the test text):
   activation (Minitron), wanda (Wanda-sp) or taylor (first-order loss change).
2. Each cut, unhealed, on the same fixed subsets as prune_smollm2_on_text.py (its `evaluate`): perplexity of
   16,384 tokens of the Wikipedia test text and 8,192 of The Tempest, acc_norm on 250 + 250 items, paired
   bootstrap intervals against the unpruned model (whose record that script measured: run it first).
3. `--healed NAME=ADAPTER`: a width cut healed and shipped as an adapter whose coconut.json names the channels
   it drops (`eval-lm --adapter`); `--full`: those on the whole test sets (<out>/width_full.csv).
Writes <out>/width/*.json, <out>/width_pruning.csv and width_pruning.png (perplexity and mean acc_norm against
GFLOPs per token, the depth cuts of depth_pruning.csv beside them). Resumable: measured cuts are kept; the
pruned folders are deleted once measured (their pruning.json stays).
"""
import argparse
import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prune_smollm2_on_text import (CALIBRATION, CHANCE, CHOICES, WINDOW, evaluate, mean_acc_norm,  # noqa: E402
                                   paired_bootstrap, run)


def flops_per_token(config, layers_removed=0, width=None, context=WINDOW):
    """2 x multiply-accumulates of one token's forward at `context` positions (eval/cost.h's count); `width`:
    every layer's MLP channels (None: the config's)."""
    d, heads, kv = (config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads"))
    inter = config["intermediate_size"] if width is None else width
    head_dim = d // heads
    per_layer = 2 * (d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d + 3 * d * inter)
    per_layer += 2 * 2 * heads * head_dim * context  # scores and weighted sum over the context
    return per_layer * (config["num_hidden_layers"] - layers_removed) + 2 * d * config["vocab_size"]


def width_of(pruning, config):
    """MLP channels every layer keeps, from a pruning.json or adapter coconut.json (uniform cuts only)."""
    dropped = {len(channels) for channels in pruning.get("dropped_mlp_channels", {}).values()}
    if len(dropped) > 1:
        sys.exit("not a uniform width cut")
    return config["intermediate_size"] - (dropped.pop() if dropped else 0)


def cut(model, out, metric, k, ratio, log):
    """The pruned folder's pruning.json summary: prunes (and later deletes) the folder unless measured."""
    folder = out / "width" / f"{metric}-{k}"
    report = out / "width" / f"{metric}-{k}.pruning.json"
    if not report.exists():
        run(["prune", "--model", model, "--data", CALIBRATION, "--window", 256, "--samples", 32, "--dtype", "float32",
             "--mlp-flops-ratio", repr(ratio), "--context", WINDOW, "--channel-metric", metric, "--out", folder, "--force"], log)
        shutil.copy(folder / "pruning.json", report)
    return folder, json.loads(report.read_text())


def plot(out, rows, depth_rows):
    data = out / "width_pruning.dat"
    series = []
    with open(data, "w") as file:
        for name in ["depth: ablation", "depth: bi"]:
            score = name.split(": ")[1]
            points = sorted((r for r in depth_rows if r["score"] in (score, "none")), key=lambda r: -float(r["gflops"]))
            points = [r for r in points if float(r["gflops"]) > 0.2]  # up to 12 layers
            series.append(name)
            file.write(f"# {name}\n")
            for r in points:
                file.write(f"{r['gflops']} {r['ppl_wikipedia']} {r['ppl_tempest']} {r['mean_acc_norm']}\n")
            file.write("\n\n")
        healed_depth = [r for r in depth_rows if r["score"].startswith("healed") and int(r["k"]) in (4, 8)]
        for r in sorted(healed_depth, key=lambda r: r["score"]):
            series.append(f"{r['score']} (depth)")
            file.write(f"# {r['score']}\n{r['gflops']} {r['ppl_wikipedia']} {r['ppl_tempest']} {r['mean_acc_norm']}\n\n\n")
        for metric in sorted({r["metric"] for r in rows} - {"none"}):
            series.append(metric if metric.startswith("healed") else f"width: {metric}")
            file.write(f"# {metric}\n")
            for r in sorted((r for r in rows if r["metric"] in (metric, "none")), key=lambda r: -r["gflops"]):
                if metric.startswith("healed") and r["metric"] == "none":
                    continue
                file.write(f"{r['gflops']} {r['ppl_wikipedia']} {r['ppl_tempest']} {r['mean_acc_norm']}\n")
            file.write("\n\n")
    style = lambda name: "with points pointtype 7 pointsize 1.5" if name.startswith("healed") else "with linespoints"
    plots = lambda column: "plot " + ", ".join(
        f"'{data}' index {i} using 1:{column} {style(s)} linecolor {i + 1} title '{s}'" for i, s in enumerate(series))
    script = [
        "set terminal pngcairo size 1200,450 font ',10' noenhanced",
        f"set output '{out / 'width_pruning.png'}'",
        "set multiplot layout 1,3",
        "set key top right", "set grid", "set xlabel 'GFLOPs per token (context 512)'", "set xrange [*:*] reverse",
        "set ylabel 'perplexity (log scale)'", "set logscale y",
        "set title 'Wikipedia test text'", plots(2),
        "set title 'The Tempest (another source)'", plots(3),
        "unset logscale y", "set ylabel 'mean acc_norm (2 tasks, 500 items)'", "set title 'zero-shot multiple choice'",
        "set yrange [0.2:*]", "set key bottom left",
        plots(4) + f", {CHANCE} with lines dashtype 2 linecolor rgb 'gray' title 'chance'",
        "unset multiplot",
    ]
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(Path(__file__).resolve().parent.parent / ".models/smollm2-135m"))
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "results/smollm2_text_pruning"))
    parser.add_argument("--counts", default="2,4,6,8")
    parser.add_argument("--metrics", default="activation,wanda,taylor")
    parser.add_argument("--healed", action="append", default=[], help="NAME=ADAPTER: a width cut healed")
    parser.add_argument("--full", action="store_true", help="also the whole test sets for --healed")
    parser.add_argument("--plots-only", action="store_true", help="tabulate and plot what was measured")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "width").mkdir(parents=True, exist_ok=True)
    config = json.loads((Path(args.model) / "config.json").read_text())
    log = sys.stderr
    base_path = out / "variants" / "none-0.json"
    if not base_path.exists():
        sys.exit(f"{base_path}: missing; run experiments/prune_smollm2_on_text.py first (the unpruned model's record)")
    base = json.loads(base_path.read_text())
    full_flops = flops_per_token(config)

    rows = [{"metric": "none", "k_equivalent": 0, "width": config["intermediate_size"], "gflops": full_flops / 1e9,
             "ppl_wikipedia": base["ppl_wikipedia"], "ppl_tempest": base["ppl_tempest"],
             "mean_acc_norm": mean_acc_norm(base), "delta_low": 0.0, "delta_high": 0.0}]
    for metric in args.metrics.split(","):
        for k in map(int, args.counts.split(",")):
            path = out / "width" / f"{metric}-{k}.json"
            if args.plots_only and not path.exists():
                continue
            ratio = flops_per_token(config, k) / full_flops
            folder, pruning = cut(args.model, out, metric, k, ratio, log) if not path.exists() else (None, None)
            if pruning is None:
                pruning = json.loads((out / "width" / f"{metric}-{k}.pruning.json").read_text())
            width = width_of(pruning, config)
            print(f"{metric} at the FLOPs of {k} layers removed: width {width}", file=log, flush=True)
            record = evaluate(str(folder), [], path, log) if folder else json.loads(path.read_text())
            if folder and folder.exists():
                shutil.rmtree(folder)
            low, high = paired_bootstrap(base, record)
            rows.append({"metric": metric, "k_equivalent": k, "width": width, "gflops": flops_per_token(config, 0, width) / 1e9,
                         "ppl_wikipedia": record["ppl_wikipedia"], "ppl_tempest": record["ppl_tempest"],
                         "mean_acc_norm": mean_acc_norm(record), "delta_low": low, "delta_high": high})
    healed = dict(entry.split("=", 1) for entry in args.healed)
    for name, adapter in healed.items():
        width = width_of(json.loads((Path(adapter) / "coconut.json").read_text()), config)
        print(f"healed {name}: width {width}, adapter {adapter}", file=log, flush=True)
        record = evaluate(args.model, [], out / "width" / f"healed-{name}.json", log, adapter)
        low, high = paired_bootstrap(base, record)
        rows.append({"metric": f"healed {name}", "k_equivalent": "", "width": width,
                     "gflops": flops_per_token(config, 0, width) / 1e9, "ppl_wikipedia": record["ppl_wikipedia"],
                     "ppl_tempest": record["ppl_tempest"], "mean_acc_norm": mean_acc_norm(record),
                     "delta_low": low, "delta_high": high})
    if args.full and healed:
        full_base = json.loads((out / "variants" / "full-unpruned.json").read_text())
        full_rows = []
        for name, adapter in healed.items():
            print(f"full test sets: {name}", file=log, flush=True)
            record = evaluate(args.model, [], out / "width" / f"full-{name}.json", log, adapter, full=True)
            low, high = paired_bootstrap(full_base, record)
            full_rows.append({"variant": name, "width": width_of(json.loads((Path(adapter) / "coconut.json").read_text()), config),
                              **{key: record[key] for key in record if key.startswith(("ppl_", "tokens_", "acc"))},
                              "mean_acc_norm": mean_acc_norm(record), "items": sum(len(record[f"items_{n}"]) for n in CHOICES),
                              "delta_low": low, "delta_high": high})
        with open(out / "width_full.csv", "w", newline="") as file:
            fields = sorted({key for row in full_rows for key in row}, key=lambda key: (key != "variant", key))
            writer = csv.DictWriter(file, fieldnames=fields)
            writer.writeheader()
            writer.writerows(full_rows)
    with open(out / "width_pruning.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    with open(out / "depth_pruning.csv") as file:
        depth_rows = list(csv.DictReader(file))
    plot(out, rows, depth_rows)
    print(f"wrote {out / 'width_pruning.csv'} and {out / 'width_pruning.png'}", file=log)


if __name__ == "__main__":
    main()
