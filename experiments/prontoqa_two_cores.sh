#!/usr/bin/env bash
# The whole ProntoQA lineage from scratch on both cores of this 2-core CPU, timed (issue 19: "within
# 2 hours of training in all"): chain-of-thought from scratch (configs/prontoqa_cot.yaml, run s1's
# schedule), the Coconut curriculum from it (stages 1-5, prontoqa_coconut_lineage.sh's two runs),
# then stage 6 through the latent bottleneck (prontoqa_stage6_lineage.sh's two runs). The same
# recipes as the shipped models, which were trained on one core; here every run has both
# (OMP_NUM_THREADS=2). Nothing else should run on the machine meanwhile: a busy core stalls both
# threads at every barrier. Writes runs/two_cores/{cot,coconut_a,coconut,st6i,st6j} and
# runs/two_cores/times.tsv (seconds of each training run, and the evaluations).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=2
coconut=${COCONUT:-build/coconut}  # a copy keeps the runs apart from rebuilds meanwhile
root=runs/two_cores
mkdir -p "$root"
times=$root/times.tsv
[ -f "$times" ] || printf 'step\tseconds\n' >"$times"

# timed NAME COMMAND...: runs COMMAND, appends its wall time to times.tsv.
timed() {
  local name=$1
  shift
  local start
  start=$(date +%s)
  "$@"
  printf '%s\t%s\n' "$name" "$(($(date +%s) - start))" >>"$times"
}

evaluate() {
  "$coconut" eval --model "$1" --data data/prontoqa/valid.json --out "$1/valid.jsonl" --force
}

# 1. Chain of thought from scratch: 24 epochs at lr 1e-3, then 4 at 2e-4 and 4 at 1e-4.
timed cot_1 "$coconut" train configs/prontoqa_cot.yaml output_dir=$root/cot
timed cot_2 "$coconut" train configs/prontoqa_cot.yaml output_dir=$root/cot resume=true num_epochs=28 lr=2e-4
timed cot_3 "$coconut" train configs/prontoqa_cot.yaml output_dir=$root/cot resume=true num_epochs=32 lr=1e-4
timed eval_cot evaluate $root/cot/final

# 2. Coconut stages 1-2 (three epochs each), then 3-5 (four each, stopped after stage 5's third).
timed coconut_a "$coconut" train configs/prontoqa_coconut.yaml output_dir=$root/coconut_a \
  load_model_path=$root/cot/final
timed coconut_b "$coconut" train configs/prontoqa_coconut.yaml output_dir=$root/coconut \
  load_model_path=$root/coconut_a/final first_stage=3 epochs_per_stage=4 num_epochs=11
timed eval_coconut evaluate $root/coconut/final

# 3. Stage 6 through the latent bottleneck: positive queries for three epochs, then every question
#    for one; both validate on the last 200 training questions (val_split replaces val_path).
config=$(mktemp --suffix=.yaml)
grep -v '^val_path' configs/prontoqa_coconut.yaml >"$config"
python3 experiments/prontoqa_positive_queries.py data/prontoqa/train.json $root/train_positive.json
timed st6i "$coconut" train "$config" name=st6i output_dir=$root/st6i train_path=$root/train_positive.json \
  load_model_path=$root/coconut/final first_stage=6 num_epochs=3 val_split=200 \
  latent_bottleneck=1.0 thought_step_answer=true
timed st6j "$coconut" train "$config" name=st6j output_dir=$root/st6j load_model_path=$root/st6i/final \
  first_stage=6 num_epochs=1 val_split=200 latent_bottleneck=1.0 thought_step_answer=true
timed eval_st6j evaluate $root/st6j/final
cat "$times"
