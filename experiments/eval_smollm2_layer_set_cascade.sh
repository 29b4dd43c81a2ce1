#!/usr/bin/env bash
# Issue 54 on the pretrained model: SmolLM2-135M-Instruct's ProntoQA Coconut adapter (stage 1, one
# thought; the first GPU lease, docs/smollm2-coconut.md) choosing per question which of its layer
# sets to run (`coconut eval --cascade "{...},{}@C"`), against its static sub-stacks, on the 200
# released ProntoQA validation questions. Nothing is trained here: the layers are ranked by how much
# the calibration questions' loss rises without each one (`score-layers --metric ablation`), the
# sub-stacks drop the N lowest, and the cascade's confidence is calibrated for a FLOPs fraction on
# the calibration questions only (train.json[8700:8900]: questions the adapter was trained on, the
# only ProntoQA questions outside the released 200; the same rule the ProntoQA any-depth model used).
#
#   experiments/eval_smollm2_layer_set_cascade.sh ADAPTER OUT_DIR [ORDER]
#
# ADAPTER: the stage-1 adapter folder (models/smollm2-prontoqa-coconut-s1, or one healed to
# run without its lowest layers, configs/smollm2/prontoqa_coconut_anydepth.yaml). ORDER: the layers
# lowest first (e.g. the heal's nested_drop_order, "25,4,3,..."); without it, the ablation ranking
# measured here (about 9 minutes). Needs the base model (./run fetch-model smollm2-135m). Then
# experiments/layer_set_cascade_report.py OUT_DIR prints the table and the paired tests. About an
# hour on 2 cores (each pass over the 200 questions 4-5 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
adapter=${1:?usage: experiments/eval_smollm2_layer_set_cascade.sh ADAPTER OUT_DIR [ORDER]}
out=${2:?usage: experiments/eval_smollm2_layer_set_cascade.sh ADAPTER OUT_DIR [ORDER]}
order=${3:-}
base=.models/smollm2-135m valid=data/prontoqa/valid.json
[ -d "$base" ] || { echo "$base is missing: ./run fetch-model smollm2-135m" >&2; exit 1; }
mkdir -p "$out"
calibration=$out/calibrate.json
[ -s "$calibration" ] || python3 -c 'import json, sys; json.dump(json.load(open(sys.argv[1]))[8700:8900], open(sys.argv[2], "w"))' \
  data/prontoqa/train.json "$calibration"
if [ -z "$order" ]; then
  # score-layers reads one folder: the adapter merged into the base (float32, like eval's --adapter).
  merged=$out/merged
  [ -s "$merged/model.safetensors" ] || ./build/coconut merge-adapter --model "$base" --adapter "$adapter" --out "$merged" --force >/dev/null
  [ -s "$out/ablation.csv" ] ||
    ./build/coconut score-layers --model "$merged" --data "$calibration" --samples 64 --metric ablation --out "$out/ablation.csv" --force >/dev/null
  order=$(python3 -c 'import csv, sys
rows = sorted((r for r in csv.DictReader(open(sys.argv[1])) if r["block_size"] == "1"), key=lambda r: float(r["score"]))
print(",".join(r["start_layer"] for r in rows))' "$out/ablation.csv")
fi
echo "$order" >"$out/order.txt"
# The first N layers of the order, as "a,b,c" in layer order.
lowest() { echo "$order" | awk -F, -v n="$1" '{ for (i = 1; i <= n; i++) print $i }' | sort -n | paste -sd, -; }
run() {  # NAME FLAGS...: one evaluation of the released questions
  local name=$1
  shift
  [ -s "$out/$name.json" ] || ./build/coconut eval --model "$base" --adapter "$adapter" --weights dense --data "$valid" \
    --batch-size 32 --out "$out/$name.jsonl" --summary "$out/$name.json" --force "$@" >/dev/null
}
run full --depth full
for n in 1 2 3 4 6 8 10; do run "static_without_lowest_$n" --drop-layers "$(lowest $n)"; done
# Cascades: first the model without the N lowest layers, then every layer; the confidence chosen on
# the calibration questions for a fraction of the full model's FLOPs.
for setting in 8:0.80 10:0.75; do
  n=${setting%%:*} fraction=${setting##*:}
  name="cascade_without_lowest_${n}-full_at$fraction"
  levels="{$(lowest "$n")},{}"
  [ -s "$out/$name.calibration.json" ] ||
    ./build/coconut eval --model "$base" --adapter "$adapter" --weights dense --data "$calibration" --batch-size 32 \
      --cascade "$levels@0" --cascade-flops "$fraction" --summary "$out/$name.calibration.json" --force >/dev/null \
      2>"$out/$name.calibration.log"
  confidence=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["depth_cascade"]["confidence"])' \
    "$out/$name.calibration.json")
  run "$name" --cascade "$levels@$confidence"
done
