#!/usr/bin/env bash
# Retrains models/prontoqa-coconut from models/prontoqa-cot (runs sv1 -> sv2 of the docs/results-prontoqa.md), on one
# core: about 23 + 42 minutes. Writes runs/prontoqa_coconut_a and runs/prontoqa_coconut (seed 0, the
# shipped model), or runs/prontoqa_coconut_s$SEED(_a) for the other seeds (issue 71's seeds, beside
# experiments/recipes/prontoqa-pause-as-thought.sh's arm).
# NPROC=2 trains on two processes (one thread each, batch 16 per process: the same global batch 32):
# 17.5 + 35 minutes here, 100% at the end (docs/results-prontoqa.md, run dc).
# OMP_NUM_THREADS=2 runs one process on two threads (the pause arm's recipe measured 1.7x one thread
# on the 2-core Intel Xeon, 2026-11-29, with nothing else running; seed 1 took 38 + 77 minutes there).
# experiments/evaluate_prontoqa_seeds.py then compares the seeds with each other and the pause arm.
#   experiments/recipes/prontoqa-coconut.sh [SEED...]     (default: 0)
# Run again after a kill: finished runs are kept, a stopped one resumes from its last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
nproc=${NPROC:-1}
parallel=()
[ "$nproc" -gt 1 ] && parallel=(--nproc "$nproc" batch_size=$((32 / nproc)))
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(0)
for seed in "${seeds[@]}"; do
  run=runs/prontoqa_coconut
  [ "$seed" = 0 ] || run=runs/prontoqa_coconut_s$seed
  # Stages 1-2, three epochs each, step supervision of the thoughts (the config's comments say why).
  [ -f ${run}_a/final/model.safetensors ] ||
    build/coconut train configs/prontoqa_coconut.yaml "${parallel[@]}" seed="$seed" resume=true output_dir=${run}_a
  # Stages 3-5, four epochs each, stopped after stage 5's third epoch (99.5% on validation).
  [ -f $run/final/model.safetensors ] ||
    build/coconut train configs/prontoqa_coconut.yaml "${parallel[@]}" seed="$seed" resume=true output_dir=$run \
      load_model_path=${run}_a/final first_stage=3 epochs_per_stage=4 num_epochs=11
  build/coconut eval --model $run/final --data data/prontoqa/valid.json --out ${run}_valid.jsonl --force > ${run}_valid.log
done
