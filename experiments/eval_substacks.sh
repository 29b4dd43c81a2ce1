#!/usr/bin/env bash
# Accuracy and realised MFLOP per answer of one model's sub-stacks on the 300 released ProsQA
# validation questions (`coconut eval --drop-layers`, nothing healed): the odd layers removed in
# the order the sweep's block-influence scores chose (1, 5, 3, 7) and the last layers removed
# (early exit's prefixes). Prints CSV: model,dropped,layers,accuracy,mflop_per_answer.
#
#   experiments/eval_substacks.sh MODEL_DIR...
set -euo pipefail
cd "$(dirname "$0")/.."
echo "model,dropped,layers,accuracy,mflop_per_answer"
for model in "$@"; do
  for dropped in none 1 1,5 1,3,5 1,3,5,7 7 6,7 5,6,7 4,5,6,7; do
    flag=()
    [ "$dropped" != none ] && flag=(--drop-layers "$dropped")
    ./build/coconut eval --model "$model" --data data/prosqa/valid.json "${flag[@]}" 2>/dev/null |
      python3 -c 'import json, sys
r = json.load(sys.stdin)
model, dropped = sys.argv[1], sys.argv[2]
layers = 8 - (0 if dropped == "none" else len(dropped.split(",")))
accuracy, mflop = r["accuracy"], r["mean_flops"] / 1e6
print(f"{model},\"{dropped}\",{layers},{accuracy:.4f},{mflop:.1f}")' "$model" "$dropped"
  done
done
