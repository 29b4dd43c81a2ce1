#!/usr/bin/env bash
# The busy-neighbour case: commands at their default thread count against every count forced
# (OMP_NUM_THREADS=1 .. the cores), idle and beside a process that keeps one core busy (a Python
# loop). Workloads: `coconut eval` of 20 ProntoQA questions one at a time (models/prontoqa-cot, a
# small model), and, where SmolLM2-135M has been fetched (`./run fetch-model smollm2-135m`), `coconut
# generate` of 64 tokens on it in bf16 and with Q8_0 weights (a large model). Prints the best of
# ROUNDS alternating runs of each and default / best count per case. The target: default at most
# 1.2x the best when busy, and no slower than before when idle.
#
#   bench/busy_neighbour.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
cores=$(nproc)
workloads=("eval-prontoqa-cot")
[ -f .models/smollm2-135m/config.json ] && workloads+=("generate-smollm2-bf16" "generate-smollm2-q8_0")

# run WORKLOAD [ENV...] -> seconds
run() {
  local workload=$1 start end
  shift
  start=$(date +%s.%N)
  case $workload in
    eval-prontoqa-cot)
      "$@" ./build/coconut eval --model models/prontoqa-cot --data data/prontoqa/valid.json --limit 20 \
        --out /tmp/busy_neighbour_eval.jsonl --force >/dev/null 2>&1 ;;
    generate-smollm2-bf16)
      "$@" ./build/coconut generate --model .models/smollm2-135m --dtype bfloat16 --prompt "The river rises in the hills" \
        --max-new-tokens 64 --ignore-eos >/dev/null 2>&1 ;;
    generate-smollm2-q8_0)
      "$@" ./build/coconut generate --model .models/smollm2-135m --dtype bfloat16 --weights q8_0 \
        --prompt "The river rises in the hills" --max-new-tokens 64 --ignore-eos >/dev/null 2>&1 ;;
  esac
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN {printf "%.3f", b - a}'
}
best() { awk -v a="$1" -v b="$2" 'BEGIN {print (a == "" || b < a) ? b : a}'; }

declare -A result
measure() {  # CASE: every workload at the default and at each forced count
  for _ in $(seq "$rounds"); do
    for workload in "${workloads[@]}"; do
      result[$1 $workload default]=$(best "${result[$1 $workload default]:-}" "$(run "$workload" env)")
      for threads in $(seq "$cores"); do
        result[$1 $workload $threads]=$(best "${result[$1 $workload $threads]:-}" "$(run "$workload" env OMP_NUM_THREADS="$threads")")
      done
    done
  done
}
measure idle
python3 -c "while True: pass" &
neighbour=$!
trap 'kill $neighbour 2>/dev/null' EXIT
sleep 0.5
measure busy
kill $neighbour

echo "seconds, best of $rounds; $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
header=$(printf "%-24s %-5s %9s" workload case default)
for threads in $(seq "$cores"); do header+=$(printf " %9s" "$threads thr"); done
echo "$header $(printf "%22s" "default / best count")"
for workload in "${workloads[@]}"; do
  for case in idle busy; do
    line=$(printf "%-24s %-5s %8.3fs" "$workload" "$case" "${result[$case $workload default]}")
    fastest=${result[$case $workload default]}
    for threads in $(seq "$cores"); do
      line+=$(printf " %8.3fs" "${result[$case $workload $threads]}")
      fastest=$(best "$fastest" "${result[$case $workload $threads]}")
    done
    echo "$line $(printf "%21.2fx" "$(awk -v d="${result[$case $workload default]}" -v b="$fastest" 'BEGIN {print d / b}')")"
  done
done
