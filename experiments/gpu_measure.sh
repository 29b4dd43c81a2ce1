#!/usr/bin/env bash
# Issue 20's GPU figures in one run (docs/distributed-gpu.md, "Fused attention, measured on one H200"): the CUDA
# tests, the Llama-3.2-1B training step (CoT, activation checkpointing, Coconut with 3 and 6
# thoughts; peak memory beside the accounting's estimate), PyTorch eager on the same shapes
# (written-out attention and SDPA; Coconut steps as the official code runs them on HF), the small models, prefill and decode, batched evaluation against
# the bandwidth bound, and NCCL with two ranks on the one GPU.
#   experiments/gpu_measure.sh [BIN_DIR]
# BIN_DIR holds coconut, test_gpu, bench_train and bench_model built against the machine's PyTorch
# (experiments/gpu.sh builds them in build-cuda/, the default; or build them on a CPU machine
# against the same torch wheel and carry them, as experiments/gpu_train.sh's header says). Where the
# Debian runtime libraries are missing, unpack their .deb files under COCONUT_DEPS_PREFIX.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
bin=${1:-build-cuda}
gpu_library_path "${COCONUT_DEPS_PREFIX:-}"
gpu_report_smi
gpu_report_torch

timeout 150 "$bin"/test_gpu 2>&1 | tail -n 4
one_b=(--only llama-3.2-1B --batch 8 --length 1024 --question 512)
stdbuf -oL "$bin"/bench_train --device cuda --bf16 "${one_b[@]}" --latents 3 6 --repeats 5 --activation-checkpointing
python3 bench/train_step_eager.py --device cuda --bf16 "${one_b[@]}" --repeats 5
python3 bench/train_step_eager.py --device cuda --bf16 "${one_b[@]}" --repeats 5 --sdpa --latents 3 6
stdbuf -oL "$bin"/bench_train --device cuda --bf16 --only 1M 25M --repeats 10
python3 bench/train_step_eager.py --device cuda --bf16 --only 1M 25M --repeats 10
stdbuf -oL "$bin"/bench_model --device cuda --only llama-3.2-1B --prompt 1024 --decode 128
stdbuf -oL "$bin"/bench_model --device cuda --only llama-3.2-1B --prompt 1024 --decode 128 --fixed-cache
# Decode steps replayed from one CUDA graph (the capture is timed with the decode: 512 tokens).
stdbuf -oL "$bin"/bench_model --device cuda --only llama-3.2-1B --prompt 1024 --decode 512 --fixed-cache
stdbuf -oL "$bin"/bench_model --device cuda --only llama-3.2-1B --prompt 1024 --decode 512 --cuda-graph
# Batched evaluation against the weights' bandwidth bound (the shipped ProsQA pair, batch 16 and 64).
for batch in 16 64; do
  "$bin"/coconut eval --model models/prosqa-coconut --data data/prosqa/valid.json --device cuda --batch-size "$batch" \
    --bandwidth-bound | grep -E '"(accuracy|generated_tokens_per_second|bound_tokens_per_second|of_bound)"'
done

# NCCL: two ranks of one communicator on GPU 0 (NCCL 2.28.9 refuses: "Duplicate GPU detected").
work=$(mktemp -d)
"$bin"/coconut data --task sums --digits 4 --count 512 --seed 1 --out "$work"/sums.json >/dev/null
cat >"$work"/nccl.yaml <<YAML
mode: cot
device: cuda
train_path: $work/sums.json
val_split: 16
output_dir: $work/run
num_epochs: 1
batch_size: 8
lr: 1.0e-3
max_steps: 10
log_every: 1
val_generate_limit: 4
model: {hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 2,
        max_position_embeddings: 128, rope_theta: 10000, tie_word_embeddings: true}
YAML
for rank in 0 1; do
  NCCL_DEBUG=WARN RANK=$rank LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \
    timeout 90 "$bin"/coconut train "$work"/nccl.yaml >"$work"/nccl_"$rank".log 2>&1 &
done
wait
tail -n 4 "$work"/nccl_0.log "$work"/nccl_1.log
rm -rf "$work"
