#!/usr/bin/env bash
# Retrains models/prontoqa-coconut from models/prontoqa-cot (runs sv1 -> sv2 of the README), on one
# core: about 23 + 42 minutes. Writes runs/prontoqa_coconut_a and runs/prontoqa_coconut.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
# Stages 1-2, three epochs each, step supervision of the thoughts (the config's comments say why).
build/coconut train configs/prontoqa_coconut.yaml output_dir=runs/prontoqa_coconut_a
# Stages 3-5, four epochs each, stopped after stage 5's third epoch (99.5% on validation).
build/coconut train configs/prontoqa_coconut.yaml output_dir=runs/prontoqa_coconut \
  load_model_path=runs/prontoqa_coconut_a/final first_stage=3 epochs_per_stage=4 num_epochs=11
build/coconut eval --model runs/prontoqa_coconut/final --data data/prontoqa/valid.json
