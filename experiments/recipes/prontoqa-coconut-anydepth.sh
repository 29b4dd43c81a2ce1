#!/usr/bin/env bash
# Retrains models/prontoqa-coconut-anydepth (models/README.md): models/prontoqa-coconut healed for two
# epochs to run its prefixes (configs/prontoqa_anydepth.yaml: stochastic depth at a flat rate of
# 0.25, half the examples on a random prefix of 3-5 layers, the parent's thought_step_loss,
# distilled from the parent; about 7 minutes on 2 cores), then its depth cascade (the first 3
# layers, 5 where the answer's lowest token probability is at most the confidence, then all 6)
# chosen on 500 training questions neither step trained on (train.json[3000:3500]) for a risk of
# 1% at level 0.1 (`--cascade-risk 0.01,0.1`) and written into its coconut.json. Neither step reads
# the released validation questions (data/prontoqa/valid.json), which measure it.
set -euo pipefail
cd "$(dirname "$0")/../.."
data=runs/anydepth_data
mkdir -p "$data"
[ -s "$data/prontoqa_calibrate.json" ] ||
  python3 -c 'import json, sys; json.dump(json.load(open("data/prontoqa/train.json"))[3000:3500], open(sys.argv[1], "w"))' \
    "$data/prontoqa_calibrate.json"
build/coconut heal configs/prontoqa_anydepth.yaml output_dir=runs/prontoqa_anydepth_prefix
model=runs/prontoqa_anydepth_prefix/final
build/coconut eval --model "$model" --data "$data/prontoqa_calibrate.json" --cascade 3,5,6@0 --cascade-risk 0.01,0.1 \
  --summary "$data/prontoqa_cascade_calibration.json" --force >/dev/null
python3 experiments/write_depth_cascade.py "$model/coconut.json" "$data/prontoqa_cascade_calibration.json"
rm -rf models/prontoqa-coconut-anydepth
cp -r "$model" models/prontoqa-coconut-anydepth
