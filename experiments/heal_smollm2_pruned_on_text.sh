#!/usr/bin/env bash
# Prune SmolLM2-135M by whole layers and heal it on plain text with LoRA (issue 69), then ship the
# adapter: models/smollm2-135m-NAME is an adapter over .models/smollm2-135m whose coconut.json names
# the layers it drops.
#
#   experiments/heal_smollm2_pruned_on_text.sh NAME LAYERS [key=value ...]
#   e.g. experiments/heal_smollm2_pruned_on_text.sh minus8 2,3,4,5,6,7,8,9
#
# Resumable: a killed run continues from its last checkpoint (resume: true in the config).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?NAME}; layers=${2:?LAYERS}; shift 2
base=.models/smollm2-135m
pruned=runs/smollm2-135m-$name-pruned
run=runs/smollm2-135m-$name-heal
[ -f "$base/config.json" ] || { echo "$base: missing; run ./run fetch-model smollm2-135m" >&2; exit 1; }
if [ ! -f "$pruned/pruning.json" ]; then
  build/coconut prune --model "$base" --drop-layers "$layers" --out "$pruned" --force
fi
build/coconut heal configs/smollm2/heal_text_lora.yaml load_model_path="$pruned" output_dir="$run" "$@"
mkdir -p models
rm -rf "models/smollm2-135m-$name"
cp -r "$run/final/adapter" "models/smollm2-135m-$name"
echo "shipped models/smollm2-135m-$name (adapter over $base without layers $layers)"
