#!/usr/bin/env bash
# A Llama-3.2-1B-shaped random model cut to 4 layers (width 2048, MLP 8192, 32 / 8 heads; 343M
# parameters, experiments/random_llama_folder.py), exported in F32 and quantized by llama.cpp's
# llama-quantize to Q4_K_M, so that every projection is Q4_K or Q6_K (SmolLM2's widths leave most of
# its own in Q5_0): ours on the file's blocks (`--weights gguf`) against llama.cpp on the same file,
# prefill of 128 and 512 tokens and decode of 64 (ours after a 128-token prompt, llama.cpp's from an
# empty context), at 1 and 2 threads. Each round alternates ours and theirs; the table gives each
# side's median tokens/s and the median of the rounds' ratios ours / theirs, with their range.
#
#   bench/random_1b_kquants_vs_llamacpp.sh LLAMA_CPP_BIN [REPEAT]
#
# LLAMA_CPP_BIN: a folder with llama.cpp's llama-bench and llama-quantize, built outside this
# repository (e.g. from the source vendored in the pip sdist of llama-cpp-python). Needs numpy and
# `./run fetch-model smollm2-135m` first (its tokenizer is the random model's).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/rounds.sh
bin=${1:?usage: bench/random_1b_kquants_vs_llamacpp.sh LLAMA_CPP_BIN [REPEAT]}
repeat=${2:-5}
python=python3
[ -x .venv-test/bin/python ] && python=.venv-test/bin/python
work=build/bench-random-1b
mkdir -p "$work"
[ -f "$work/f32/config.json" ] || "$python" experiments/random_llama_folder.py "$work/f32" >/dev/null
[ -f "$work/f32.gguf" ] || ./build/coconut export-gguf --model "$work/f32" --out "$work/f32.gguf" --dtype f32 >/dev/null
[ -f "$work/q4_k_m.gguf" ] || "$bin/llama-quantize" "$work/f32.gguf" "$work/q4_k_m.gguf" Q4_K_M >/dev/null 2>&1
[ -f "$work/q4_k_m/config.json" ] || ./build/coconut import-gguf "$work/q4_k_m.gguf" --out "$work/q4_k_m" --force >/dev/null

# ours THREADS PROMPT -> "prefill_tokens_per_s decode_tokens_per_s" (decode over 64 tokens)
ours() {
  ./build/bench_model --model "$work/q4_k_m" --dtypes bfloat16 --threads "$1" --prompt "$2" --decode 64 --weights gguf |
    awk -v m="$work/q4_k_m" '$1 == m {print $4, $7}'
}
# theirs THREADS -> "pp128 pp512 tg64" tokens/s
theirs() { llama_bench_tokens_per_s -m "$work/q4_k_m.gguf" -t "$1" -p 128,512 -n 64; }

declare -A result
for round in $(seq "$repeat"); do
  for threads in 1 2; do
    read -r p128 d64 <<<"$(ours "$threads" 128)"
    read -r p512 _ <<<"$(ours "$threads" 512)"
    record "ours $threads pp128" "$p128"
    record "ours $threads pp512" "$p512"
    record "ours $threads tg64" "$d64"
    read -r t128 t512 tg <<<"$(theirs "$threads")"
    record "llama.cpp $threads pp128" "$t128"
    record "llama.cpp $threads pp512" "$t512"
    record "llama.cpp $threads tg64" "$tg"
  done
  echo "round $round of $repeat done" >&2
done

echo "Random Llama-3.2-1B-shaped model (4 layers) in Q4_K_M, tokens/s (median of $repeat alternating rounds) and ours / llama.cpp (median of the rounds' ratios, with their range); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
printf "%-8s %-5s %9s %9s %20s\n" threads test ours llama.cpp ratio
for threads in 1 2; do
  for test in pp128 pp512 tg64; do
    ours=${result[ours $threads $test]} theirs=${result[llama.cpp $threads $test]}
    printf "%-8s %-5s %9.1f %9.1f %20s\n" "$threads" "$test" "$(median "$ours")" "$(median "$theirs")" "$(ratio "$ours" "$theirs")"
  done
done
