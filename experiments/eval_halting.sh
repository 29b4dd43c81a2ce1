#!/usr/bin/env bash
# Issue 54, halting: a Coconut model choosing per question how many thoughts to take
# (`coconut eval --halting COUNTS@C --halting-peek P`) against the same model at a fixed number of
# thoughts, on released questions. Each scheme's confidence C is chosen on calibration questions
# only: the lowest of a grid at which the scheme answers them as well as the model with all its
# thoughts. Then the released questions at batch 16 (accuracy, FLOPs, thoughts) and, in $ROUNDS
# alternating rounds (default 5; the report keeps each one's best), at batch 1 (latency per answer,
# where the thoughts' one-position passes tell most).
#
#   experiments/eval_halting.sh MODEL CALIBRATION VALID OUT_DIR "SCHEMES" "STATIC_COUNTS"
#   e.g. experiments/eval_halting.sh models/prosqa-coconut runs/anydepth_data/calibrate.json \
#          data/prosqa/valid.json runs/halting_prosqa "3,4,5,6 4,5,6 4,6" "3 4 5 6"
#
# The last static count must be the model's own (the full model of the comparison). Then
# experiments/halting_report.py OUT_DIR prints the table and the paired tests.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: experiments/eval_halting.sh MODEL CALIBRATION VALID OUT_DIR SCHEMES STATIC_COUNTS"
model=${1:?$usage} calibration=${2:?$usage} valid=${3:?$usage} out=${4:?$usage} schemes=${5:?$usage} counts=${6:?$usage}
confidences="0.5 0.7 0.8 0.9 0.95 0.99"
mkdir -p "$out/calibration"
eval_once() {  # SUMMARY DATA FLAGS...: one evaluation, kept if it exists
  local summary=$1 data=$2
  shift 2
  [ -s "$summary" ] || ./build/coconut eval --model "$model" --data "$data" --summary "$summary" --force "$@" >/dev/null
}
accuracy() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["accuracy"])' "$1"; }

full=${counts##* }
for count in $counts; do
  eval_once "$out/calibration/static_$count.json" "$calibration" --latents "$count"
  eval_once "$out/static_$count.json" "$valid" --latents "$count" --out "$out/static_$count.jsonl"
done
target=$(accuracy "$out/calibration/static_$full.json")
: > "$out/choices.txt"
for scheme in $schemes; do
  for peek in 1 0; do
    chosen=""
    for confidence in $confidences; do
      summary="$out/calibration/halting_${scheme//,/_}_peek${peek}_at$confidence.json"
      eval_once "$summary" "$calibration" --halting "$scheme@$confidence" --halting-peek "$peek"
      if python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$(accuracy "$summary")" "$target"; then
        chosen=$confidence
        break
      fi
    done
    [ -n "$chosen" ] || { echo "$scheme peek $peek: no confidence in the grid reaches $target on the calibration questions" >&2; continue; }
    name="halting_${scheme//,/_}_peek$peek"
    echo "$name $scheme $peek $chosen" >> "$out/choices.txt"
    eval_once "$out/$name.json" "$valid" --halting "$scheme@$chosen" --halting-peek "$peek" --out "$out/$name.jsonl"
  done
done
# Latency at batch 1: every scheme and static count, in alternating rounds (the report keeps the best).
for round in $(seq "${ROUNDS:-5}"); do
  for count in $counts; do
    ./build/coconut eval --model "$model" --data "$valid" --latents "$count" --batch-size 1 \
      --summary "$out/batch1_static_${count}_round$round.json" --force >/dev/null
  done
  while read -r name scheme peek chosen; do
    ./build/coconut eval --model "$model" --data "$valid" --halting "$scheme@$chosen" --halting-peek "$peek" --batch-size 1 \
      --summary "$out/batch1_${name}_round$round.json" --force >/dev/null
  done < "$out/choices.txt"
done
echo "done: experiments/halting_report.py $out"
