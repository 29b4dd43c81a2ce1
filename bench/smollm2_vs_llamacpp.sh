#!/usr/bin/env bash
# SmolLM2-135M-Instruct, ours against llama.cpp on the same weights, in one run on one machine:
# prefill pp128 / pp512 and decode tg128 at 1 and 2 threads, ours in bfloat16 and float32 against
# llama.cpp at BF16 and F32 (equal precision), ours with Q8_0 weights (`--weights q8_0`, bf16
# activations elsewhere) against llama.cpp's Q8_0, and ours with Q4_1 weights (`--weights q4_1`: the
# fetched file's own blocks) against llama.cpp on the fetched Q4_1 file itself, and a Q4_K_M file
# (llama-quantize of the F32 export: Q4_K, Q5_0, Q6_K and Q8_0 projections), which ours runs on its
# own blocks (`--weights gguf`, import-gguf's default for it) and re-quantized to Q8_0, against
# llama.cpp on it. Each measurement
# alternates ours and theirs, REPEAT rounds (default 5); the tables give each side's median tokens/s
# and the median of the rounds' ratios ours / theirs, with their range.
#
#   bench/smollm2_vs_llamacpp.sh LLAMA_CPP_BIN [REPEAT] [WEIGHTS...]
#
# WEIGHTS: the rows to run, of bf16 f32 q8_0 q4_1 q4_k_m (default: all); a table prints the rows
# that ran, "-" for the others (e.g. `... 5 f32`, about a tenth of the time).
#
# LLAMA_CPP_BIN: a folder with llama.cpp's llama-bench and llama-quantize, built outside this
# repository (e.g. from the source vendored in the pip sdist of llama-cpp-python). Needs
# `./run fetch-model smollm2-135m` first.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/rounds.sh
bin=${1:?usage: bench/smollm2_vs_llamacpp.sh LLAMA_CPP_BIN [REPEAT] [WEIGHTS...]}
repeat=${2:-5}
shift $(($# < 2 ? $# : 2))
weights_run=" ${*:-bf16 f32 q8_0 q4_1 q4_k_m} "
for name in $weights_run; do
  case $name in bf16 | f32 | q8_0 | q4_1 | q4_k_m) ;; *) echo "unknown weights $name: expected bf16 f32 q8_0 q4_1 q4_k_m" >&2; exit 1 ;; esac
done
runs() { [[ $weights_run == *" $1 "* ]]; }
model=.models/smollm2-135m
[ -f "$model/config.json" ] || { echo "$model is missing: ./run fetch-model smollm2-135m" >&2; exit 1; }
work=build/bench-smollm2
mkdir -p "$work"
for type in bf16 f32; do
  [ -f "$work/$type.gguf" ] || ./build/coconut export-gguf --model "$model" --out "$work/$type.gguf" --dtype "$type" >/dev/null
done
[ -f "$work/q8_0.gguf" ] || "$bin/llama-quantize" "$work/f32.gguf" "$work/q8_0.gguf" Q8_0 >/dev/null 2>&1
cp -n .models/smollm2-135m.gguf "$work/q4_1.gguf"
[ -f "$work/q4_k_m.gguf" ] || "$bin/llama-quantize" "$work/f32.gguf" "$work/q4_k_m.gguf" Q4_K_M >/dev/null 2>&1
[ -f "$work/q4_k_m/config.json" ] || ./build/coconut import-gguf "$work/q4_k_m.gguf" --out "$work/q4_k_m" --force >/dev/null

# ours DTYPE THREADS PROMPT [WEIGHTS [MODEL]] -> "prefill_tokens_per_s decode_tokens_per_s" (decode over 128 tokens)
ours() {
  local folder=${5:-$model}
  ./build/bench_model --model "$folder" --dtypes "$1" --threads "$2" --prompt "$3" --decode 128 --weights "${4:-dense}" |
    awk -v m="$folder" '$1 == m {print $4, $7}'
}
# theirs GGUF THREADS -> "pp128 pp512 tg128" tokens/s
theirs() { llama_bench_tokens_per_s -m "$1" -t "$2" -p 128,512 -n 128; }

declare -A result
for round in $(seq "$repeat"); do
  for threads in 1 2; do
    for pair in "bfloat16 bf16" "float32 f32"; do
      set -- $pair
      runs "$2" || continue
      read -r p128 d128 <<<"$(ours "$1" "$threads" 128)"
      read -r p512 _ <<<"$(ours "$1" "$threads" 512)"
      read -r t128 t512 tg <<<"$(theirs "$work/$2.gguf" "$threads")"
      for key in "ours $1 $threads pp128:$p128" "ours $1 $threads pp512:$p512" "ours $1 $threads tg128:$d128" \
                 "llama.cpp $2 $threads pp128:$t128" "llama.cpp $2 $threads pp512:$t512" "llama.cpp $2 $threads tg128:$tg"; do
        name=${key%%:*} value=${key##*:}
        record "$name" "$value"
      done
    done
    for type in q8_0 q4_1; do
      runs "$type" || continue
      read -r p128 d128 <<<"$(ours bfloat16 "$threads" 128 "$type")"
      read -r p512 _ <<<"$(ours bfloat16 "$threads" 512 "$type")"
      for key in "ours $type $threads pp128:$p128" "ours $type $threads pp512:$p512" "ours $type $threads tg128:$d128"; do
        name=${key%%:*} value=${key##*:}
        record "$name" "$value"
      done
    done
    for weights in q8_0 gguf; do
      runs q4_k_m || continue
      read -r p128 d128 <<<"$(ours bfloat16 "$threads" 128 "$weights" "$work/q4_k_m")"
      read -r p512 _ <<<"$(ours bfloat16 "$threads" 512 "$weights" "$work/q4_k_m")"
      for key in "ours q4_k_m $weights $threads pp128:$p128" "ours q4_k_m $weights $threads pp512:$p512" \
                 "ours q4_k_m $weights $threads tg128:$d128"; do
        name=${key%%:*} value=${key##*:}
        record "$name" "$value"
      done
    done
    for type in q8_0 q4_1 q4_k_m; do
      runs "$type" || continue
      read -r t128 t512 tg <<<"$(theirs "$work/$type.gguf" "$threads")"
      for key in "llama.cpp $type $threads pp128:$t128" "llama.cpp $type $threads pp512:$t512" "llama.cpp $type $threads tg128:$tg"; do
        name=${key%%:*} value=${key##*:}
        record "$name" "$value"
      done
    done
  done
done

echo "SmolLM2-135M-Instruct, tokens/s (median of $repeat alternating rounds) and ours / theirs (median of the rounds' ratios, with their range); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
# row THREADS TEST OURS_NAME THEIRS_NAME...: for each pair, ours and theirs (medians) and the ratio
row() {
  local threads=$1 test=$2
  shift 2
  printf "%-8s %-5s" "$threads" "$test"
  while [ $# -gt 0 ]; do
    local ours=${result[$1 $threads $test]:-} theirs=${result[$2 $threads $test]:-}
    if [ -z "$ours" ]; then
      printf " %9s %9s %20s" - - -  # a row left out (WEIGHTS)
    else
      printf " %9.1f %9.1f %20s" "$(median "$ours")" "$(median "$theirs")" "$(ratio "$ours" "$theirs")"
    fi
    shift 2
  done
  printf "\n"
}
if runs bf16 || runs f32; then
printf "%-8s %-5s %9s %9s %20s %9s %9s %20s\n" threads test "ours bf16" "llama" ratio "ours f32" "llama" ratio
for threads in 1 2; do
  for test in pp128 pp512 tg128; do row "$threads" "$test" "ours bfloat16" "llama.cpp bf16" "ours float32" "llama.cpp f32"; done
done
fi
if runs q8_0 || runs q4_1; then
printf "\n%-8s %-5s %9s %9s %20s %9s %9s %20s\n" threads test "ours Q8_0" "llama" ratio "ours Q4_1" "llama" ratio
for threads in 1 2; do
  for test in pp128 pp512 tg128; do row "$threads" "$test" "ours q8_0" "llama.cpp q8_0" "ours q4_1" "llama.cpp q4_1"; done
done
fi
if runs q4_k_m; then
printf "\n%-8s %-5s %9s %9s %20s %9s %9s %20s   (Q4_K_M: ours on its blocks, and re-quantized to Q8_0)\n" threads test \
  "ours" "llama" ratio "ours Q8_0" "llama" ratio
for threads in 1 2; do
  for test in pp128 pp512 tg128; do row "$threads" "$test" "ours q4_k_m gguf" "llama.cpp q4_k_m" "ours q4_k_m q8_0" "llama.cpp q4_k_m"; done
done
fi
