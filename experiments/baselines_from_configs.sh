#!/usr/bin/env bash
# Baselines from the configs: no-CoT, CoT and Coconut on ProntoQA (train -> valid) and on generated
# ProsQA-style data (-> the released valid set), small Llamas trained from scratch on this CPU.
# Runs what is missing (a finished run has runs/<name>/final), then evaluates every model twice:
# batched (accuracy, tokens, thoughts, FLOPs) and one question at a time (latency), and writes
# results/baselines.csv. Usage: experiments/baselines_from_configs.sh [run names...]   (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
coconut=${COCONUT:-build/coconut}
mkdir -p data runs results
[ -f data/prosqa_train.json ] || "$coconut" data --task prosqa --count 4000 --seed 1 \
  --names-from data/prosqa/valid.json --out data/prosqa_train.json
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(prontoqa_cot prontoqa_coconut prosqa_cot prosqa_coconut prontoqa_nocot prosqa_nocot)
for name in "${runs[@]}"; do
  if [ ! -d "runs/$name/final" ]; then
    "$coconut" train "configs/$name.yaml" resume=true 2>&1 | tee "runs/$name.log"
  fi
  case $name in prontoqa*) valid=data/prontoqa/valid.json ;; *) valid=data/prosqa/valid.json ;; esac
  "$coconut" eval --model "runs/$name/final" --data "$valid" --batch-size 32 --max-new-tokens 128 \
    --out "runs/$name/predictions.jsonl" --summary "runs/$name/eval.json" > /dev/null
  "$coconut" eval --model "runs/$name/final" --data "$valid" --batch-size 1 --limit 50 --max-new-tokens 128 \
    --summary "runs/$name/eval_latency.json" > /dev/null
done
python3 - <<'PY'
import json, os
rows = ["run,accuracy,generated_tokens,latent_thoughts,mflops_per_question,latency_ms_batch1"]
for name in ["prontoqa_nocot", "prontoqa_cot", "prontoqa_coconut", "prosqa_nocot", "prosqa_cot", "prosqa_coconut"]:
    if not os.path.exists(f"runs/{name}/eval.json"): continue
    e = json.load(open(f"runs/{name}/eval.json")); l = json.load(open(f"runs/{name}/eval_latency.json"))
    rows.append(f"{name},{e['accuracy']:.4f},{e['mean_generated_tokens']:.2f},{e['mean_latent_thoughts']:.2f},"
                f"{e['mean_flops']/1e6:.2f},{l['mean_latency_seconds']*1e3:.2f}")
open("results/baselines.csv", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
