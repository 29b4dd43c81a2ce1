#!/usr/bin/env bash
# Retrains models/prontoqa-coconut-stage6 (every step in thoughts: 6 thoughts + 4 tokens) from
# models/prontoqa-coconut (stage 5), runs st6i -> st6j of the docs/results-prontoqa.md, on one core: about 8 + 6
# minutes. Both steps train through the latent bottleneck (`latent_bottleneck: 1`: the tokens after
# the thoughts see none of the question, so the answer can only read the thoughts) and validate on
# the last 200 training questions (val_split), so the released validation set is only evaluated.
# NPROC=2 trains on two processes (one thread each, batch 16 per process: the same global batch 32):
# 5 + 3.4 minutes here, 98.5% (docs/results-prontoqa.md, run dc). MODEL=folder starts from another stage-5 model.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
nproc=${NPROC:-1}
parallel=()
[ "$nproc" -gt 1 ] && parallel=(--nproc "$nproc" batch_size=$((32 / nproc)))
start_model=${MODEL:-models/prontoqa-coconut}
config=$(mktemp --suffix=.yaml)
grep -v '^val_path' configs/prontoqa_coconut.yaml >"$config"  # val_split replaces it
# 1. Only the questions whose query is positive ("True or false: Max is wooden."): the answer is
#    then the polarity of the conclusion the last thought carries, a one-bit readout. Three epochs.
python3 experiments/prontoqa_positive_queries.py data/prontoqa/train.json runs/prontoqa_train_positive.json
build/coconut train "$config" "${parallel[@]}" name=st6i output_dir=runs/st6i train_path=runs/prontoqa_train_positive.json \
  load_model_path="$start_model" first_stage=6 num_epochs=3 val_split=200 \
  latent_bottleneck=1.0 thought_step_answer=true
# 2. Every training question, one epoch, from there.
build/coconut train "$config" "${parallel[@]}" name=st6j output_dir=runs/st6j load_model_path=runs/st6i/final \
  first_stage=6 num_epochs=1 val_split=200 latent_bottleneck=1.0 thought_step_answer=true
build/coconut eval --model runs/st6j/final --data data/prontoqa/valid.json --out runs/st6j/valid.jsonl --force
