#!/usr/bin/env bash
# Retrains models/prosqa-coconut-anydepth (models/README.md): models/prosqa-coconut healed for two
# epochs with stochastic depth at a flat rate (configs/prosqa_anydepth.yaml with layer_drop 0.25,
# layer_drop_schedule flat; about 8-10 minutes on 2 cores), then its depth cascade (the first 5
# layers, all 8 where the answer's lowest token probability is at most the confidence) calibrated
# on 500 generated questions to 70% of the full model's FLOPs and written into its coconut.json.
# Neither step reads the released validation questions (data/prosqa/valid.json), which measure it.
set -euo pipefail
cd "$(dirname "$0")/../.."
data=runs/anydepth_data
mkdir -p "$data"
# The healing data (3,200 generated questions, 200 held out by val_split) and the calibration set.
experiments/generate_prosqa_questions.sh 3200 1 "$data/train.json"
experiments/generate_prosqa_questions.sh 500 2 "$data/calibrate.json"
build/coconut heal configs/prosqa_anydepth.yaml layer_drop=0.25 layer_drop_schedule=flat \
  output_dir=runs/prosqa_anydepth_flat025
model=runs/prosqa_anydepth_flat025/final
build/coconut eval --model "$model" --data "$data/calibrate.json" --cascade 5,8@0 --cascade-flops 0.7 \
  --summary "$data/cascade_calibration.json" --force >/dev/null
python3 experiments/write_depth_cascade.py "$model/coconut.json" "$data/cascade_calibration.json"
rm -rf models/prosqa-coconut-anydepth
cp -r "$model" models/prosqa-coconut-anydepth
