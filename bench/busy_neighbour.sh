#!/usr/bin/env bash
# The busy-neighbour case: `coconut eval` on 20 ProntoQA questions (models/prontoqa-cot, one at a
# time) at its default thread count against OMP_NUM_THREADS=1, idle and beside a process that keeps
# one core busy (a Python loop). Prints the best of ROUNDS alternating runs of each and
# default / best-thread-count per case. The target: default at most 1.2x the best when busy, and
# no slower than before when idle.
#
#   bench/busy_neighbour.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
run_eval() {
  local start end
  start=$(date +%s.%N)
  "$@" ./build/coconut eval --model models/prontoqa-cot --data data/prontoqa/valid.json --limit 20 \
    --out /tmp/busy_neighbour_eval.jsonl --force >/dev/null 2>&1
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN {printf "%.3f", b - a}'
}
best() { awk -v a="$1" -v b="$2" 'BEGIN {print (a == "" || b < a) ? b : a}'; }
measure() {  # -> "default one"
  local default="" one=""
  for _ in $(seq "$rounds"); do
    default=$(best "$default" "$(run_eval env)")
    one=$(best "$one" "$(run_eval env OMP_NUM_THREADS=1)")
  done
  echo "$default $one"
}
read -r idle_default idle_one <<<"$(measure)"
python3 -c "while True: pass" &
neighbour=$!
trap 'kill $neighbour 2>/dev/null' EXIT
sleep 0.5
read -r busy_default busy_one <<<"$(measure)"
kill $neighbour
echo "coconut eval, 20 ProntoQA questions, best of $rounds; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
printf "%-6s %10s %10s %22s\n" case default "1 thread" "default / best count"
for case in idle busy; do
  d=${case}_default o=${case}_one
  printf "%-6s %9.3fs %9.3fs %21.2fx\n" "$case" "${!d}" "${!o}" "$(awk -v d="${!d}" -v o="${!o}" 'BEGIN {b = d < o ? d : o; print d / b}')"
done
