#!/usr/bin/env python3
"""Attention of SmolLM2-135M pruned by whole KV groups, measured as the depth cuts are (issue 69).

    python3 experiments/prune_smollm2_heads_on_text.py [--model .models/smollm2-135m] [--out results/smollm2_text_pruning]
        [--fractions 0.1,0.2,0.3,0.4]

For each fraction, `coconut prune --head-fraction F --granularity kv-group --head-metric grad` removes that
fraction of the model's 90 KV groups (each with its 3 query heads), least important first by the gradient of
group masks (Michel et al.) on the calibration text (32 windows of 256 tokens, float32; never the test text),
keeping at least one group a layer. Each cut, unhealed, is measured on the subsets of prune_smollm2_on_text.py
(its `evaluate`), with paired bootstrap intervals against the unpruned model (whose record that script
measured: run it first). Writes <out>/heads/*.json and <out>/heads_pruning.csv. Resumable; the pruned folders
are deleted once measured (their pruning.json stays).
"""
import argparse
import csv
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prune_smollm2_on_text import CALIBRATION, WINDOW, evaluate, mean_acc_norm, paired_bootstrap, run  # noqa: E402


def main():
    root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(root / ".models/smollm2-135m"))
    parser.add_argument("--out", default=str(root / "results/smollm2_text_pruning"))
    parser.add_argument("--fractions", default="0.1,0.2,0.3,0.4")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "heads").mkdir(parents=True, exist_ok=True)
    base_path = out / "variants" / "none-0.json"
    if not base_path.exists():
        sys.exit(f"{base_path}: missing; run experiments/prune_smollm2_on_text.py first (the unpruned model's record)")
    base = json.loads(base_path.read_text())
    rows = []
    for fraction in args.fractions.split(","):
        folder, report = out / "heads" / f"kv-group-{fraction}", out / "heads" / f"kv-group-{fraction}.pruning.json"
        path = out / "heads" / f"kv-group-{fraction}.json"
        if not report.exists():
            run(["prune", "--model", args.model, "--data", CALIBRATION, "--window", 256, "--samples", 32, "--dtype", "float32",
                 "--head-fraction", fraction, "--granularity", "kv-group", "--head-metric", "grad", "--context", WINDOW,
                 "--out", folder, "--force"], sys.stderr)
            shutil.copy(folder / "pruning.json", report)
        record = evaluate(str(folder), [], path, sys.stderr)
        if folder.exists():
            shutil.rmtree(folder)
        pruning = json.loads(report.read_text())
        low, high = paired_bootstrap(base, record)
        rows.append({"fraction": fraction, "groups_removed": pruning["dropped_heads"].count(":") // 3,
                     "gflops": pruning["flops_per_token"]["after"] / 1e9, "parameters": pruning["parameters"]["after"],
                     "kv_cache_bytes_per_token": pruning["kv_cache_bytes_per_token"]["after"],
                     "ppl_wikipedia": record["ppl_wikipedia"], "ppl_tempest": record["ppl_tempest"],
                     "acc_norm_describe": record["acc_norm_describe"], "acc_norm_continuation": record["acc_norm_continuation"],
                     "mean_acc_norm": mean_acc_norm(record), "delta_low": low, "delta_high": high})
        print(rows[-1], file=sys.stderr, flush=True)
    with open(out / "heads_pruning.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out / 'heads_pruning.csv'}", file=sys.stderr)


if __name__ == "__main__":
    main()
