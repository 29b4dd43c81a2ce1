#!/usr/bin/env bash
# Builds coconut against the libtorch inside the machine's PyTorch (CUDA) and runs the GPU checks:
# the CUDA tests, then the training and decode benchmarks at Llama-3.2-1B's shape.
#   experiments/gpu.sh [OUT_DIR]
# Needs: a CUDA PyTorch in `python3`, CMake, a C++17 compiler, and the Debian dev packages that
# ./run installs (yaml-cpp, nlohmann-json, CLI11, PCRE2, fmt, GoogleTest). Where those cannot be
# installed, unpack their .deb files (dpkg -x) under a folder and name it in COCONUT_DEPS_PREFIX.
set -euo pipefail
source "$(dirname "$0")/gpu_setup.sh"
out=${1:-results/gpu}
mkdir -p "$out"
prefix=$(gpu_cmake_prefix "${COCONUT_DEPS_PREFIX:-}")
if [ -n "${COCONUT_DEPS_PREFIX:-}" ]; then
  export LD_LIBRARY_PATH="$COCONUT_DEPS_PREFIX/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
gpu_report_torch
gpu_report_smi

start=$(date +%s)
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CUDA_ARCHITECTURES=native \
  2>&1 | tee "$out/configure.log" | grep -i -E "error|warning: |torch|cuda" | head -20 || true
cmake --build build-cuda -j "$(nproc)" 2>&1 | tee "$out/build.log" | grep -E "error|Error" | head -40 || true
cmake --build build-cuda -j "$(nproc)" >/dev/null
echo "build: $(( $(date +%s) - start )) s"

# The training procedure end to end on the GPU (bf16 autocast): the demo's CoT model on running sums.
./build-cuda/coconut data --task sums --digits 4 --count 6000 --seed 1 --out "$out/sums_train.json"
./build-cuda/coconut data --task sums --digits 4 --count 300 --seed 2 --out "$out/sums_valid.json"
cat >"$out/cot_cuda.yaml" <<YAML
mode: cot
device: cuda
bf16: true
train_path: $out/sums_train.json
val_path: $out/sums_valid.json
output_dir: $out/cot_cuda
num_epochs: 3
warmup_steps: 50
batch_size: 32
lr: 1.0e-3
weight_decay: 0.01
seed: 1
log_every: 50
val_generate_limit: 100
max_new_tokens: 32
model: {hidden_size: 128, intermediate_size: 512, num_hidden_layers: 4, num_attention_heads: 4,
        num_key_value_heads: 4, max_position_embeddings: 128, rope_theta: 10000, tie_word_embeddings: true}
YAML
train_start=$SECONDS
./build-cuda/coconut train "$out/cot_cuda.yaml" 2>&1 | grep -E "training|validation|done|error" | tee "$out/train_cuda.txt"
echo "train wall $((SECONDS - train_start)) s" | tee -a "$out/train_cuda.txt"
./build-cuda/coconut eval --model "$out/cot_cuda/final" --data "$out/sums_valid.json" --device cuda | tee -a "$out/train_cuda.txt"
rm -rf "$out/cot_cuda" "$out"/sums_*.json

if [ -z "${SKIP_BENCH:-}" ]; then
  ./build-cuda/bench_train --device cuda --bf16 --only 1M 25M --repeats 10 | tee "$out/bench_train_small.txt"
  ./build-cuda/bench_train --device cuda --bf16 --only llama-3.2-1B --batch 8 --length 1024 --question 512 \
    --latents 3 6 --repeats 5 | tee "$out/bench_train_1b.txt"
  ./build-cuda/bench_model --device cuda --only llama-3.2-1B --prompt 1024 --decode 128 | tee "$out/bench_model_1b.txt"
fi
# The unit suite built against this libtorch (it runs on the CPU; its data and fixtures are in the repository).
(cd build-cuda && timeout 300 ctest -L "unit|gpu" -j 8 --output-on-failure >"$out/tests.log" 2>&1) || true
grep -E "tests passed|tests failed" "$out/tests.log" || true
