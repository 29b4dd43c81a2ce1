#!/usr/bin/env bash
# ProsQA: training graphs drawn as the released ones in size and density too (`coconut data --shape
# released`), and a selection set in that shape (README, "The released shape, sizes and densities
# too", 2026-11-26, session 19). Needs experiments/prosqa_dead_ends.sh's runs in runs/nm (kD3, bD3
# and the configs). One core each.
#
# 1. A selection set of 1,000 generated questions in the released shape (seed 992, never trained
#    on); every candidate is scored on it, with the released validation file and the dead-ends
#    selection set measured alongside and never used to choose.
# 2. kR1 from kD3 and bR1 from bD3 (the chain in words), one round each on 64,000 released-shape
#    graphs; then kR2 / bR2 one round more each on fresh graphs.
# Seeds 130 and 131 were made by commit 7b69033, whose released shape kept one in 12 edges onto the
# answer's path (810645a keeps one in 5): to train kR1 and bR1 on the same graphs, build that
# commit for those two files; this script makes them with the current code.
set -euo pipefail
cd "$(dirname "$0")/../runs/nm"
export OMP_NUM_THREADS=1
coconut=../../build/coconut
graphs() {  # graphs SEED...: 64,000 released-shape graphs each, the breadth-first chain as released
  for seed in "$@"; do
    $coconut data --task prosqa --count 64000 --seed "$seed" --people 4 --names-from ../../data/prosqa/valid.json \
      --out rfull64k_s"$seed".json --concepts 15 25 --path-steps 3 6 --shape released
    python3 ../../experiments/prosqa_bfs_steps.py rfull64k_s"$seed".json rbfsc64k_s"$seed".json $((seed - 7))
  done
}
scores() {  # scores RUN CORE: the released file, then the two selection sets
  local run=$1 core=$2
  taskset -c "$core" $coconut eval --model "$run"/final --data ../../data/prosqa/valid.json --thought-top 72 \
    --out "$run"_valid.jsonl --force > "$run"_eval.log
  for set in dead_ends released; do
    taskset -c "$core" $coconut eval --model "$run"/final --data select_"$set"_1000.json --out "$run"_sel_"$set".jsonl \
      --force > "$run"_sel_"$set".log
  done
}
cot=(mode=cot val_split=200 num_epochs=1 val_generate_limit=200 batch_size=32 save_every_steps=500 log_every=50
     warmup_steps=0 schedule=cosine min_lr_ratio=0 lr=5e-4)
chain() {  # chain RUN FROM DATA CORE
  taskset -c "$4" $coconut train cot_continue.yaml name="$1" output_dir="$1" load_model_path="$2"/final "${cot[@]}" \
    train_path="$3" > "$1".log 2>&1
  scores "$1" "$4"
}
thoughts() {  # thoughts RUN FROM DATA CORE
  taskset -c "$4" $coconut train from_shipped.yaml name="$1" output_dir="$1" load_model_path="$2"/final \
    train_path="$3" val_split=200 val_generate_limit=200 batch_size=32 log_every=50 save_every_steps=500 num_epochs=1 \
    warmup_steps=0 first_stage=6 max_latent_stage=6 schedule=cosine min_lr_ratio=0 lr=5e-4 > "$1".log 2>&1
  scores "$1" "$4"
}
graphs 130 131 132 133
$coconut data --task prosqa --count 1000 --seed 992 --people 4 --names-from ../../data/prosqa/valid.json \
  --out select_released_1000.json --concepts 15 25 --path-steps 3 6 --shape released
for run in kD3 bD3; do scores "$run" 0; done

thoughts kR1 kD3 rbfsc64k_s130.json 1 &
chain bR1 bD3 rbfsc64k_s131.json 0
wait
thoughts kR2 kR1 rbfsc64k_s132.json 1 &
chain bR2 bR1 rbfsc64k_s133.json 0
wait
