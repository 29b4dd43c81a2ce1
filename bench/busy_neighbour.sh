#!/usr/bin/env bash
# The busy-neighbour case: commands at their default thread count against every count forced
# (OMP_NUM_THREADS=1 .. the cores), idle and beside a process that keeps one core busy (a Python
# loop). Workloads: `coconut eval` of 20 ProntoQA questions one at a time (models/prontoqa-cot, a
# small model), and, where SmolLM2-135M has been fetched (`./run fetch-model smollm2-135m`), `coconut
# generate` of 64 tokens on it in bf16 and with Q8_0 weights (a large model); and `coconut serve` of
# each model, timed from the first request to the last answer (20 ProntoQA questions one after
# another; 8 completions of 32 tokens on SmolLM2), the server started under the same load and
# thread setting (its start-up is not timed: it counts the busy cores then). Prints the best of
# ROUNDS alternating runs of each and default / best count per case. The target: default at most
# 1.2x the best when busy, and no slower than before when idle.
#
#   bench/busy_neighbour.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
cores=$(nproc)
workloads=("eval-prontoqa-cot" "serve-prontoqa-cot")
[ -f .models/smollm2-135m/config.json ] && workloads+=("generate-smollm2-bf16" "generate-smollm2-q8_0" "serve-smollm2-bf16")

# serve_requests ENV... -- SERVE_ARGS... -> seconds from the first request to the last answer
serve_requests() {
  local env_args=() port pid
  while [ "$1" != -- ]; do env_args+=("$1"); shift; done
  shift
  port=$((20000 + RANDOM % 20000))
  "${env_args[@]}" ./build/coconut serve "$@" --port "$port" >/tmp/busy_neighbour_serve.log 2>&1 &
  pid=$!
  until curl -sf "localhost:$port/health" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { echo "busy_neighbour: serve did not start (/tmp/busy_neighbour_serve.log)" >&2; exit 1; }
    sleep 0.1
  done
  python3 - "$port" "$1 $2" <<'PY'
import json, sys, time, urllib.request
port, model = sys.argv[1], sys.argv[2]
if "prontoqa" in model:
    questions = [e["question"] + "\n" for e in json.load(open("data/prontoqa/valid.json"))[:20]]
    requests = [{"prompt": q, "max_tokens": 64, "temperature": 0} for q in questions]
else:
    requests = [{"prompt": "The river rises in the hills", "max_tokens": 32, "temperature": 0}] * 8
start = time.perf_counter()
for body in requests:
    call = urllib.request.Request(f"http://localhost:{port}/v1/completions", json.dumps(body).encode(),
                                  {"Content-Type": "application/json"})
    json.load(urllib.request.urlopen(call))
print(f"{time.perf_counter() - start:.3f}")
PY
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null || true
}

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
      "$@" ./build/coconut generate --model .models/smollm2-135m --dtype bfloat16 --weights dense --prompt "The river rises in the hills" \
        --max-new-tokens 64 --ignore-eos >/dev/null 2>&1 ;;
    generate-smollm2-q8_0)
      "$@" ./build/coconut generate --model .models/smollm2-135m --dtype bfloat16 --weights q8_0 \
        --prompt "The river rises in the hills" --max-new-tokens 64 --ignore-eos >/dev/null 2>&1 ;;
    serve-prontoqa-cot)
      serve_requests "$@" -- --model models/prontoqa-cot
      return ;;
    serve-smollm2-bf16)
      serve_requests "$@" -- --model .models/smollm2-135m --dtype bfloat16 --weights dense
      return ;;
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
