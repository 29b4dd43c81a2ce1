#!/usr/bin/env bash
# Retrains models/prontoqa-coconut from models/prontoqa-cot (runs sv1 -> sv2 of the docs/results-prontoqa.md), on one
# core: about 23 + 42 minutes. Writes runs/prontoqa_coconut_a and runs/prontoqa_coconut.
# NPROC=2 trains on two processes (one thread each, batch 16 per process: the same global batch 32):
# 17.5 + 35 minutes here, 100% at the end (docs/results-prontoqa.md, run dc).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
nproc=${NPROC:-1}
parallel=()
[ "$nproc" -gt 1 ] && parallel=(--nproc "$nproc" batch_size=$((32 / nproc)))
# Stages 1-2, three epochs each, step supervision of the thoughts (the config's comments say why).
build/coconut train configs/prontoqa_coconut.yaml "${parallel[@]}" output_dir=runs/prontoqa_coconut_a
# Stages 3-5, four epochs each, stopped after stage 5's third epoch (99.5% on validation).
build/coconut train configs/prontoqa_coconut.yaml "${parallel[@]}" output_dir=runs/prontoqa_coconut \
  load_model_path=runs/prontoqa_coconut_a/final first_stage=3 epochs_per_stage=4 num_epochs=11
build/coconut eval --model runs/prontoqa_coconut/final --data data/prontoqa/valid.json
