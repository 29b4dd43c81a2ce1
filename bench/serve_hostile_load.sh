#!/usr/bin/env bash
# `coconut serve` under hostile load (bench/serve_hostile_load.py), and llama.cpp's llama-server
# the same way when LLAMA_CPP_BIN names a folder holding it (built outside this repository):
# normal completions' p50/p99 beside HALF half-sent (slowloris) and IDLE idle keep-alive
# connections, what the server holds and closes, then three rounds of ABORTED aborted requests
# and its memory after each (a leak grows every round) and descriptors.
#
#   bench/serve_hostile_load.sh [MODEL_DIR] [HALF] [IDLE] [ABORTED]
#
# MODEL_DIR defaults to .models/smollm2-135m (`./run fetch-model smollm2-135m`); llama-server gets
# the same weights as a GGUF (coconut export-gguf, bf16 both sides). Each server gets 2 threads.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-.models/smollm2-135m}
half=${2:-1000}
idle=${3:-1000}
aborted=${4:-10000}
[ -f "$model/config.json" ] || { echo "$model is missing (./run fetch-model smollm2-135m for the default)" >&2; exit 1; }
work=build/bench-hostile
mkdir -p "$work"
port=18531

wait_ready() {  # PORT PID
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

run_case() {  # NAME PID
  wait_ready "$port" "$2" || { echo "$1 did not come up" >&2; return 1; }
  echo "== $1"
  python3 bench/serve_hostile_load.py --port "$port" --pid "$2" --half "$half" --idle "$idle" --aborted "$aborted" \
    >"$work/$1.json"
  kill "$2"
  wait "$2" 2>/dev/null || true
}

OMP_NUM_THREADS=2 ./build/coconut serve --model "$model" --port "$port" --dtype bfloat16 --weights dense --wide-step-threads 2 \
  >"$work/coconut.log" 2>&1 &
run_case coconut $!

if [ -n "${LLAMA_CPP_BIN:-}" ]; then
  [ -f "$work/model-bf16.gguf" ] || ./build/coconut export-gguf --model "$model" --out "$work/model-bf16.gguf" --dtype bf16 >/dev/null
  "$LLAMA_CPP_BIN/llama-server" -m "$work/model-bf16.gguf" --port "$port" -t 2 -c 4096 >"$work/llama-server.log" 2>&1 &
  run_case llama-server $!
fi

python3 - "$work" <<'EOF'
import json, os, sys
work = sys.argv[1]
print(f"| server | normal p50 | p99 | failed | held fds | closed half-sent / idle | memory before -> after aborted (per round) | fds after |")
print("|---|---|---|---|---|---|---|---|")
for name in ("coconut", "llama-server"):
    path = os.path.join(work, name + ".json")
    if not os.path.exists(path):
        continue
    r = json.load(open(path))
    n = r["normal"]
    print(f"| {name} | {n['p50_s'] * 1000:.1f} ms | {n['p99_s'] * 1000:.1f} ms | {n['failed']} of {n['count']} | {r['fds_held']} "
          f"| {r['half_closed_by_server']} / {r['idle_closed_by_server']} of {r['half_opened']} / {r['idle_opened']} "
          f"| {r['rss_before_kib'] / 1024:.1f} -> {r['rss_after_kib'] / 1024:.1f} MiB "
          f"({', '.join(f'{g / 1024:+.1f}' for g in r['rss_growth_per_round_kib'])}) | {r['fds_before']} -> {r['fds_after']} |")
EOF
