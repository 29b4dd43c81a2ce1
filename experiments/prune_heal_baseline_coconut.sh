#!/usr/bin/env bash
# Pruning evidence on the ProntoQA Coconut model of experiments/baselines_from_configs.sh
# (runs/prontoqa_coconut/final):
# layer and head scores, models pruned by each score, healed (one pass over 2,000 training examples,
# distilled from the unpruned model), each evaluated on ProntoQA valid. Writes runs/prune/* and results/prune_heal.csv.
# Usage: experiments/prune_heal_baseline_coconut.sh   (from the repository root, after
# experiments/baselines_from_configs.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
coconut=${COCONUT:-build/coconut}
model=runs/prontoqa_coconut/final
valid=data/prontoqa/valid.json
train=data/prontoqa/train.json
out=runs/prune
mkdir -p "$out" results
"$coconut" score-layers --model $model --data $valid --metric angular --all-blocks --positions latents --samples 64 \
  --out $out/angular_latents.csv --plot $out/angular_latents.png > /dev/null
"$coconut" score-layers --model $model --data $valid --metric angular --all-blocks --positions last --samples 64 \
  --out $out/angular_last.csv --plot $out/angular_last.png > /dev/null
"$coconut" score-layers --model $model --data $valid --metric bi --samples 64 --out $out/bi.csv > /dev/null
"$coconut" score-layers --model $model --data $valid --metric ablation --samples 64 --out $out/ablation_loss.csv \
  --plot $out/ablation_loss.png > /dev/null
"$coconut" score-heads --model $model --data $valid --metric grad --samples 64 --out $out/heads_grad.csv \
  --plot $out/heads_grad.png > /dev/null

# name | prune flags
variants=(
  "angular_latents_1|--drop-block 1 --metric angular --positions latents"
  "angular_last_1|--drop-block 1 --metric angular --positions last"
  "bi_1|--drop-block 1 --metric bi"
  "ablation_1|--drop-block 1 --metric ablation"
  "angular_latents_2|--drop-block 2 --metric angular --positions latents"
  "heads_grad_25|--head-fraction 0.25 --granularity query --head-metric grad"
)
evaluate() {  # model dir -> eval.json beside it
  "$coconut" eval --model "$1" --data $valid --batch-size 32 --max-new-tokens 64 --summary "$1/eval.json" > /dev/null
}
[ -f $out/unpruned_eval.json ] || "$coconut" eval --model $model --data $valid --batch-size 32 --max-new-tokens 64 \
  --summary $out/unpruned_eval.json > /dev/null
for entry in "${variants[@]}"; do
  name=${entry%%|*}; flags=${entry#*|}
  if [ ! -f "$out/$name/eval.json" ]; then
    # shellcheck disable=SC2086
    "$coconut" prune --model $model --out "$out/$name" --data $valid --samples 64 $flags > "$out/$name.prune.txt"
    evaluate "$out/$name"
  fi
  if [ ! -f "$out/${name}_healed/final/eval.json" ]; then
    cat > "$out/$name.heal.yaml" <<YAML
load_model_path: $out/$name
train_path: $train
output_dir: $out/${name}_healed
num_epochs: 1
train_limit: 2000
batch_size: 32
lr: 5.0e-4
warmup_steps: 20
distill_from: $model
distill_weight: 0.5
distill_temperature: 2.0
eval_every_epochs: 0
log_every: 50
YAML
    "$coconut" heal "$out/$name.heal.yaml" 2> "$out/$name.heal.log"
    evaluate "$out/${name}_healed/final"
  fi
done
python3 - <<'PY'
import json, os
out = "runs/prune"
rows = ["variant,removed,parameters,flops_ratio,accuracy,generated_tokens,accuracy_healed"]
u = json.load(open(f"{out}/unpruned_eval.json"))
rows.append(f"unpruned,,,1.0000,{u['accuracy']:.4f},{u['mean_generated_tokens']:.2f},")
for name in ["angular_latents_1", "angular_last_1", "bi_1", "ablation_1", "angular_latents_2", "heads_grad_25"]:
    if not os.path.exists(f"{out}/{name}/eval.json"): continue
    p = json.load(open(f"{out}/{name}/pruning.json")); e = json.load(open(f"{out}/{name}/eval.json"))
    h = f"{out}/{name}_healed/final/eval.json"
    healed = f"{json.load(open(h))['accuracy']:.4f}" if os.path.exists(h) else ""
    removed = "layers " + " ".join(map(str, p["dropped_layers"])) if p["dropped_layers"] else "heads " + p["dropped_heads"].replace(",", " ")
    rows.append(f"{name},{removed},{p['parameters']['after']},{p['flops_per_token']['ratio']:.4f},{e['accuracy']:.4f},"
                f"{e['mean_generated_tokens']:.2f},{healed}")
open("results/prune_heal.csv", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
