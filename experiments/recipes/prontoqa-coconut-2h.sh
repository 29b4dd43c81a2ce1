#!/usr/bin/env bash
# ProntoQA from scratch to Coconut with every step a continuous thought, timed run by run on this
# 2-core CPU (issue 19's 2 hours; docs/results-prontoqa.md "ProntoQA in under two hours"). Six runs, each from the
# last one's weights:
#   cot_a      CoT from scratch, seed 1, every `not~X` embedding starting as `X` plus one shared
#              vector (negation_offset_init); the config's first 8 epochs (distractors left out at
#              0.9, keeping the query's hard ones), one process on one core, validated on the
#              released validation questions shortened the same way (the polarity shows there first)
#   cot_b      7 more CoT epochs (0.9, 0.9, 0.5, 0.5, then every distractor), two processes
#   coconut_a  stages 1-2 of configs/prontoqa_coconut.yaml, three epochs each
#   coconut_b  stages 3, 4 and three epochs of 5, four epochs per stage
#   stage6_positive, stage6
#              stage 6 through the latent bottleneck, as experiments/recipes/prontoqa-coconut-stage6.sh
#              (three epochs on the questions with a positive query, then two on all: the second
#              took the released validation set from 97.5% to 98.0%, docs/results-prontoqa.md)
# Two processes = `--nproc 2 batch_size=16`, one thread each: the global batch 32 of the configs.
# Measured (run p2h, 2026-11-25): 98.5 minutes of training in all, validation included; CoT 93.0%,
# stage 5 98.5% (5 thoughts + 9.5 tokens), stage 6 98.0% with 6 thoughts + 4 tokens
# (models/prontoqa-coconut-2h). cot_a reproduces its earlier run bit for bit (same seed, one thread).
#
#   experiments/recipes/prontoqa-coconut-2h.sh [OUT]  (default runs/prontoqa_two_hours)
#
# Writes OUT/<run>/ for each run, OUT/times.tsv (wall seconds per run, validation included) and
# OUT/<model>/valid.jsonl for the CoT, stage-5 and stage-6 models on the released validation set.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
out=${1:-runs/prontoqa_two_hours}
mkdir -p "$out"
printf 'run\tseconds\n' >"$out/times.tsv"
timed() {  # timed NAME COMMAND...: runs COMMAND and appends its wall time to times.tsv
  local name=$1 start
  shift
  start=$(date +%s)
  "$@"
  printf '%s\t%d\n' "$name" $(($(date +%s) - start)) >>"$out/times.tsv"
}
two_processes=(--nproc 2 batch_size=16)

# 1. Chain-of-thought. A loaded model takes its shape from its checkpoint: the second run's config
#    is prontoqa_cot.yaml without its model block.
python3 experiments/prontoqa_short_valid.py data/prontoqa/valid.json "$out/valid_short.json" 0.9
timed cot_a build/coconut train configs/prontoqa_cot.yaml output_dir="$out/cot_a" seed=1 \
  negation_offset_init=true num_epochs=8 val_path="$out/valid_short.json"
cot_loaded=$(mktemp --suffix=.yaml)
python3 experiments/config_without_model.py configs/prontoqa_cot.yaml "$cot_loaded"
timed cot_b build/coconut train "$cot_loaded" "${two_processes[@]}" output_dir="$out/cot_b" seed=1 \
  load_model_path="$out/cot_a/final" drop_unused_facts=0.9,0.9,0.5,0.5,0 num_epochs=7 \
  eval_every_epochs=7
rm -f "$cot_loaded"

# 2. Coconut stages 1-5 (configs/prontoqa_coconut.yaml says why each setting).
timed coconut_a build/coconut train configs/prontoqa_coconut.yaml "${two_processes[@]}" \
  output_dir="$out/coconut_a" load_model_path="$out/cot_b/final"
timed coconut_b build/coconut train configs/prontoqa_coconut.yaml "${two_processes[@]}" \
  output_dir="$out/coconut_b" load_model_path="$out/coconut_a/final" first_stage=3 \
  epochs_per_stage=4 num_epochs=11

# 3. Stage 6: validation on the last 200 training questions, so the released set is only evaluated.
stage6_config=$(mktemp --suffix=.yaml)
grep -v '^val_path' configs/prontoqa_coconut.yaml >"$stage6_config"
python3 experiments/prontoqa_positive_queries.py data/prontoqa/train.json "$out/train_positive.json"
stage6=(first_stage=6 val_split=200 latent_bottleneck=1.0 thought_step_answer=true)
timed stage6_positive build/coconut train "$stage6_config" "${two_processes[@]}" \
  name=stage6_positive output_dir="$out/stage6_positive" train_path="$out/train_positive.json" \
  load_model_path="$out/coconut_b/final" num_epochs=3 "${stage6[@]}"
timed stage6 build/coconut train "$stage6_config" "${two_processes[@]}" name=stage6 \
  output_dir="$out/stage6" load_model_path="$out/stage6_positive/final" num_epochs=2 "${stage6[@]}"
rm -f "$stage6_config"

for model in cot_b coconut_b stage6; do
  build/coconut eval --model "$out/$model/final" --data data/prontoqa/valid.json \
    --out "$out/$model/valid.jsonl" --force
done
awk -F'\t' 'NR > 1 { total += $2 } END { printf "training, all runs: %.1f minutes\n", total / 60 }' \
  "$out/times.tsv"
