#!/usr/bin/env bash
# Rebuilds models/prosqa-coconut-layersets (models/README.md): models/prosqa-coconut as it is (no
# training), with a depth cascade over its layer sets in coconut.json: every question first runs
# the model without layers 1, 3, 5 and 7 (half its FLOPs); where the answer's lowest token
# probability is at most the confidence, the whole question runs again without layers 1 and 5.
# The confidence is calibrated on 500 generated questions (runs/anydepth_data/calibrate.json, made
# as experiments/recipes/prosqa-coconut-anydepth.sh does) to 65% of the full model's FLOPs.
# The released validation questions (data/prosqa/valid.json), which measure it, choose nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
data=runs/anydepth_data
mkdir -p "$data"
experiments/generate_prosqa_questions.sh 500 2 "$data/calibrate.json"
build/coconut eval --model models/prosqa-coconut --data "$data/calibrate.json" --cascade "{1,3,5,7},{1,5}@0" \
  --cascade-flops 0.65 --summary "$data/layer_set_calibration.json" --force >/dev/null
rm -rf models/prosqa-coconut-layersets
cp -r models/prosqa-coconut models/prosqa-coconut-layersets
python3 experiments/write_depth_cascade.py models/prosqa-coconut-layersets/coconut.json "$data/layer_set_calibration.json"
