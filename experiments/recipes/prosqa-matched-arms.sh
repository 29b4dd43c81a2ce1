#!/usr/bin/env bash
# ProsQA's four arms in a matched comparison (issue 71; docs/results-prosqa.md, "Matched arms"):
# Coconut, chain of thought (CoT), no chain (no-CoT) and pause-as-thought, each branched from one
# 4-layer checkpoint, trained on the same graphs for the same steps at the same learning rate, three
# seeds each, and scored on the released validation file and on 1,000 generated questions in the
# released shape (seed 992) that no run trains on. No checkpoint is chosen: every arm's last weights
# are what is scored (and seed 0's are shipped). Then seed 0 one round more, each arm from its own
# first round, to see whether the order holds.
#
# The trunk: models/prosqa-cot (8 layers, the chain in words) without the four layers `coconut
# expand` grew into it (1, 3, 5, 7), 4 layers of width 128: 75.3% on the released file as it is.
# The arms, one pass over 32,000 fresh released-shape graphs of the seed (the last 200 held out,
# `val_split`), batch 32, lr 1e-3 cosine to 0, the shipped models' recipe otherwise
# (configs/prosqa_reachable.yaml, as experiments/recipes/prosqa-coconut/ uses it):
#   coconut           every hop a continuous thought (six, padded), reachable-set supervision on
#                     each thought, a tenth of the questions at an earlier stage (steps in words)
#   pause_as_thought  the same, six <|pause|> tokens in the thoughts' columns: the same supervision
#                     on the same positions' hidden states, nothing fed back
#   cot               the chain in words, as the trunk was trained
#   no_cot            the answer right after the question
# One core a run, two runs at a time: about 32 minutes of the machine a seed and for the second round
# (2-core Intel Xeon with AMX, 2026-11-29).
#   experiments/recipes/prosqa-matched-arms.sh [SEED...]     (default: 0 1 2)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
coconut=$repo/build/coconut
names=$repo/data/prosqa/valid.json
export OMP_NUM_THREADS=1
mkdir -p runs/matched
cd runs/matched

[ -d trunk ] || $coconut prune --model "$repo"/models/prosqa-cot --drop-layers 1,3,5,7 --out trunk
[ -f select_released_1000.json ] ||
  $coconut data --task prosqa --count 1000 --seed 992 --people 4 --names-from "$names" \
    --out select_released_1000.json --concepts 15 25 --path-steps 3 6 --shape released
for split in valid sel; do
  data=$names
  [ $split = sel ] && data=select_released_1000.json
  [ -f trunk_$split.log ] || $coconut eval --model trunk --data "$data" --out trunk_$split.jsonl --force > trunk_$split.log
done
# The shipped lineage's two configs without their model (the trunk brings its own) or the released file.
python3 "$repo"/experiments/config_without_model.py "$repo"/configs/prosqa_reachable.yaml thoughts.yaml val_path
grep -v -E '^(mode|first_stage|max_latent_stage|epochs_per_stage|pad_latent_to_max|uniform_prob|thought_reachable_loss|latent_thought_rms):' \
  thoughts.yaml > words.yaml

graphs() {  # graphs INDEX: 32,000 released-shape graphs (generator seed 150 + INDEX), the breadth-first chain as steps
  local file=bfs32k_s$1.json
  [ -f "$file" ] && return
  $coconut data --task prosqa --count 32000 --seed $((150 + $1)) --people 4 --names-from "$names" \
    --out full32k_s"$1".json --concepts 15 25 --path-steps 3 6 --shape released
  python3 "$repo"/experiments/prosqa_bfs_steps.py full32k_s"$1".json "$file" $((143 + $1))
  rm full32k_s"$1".json
}

arm() {  # arm MODE RUN FROM GRAPHS SEED CORE: one pass over bfs32k_sGRAPHS.json from FROM, then the scores
  local mode=$1 run=$2 from=$3 graphs=$4 seed=$5 core=$6
  local common=(name="$run" output_dir="$run" load_model_path="$from" train_path=bfs32k_s"$graphs".json seed="$seed"
                val_split=200 val_generate_limit=200 batch_size=32 num_epochs=1 warmup_steps=0 schedule=cosine
                min_lr_ratio=0 lr=1e-3 log_every=50 save_every_steps=250)
  if [ ! -f "$run"/final/model.safetensors ]; then
    case $mode in
      coconut | pause_as_thought)
        taskset -c "$core" $coconut train thoughts.yaml mode="$mode" first_stage=7 max_latent_stage=6 "${common[@]}" ;;
      cot | no_cot)
        taskset -c "$core" $coconut train words.yaml mode="$mode" "${common[@]}" ;;
    esac > "$run".log 2>&1
  fi
  taskset -c "$core" $coconut eval --model "$run"/final --data "$names" --out "$run"_valid.jsonl --force > "$run"_valid.log
  taskset -c "$core" $coconut eval --model "$run"/final --data select_released_1000.json --out "$run"_sel.jsonl \
    --force > "$run"_sel.log
}

seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2)
for seed in "${seeds[@]}"; do
  graphs "$seed"
  { arm coconut coconut_s"$seed" trunk "$seed" "$seed" 0; arm no_cot no_cot_s"$seed" trunk "$seed" "$seed" 0; } &
  { arm pause_as_thought pause_as_thought_s"$seed" trunk "$seed" "$seed" 1; arm cot cot_s"$seed" trunk "$seed" "$seed" 1; } &
  wait
done
# Seed 0 one round more, each arm from its own first round, on 32,000 more graphs (index 10).
graphs 10
{ arm coconut coconut_s0r2 coconut_s0/final 10 0 0; arm no_cot no_cot_s0r2 no_cot_s0/final 10 0 0; } &
{ arm pause_as_thought pause_as_thought_s0r2 pause_as_thought_s0/final 10 0 1; arm cot cot_s0r2 cot_s0/final 10 0 1; } &
wait
python3 "$repo"/experiments/matched_arms_report.py . "$repo"/docs/matched_arms
# Shipped (seed 0's first round, declared before training): coconut_s0 -> models/prosqa-coconut-matched,
# cot_s0 -> prosqa-cot-matched, no_cot_s0 -> prosqa-nocot, pause_as_thought_s0 -> prosqa-pause-as-thought (final/).
