#!/usr/bin/env bash
# Issue 54's measurement of one any-depth model on the 300 released ProsQA validation questions
# (choices made on generated calibration questions only): every prefix of its layers (--depth K),
# fewer thoughts at full depth, the depth cascade with its confidence calibrated on the
# calibration questions to 70% of the full model's FLOPs, the cascade at a range of confidences,
# and latency at batch 1. Each run leaves OUT/NAME.json (summary) and OUT/NAME.jsonl (answers).
#
#   experiments/eval_depth_policies.sh MODEL_DIR OUT_DIR [CALIBRATION_JSON]
#   experiments/eval_depth_policies.sh --static MODEL_DIR OUT_DIR   (a static model: its own depth only)
# (CALIBRATION_JSON: runs/anydepth_data/calibrate.json, made as configs/prosqa_anydepth.yaml says
# with --count 500 --seed 2.) Then experiments/depth_policy_report.py reads the folders.
set -euo pipefail
cd "$(dirname "$0")/.."
static=0
[ "$1" = --static ] && { static=1; shift; }
model="$1" out="$2" calibration="${3:-runs/anydepth_data/calibrate.json}"
valid=data/prosqa/valid.json
mkdir -p "$out"
run() {  # NAME FLAGS...: one eval on the validation questions
  local name="$1"; shift
  [ -s "$out/$name.json" ] && return 0
  ./build/coconut eval --model "$model" --data "$valid" --out "$out/$name.jsonl" --summary "$out/$name.json" --force "$@" >/dev/null
}
if [ "$static" = 1 ]; then
  run full --depth full
  run full_batch1 --depth full --batch-size 1
  exit 0
fi
for depth in 4 5 6 7; do run "depth$depth" --depth "$depth"; done
run depth8 --depth full
for thoughts in 0 2 4; do run "thoughts$thoughts" --depth full --latents "$thoughts"; done
for depths in 5,8 5,6,7,8; do
  name="cascade_${depths//,/-}"
  if [ ! -s "$out/$name.calibration" ]; then
    ./build/coconut eval --model "$model" --data "$calibration" --cascade "$depths@0" --cascade-flops 0.7 \
      --summary "$out/$name.calibration.json" --force 2>"$out/$name.calibration" >/dev/null
  fi
  confidence=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["depth_cascade"]["confidence"])' "$out/$name.calibration.json")
  run "$name" --cascade "$depths@$confidence"
  run "${name}_batch1" --cascade "$depths@$confidence" --batch-size 1
done
for confidence in 0.6 0.8 0.9 0.95 0.98 0.99 0.995 0.999; do run "cascade_5-8_at$confidence" --cascade "5,8@$confidence"; done
run depth8_batch1 --depth full --batch-size 1
run depth5_batch1 --depth 5 --batch-size 1
