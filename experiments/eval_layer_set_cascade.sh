#!/usr/bin/env bash
# Issue 54: one model choosing per question which of its layer sets to run (a depth cascade over
# layer sets, `coconut eval --cascade "{1,3,5,7},{1,5}@C"`) against the same model's static
# sub-stacks and the static models pruned and healed from it, on the 300 released ProsQA validation
# questions. The confidence C is chosen on generated calibration questions only (for 65% and 70% of
# the full model's FLOPs); each deepened question runs again whole at the next level, all of it counted.
#
#   experiments/eval_layer_set_cascade.sh OUT_DIR [HEALED_STATIC_DIR...]
#
# Needs runs/anydepth_data/calibrate.json (experiments/recipes/prosqa-coconut-anydepth.sh makes it).
# HEALED_STATIC_DIR: folders of static models pruned and healed from the same parent
# (experiments/heal_static_baselines.sh), each evaluated as it is. Then
# experiments/layer_set_cascade_report.py OUT_DIR prints the table and the paired tests.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: experiments/eval_layer_set_cascade.sh OUT_DIR [HEALED_STATIC_DIR...]}
shift
model=models/prosqa-coconut
valid=data/prosqa/valid.json calibration=runs/anydepth_data/calibrate.json
[ -s "$calibration" ] || { echo "$calibration is missing: experiments/recipes/prosqa-coconut-anydepth.sh makes it" >&2; exit 1; }
mkdir -p "$out"
run() {  # NAME MODEL FLAGS...: one evaluation of the released questions
  local name=$1 dir=$2
  shift 2
  [ -s "$out/$name.json" ] || ./build/coconut eval --model "$dir" --data "$valid" --out "$out/$name.jsonl" --summary "$out/$name.json" \
    --force "$@" >/dev/null
}
# The parent whole and its static sub-stacks (odd layers removed in the sweep's block-influence order).
run full "$model" --depth full
for dropped in 1 1,5 1,3,5 1,3,5,7; do run "static_without_${dropped//,/_}" "$model" --drop-layers "$dropped"; done
for dir in "$@"; do run "healed_$(basename "$(dirname "$dir")")" "$dir" --depth full; done
# The cascades, their confidence calibrated on the generated questions.
for levels in "{1,3,5,7},{1,5}" "{1,3,5,7},{}" "{1,3,5},{1,5}"; do
  for fraction in 0.65 0.70; do
    # {1,3,5,7},{} -> cascade_without_1_3_5_7-without_none_at0.65
    name="cascade_$(echo "$levels" | sed 's/{}/{none}/g; s/},{/-without_/g; s/^{/without_/; s/}$//' | tr ',' '_')_at$fraction"
    [ -s "$out/$name.calibration.json" ] ||
      ./build/coconut eval --model "$model" --data "$calibration" --cascade "$levels@0" --cascade-flops "$fraction" \
        --summary "$out/$name.calibration.json" --force >/dev/null 2>"$out/$name.calibration.log"
    confidence=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["depth_cascade"]["confidence"])' \
      "$out/$name.calibration.json")
    run "$name" "$model" --cascade "$levels@$confidence"
  done
done
