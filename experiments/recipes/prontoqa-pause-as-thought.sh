#!/usr/bin/env bash
# ProntoQA's pause-as-thought arm (issue 71; models/README.md, docs/results-prontoqa.md): the
# recipe of models/prontoqa-coconut (experiments/recipes/prontoqa-coconut.sh) run exactly, with one
# change, `mode=pause_as_thought`: each continuous thought's column holds a learned `<|pause|>`
# token instead of the fed-back hidden state. Everything else is Coconut's: the same start
# (models/prontoqa-cot), stages, epochs, batch, learning rate, bf16, a tenth of the batches at an
# earlier stage, and step supervision on the same positions (the hidden state before each pause
# column, rescaled as Coconut's thought is, decodes the step the column stands for; nothing reads
# it back). No checkpoint is chosen: the last weights of run 2 (stage 5, third epoch, where
# prontoqa-coconut was stopped) are what is scored, and seed 0's are shipped.
#   1. stages 1-2, three epochs each;
#   2. from run 1's final model: stages 3, 4 (four epochs each) and three epochs of stage 5.
# Time on the 2-core Intel Xeon (2026-11-29): one thread 3,400-3,800 tokens/s, about 3 hours a seed;
# OMP_NUM_THREADS=2 (both cores, nothing else running: a compile beside it cut it to 500 tokens/s)
# 5,600-6,700 tokens/s, run 1 in about 35 minutes and run 2 in 69 (seed 1).
#   experiments/recipes/prontoqa-pause-as-thought.sh [SEED...]     (default: 0)
# Run again after a kill: finished runs are kept, a stopped one resumes from its last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(0)
for seed in "${seeds[@]}"; do
  run=runs/prontoqa_pause_s$seed
  [ -f ${run}_a/final/model.safetensors ] ||
    build/coconut train configs/prontoqa_coconut.yaml mode=pause_as_thought seed="$seed" resume=true \
      name=prontoqa_pause_s${seed}_a output_dir=${run}_a
  [ -f $run/final/model.safetensors ] ||
    build/coconut train configs/prontoqa_coconut.yaml mode=pause_as_thought seed="$seed" resume=true \
      name=prontoqa_pause_s$seed output_dir=$run load_model_path=${run}_a/final first_stage=3 epochs_per_stage=4 num_epochs=11
  build/coconut eval --model $run/final --data data/prontoqa/valid.json --out ${run}_valid.jsonl --force > ${run}_valid.log
done
