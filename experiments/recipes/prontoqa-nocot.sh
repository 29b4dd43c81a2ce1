#!/usr/bin/env bash
# Retrains models/prontoqa-nocot (models/README.md): configs/prontoqa_nocot.yaml from scratch, one run
# of 12 epochs on one core (22m44s on the 2-core AMD EPYC machine), validated on the last 200
# training questions (val_split), then evaluated on the released validation set. Writes
# runs/prontoqa_nocot (the config's name). experiments/baselines_from_configs.sh trains the same
# config among its baselines.
#   experiments/recipes/prontoqa-nocot.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
build/coconut train configs/prontoqa_nocot.yaml
build/coconut eval --model runs/prontoqa_nocot/final --data data/prontoqa/valid.json
