#!/usr/bin/env bash
# Prune SmolLM2-135M by whole layers or MLP channels and heal it on plain text with LoRA (issue 69),
# then ship the adapter: models/smollm2-135m-NAME is an adapter over .models/smollm2-135m whose
# coconut.json names the layers (dropped_layers) or channels (dropped_mlp_channels) it drops.
#
#   experiments/heal_smollm2_pruned_on_text.sh NAME LAYERS|"PRUNE FLAGS" [key=value ...]
#   e.g. experiments/heal_smollm2_pruned_on_text.sh minus8 12,13,14,15,16,17,18,19
#        experiments/heal_smollm2_pruned_on_text.sh width-wanda "--mlp-flops-ratio 0.78294 --context 512 \
#          --channel-metric wanda --data data/text/wikipedia-calibration.txt --window 256 --samples 32 --dtype float32"
#
# Resumable: a killed run continues from its last checkpoint (resume: true in the config).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?NAME}; what=${2:?LAYERS or PRUNE FLAGS}; shift 2
if [[ $what =~ ^[0-9,]+$ ]]; then prune_flags=(--drop-layers "$what"); else read -r -a prune_flags <<< "$what"; fi
base=.models/smollm2-135m
pruned=runs/smollm2-135m-$name-pruned
run=runs/smollm2-135m-$name-heal
[ -f "$base/config.json" ] || { echo "$base: missing; run ./run fetch-model smollm2-135m" >&2; exit 1; }
if [ ! -f "$pruned/pruning.json" ]; then
  build/coconut prune --model "$base" "${prune_flags[@]}" --out "$pruned" --force
fi
build/coconut heal configs/smollm2/heal_text_lora.yaml load_model_path="$pruned" output_dir="$run" "$@"
mkdir -p models
rm -rf "models/smollm2-135m-$name"
cp -r "$run/final/adapter" "models/smollm2-135m-$name"
echo "shipped models/smollm2-135m-$name (adapter over $base pruned by: ${prune_flags[*]})"
