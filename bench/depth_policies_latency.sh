#!/usr/bin/env bash
# Latency per answer of issue 54's depth policies on the 300 released ProsQA questions, at batch 16
# and batch 1: models/prosqa-coconut-anydepth at full depth, at its first 5 layers and with its
# depth cascade, against static models pruned and healed the same way (STATIC_DIR...: folders of
# experiments/heal_static_baselines.sh, e.g. runs/prosqa_static6/final). Each configuration runs
# ROUNDS times, alternating; prints the best mean latency per answer (what `coconut eval` reports:
# its batch's wall time over its rows, every level of a cascade included) and its ratio to full
# depth measured in the same run.
#
#   bench/depth_policies_latency.sh ROUNDS [STATIC_DIR...]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
model=models/prosqa-coconut-anydepth
names=("full depth" "first 5 layers" "cascade (coconut.json)")
flags=("--model $model --depth full" "--model $model --depth 5" "--model $model")
for dir in "$@"; do
  names+=("static $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' "$dir/config.json") layers ($dir)")
  flags+=("--model $dir")
done
declare -A best
for batch in 16 1; do
  for ((round = 0; round < rounds; ++round)); do
    for i in "${!names[@]}"; do
      # shellcheck disable=SC2086
      seconds=$(./build/coconut eval ${flags[$i]} --data data/prosqa/valid.json --batch-size "$batch" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["mean_latency_seconds"])')
      key="$batch|$i"
      if [ -z "${best[$key]:-}" ] || python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$seconds" "${best[$key]}"; then
        best[$key]=$seconds
      fi
    done
  done
done
printf '%-50s %14s %8s %14s %8s\n' "configuration" "batch 16 (ms)" "ratio" "batch 1 (ms)" "ratio"
for i in "${!names[@]}"; do
  python3 -c 'import sys
name, b16, f16, b1, f1 = sys.argv[1], *map(float, sys.argv[2:])
print(f"{name:50s} {b16 * 1e3:14.2f} {b16 / f16:8.2f} {b1 * 1e3:14.2f} {b1 / f1:8.2f}")' \
    "${names[$i]}" "${best[16|$i]}" "${best[16|0]}" "${best[1|$i]}" "${best[1|0]}"
done
