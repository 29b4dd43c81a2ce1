#!/usr/bin/env bash
# Issue 54's static baselines, trained as the any-depth model is: models/prosqa-coconut pruned to
# 7, 6, 5 and 4 layers (the grown odd layers removed in the order the sweep's block-influence
# scores chose: 1, 5, 3, 7), each healed with configs/prosqa_anydepth.yaml without layer drop (the
# same 3,200 generated questions, steps, distillation from the parent and seed as the any-depth
# runs), so both sides start from the same parent and train on the same tokens.
#
#   experiments/heal_static_baselines.sh [SEED]      (about 5-7 minutes a model on 2 cores)
# Writes runs/prosqa_static{7,6,5,4}[_seedS]/final; a finished one is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
seed="${1:-0}"
suffix=""
[ "$seed" != 0 ] && suffix="_seed$seed"
for dropped in 1 1,5 1,3,5 1,3,5,7; do
  layers=$((8 - $(echo "$dropped" | tr ',' '\n' | wc -l)))
  out="runs/prosqa_static$layers$suffix"
  [ -e "$out/final/config.json" ] && continue
  [ -e "runs/prosqa_pruned$layers/config.json" ] ||
    ./build/coconut prune --model models/prosqa-coconut --drop-layers "$dropped" --out "runs/prosqa_pruned$layers"
  ./build/coconut heal configs/prosqa_anydepth.yaml layer_drop=0 "load_model_path=runs/prosqa_pruned$layers" \
    "seed=$seed" "output_dir=$out"
done
