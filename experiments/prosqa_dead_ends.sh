#!/usr/bin/env bash
# ProsQA: training graphs in the released graphs' shape (`coconut data --shape dead-ends`), and a
# fixed selection set (README, "The released graphs' shape", 2026-11-26, session 18). Needs
# experiments/prosqa_bfs_deeper.sh's runs in runs/nm (kX6d, bXf and their configs). One core each.
#
# 1. One more round of the default (funnel) graphs: kX6e from kX6d; and the chain in words one round
#    further, bXg from bXf (does CoT climb as the thoughts do?).
# 2. Two fixed selection sets of 1,000 generated questions, never trained on (seed 990 in the
#    dead-ends shape, 991 in the funnel shape): every candidate is scored on both, with the released
#    validation file measured alongside and never used to choose.
# 3. kD1: kX6e one round on 64,000 dead-ends graphs, against kX6f: the same round on funnel graphs
#    (the control). Then kD2, kD3 and kD4 one round more each on fresh dead-ends graphs; bD1 and bD2
#    the chain in words (from bXf) on dead-ends graphs, the CoT of the same size and data. kD3 is
#    models/prosqa-coconut, bD2 models/prosqa-cot; kD4 and bD3 came after the sweep.
set -euo pipefail
cd "$(dirname "$0")/../runs/nm"
export OMP_NUM_THREADS=1
coconut=../../build/coconut
cot=(mode=cot val_split=200 num_epochs=1 val_generate_limit=200 batch_size=32 save_every_steps=500 log_every=50
     warmup_steps=0 schedule=cosine min_lr_ratio=0 lr=5e-4)
graphs() {  # graphs SHAPE PREFIX CONCEPTS SEED...: 64,000 graphs each, the breadth-first chain as released
  local shape=$1 prefix=$2 concepts=$3
  shift 3
  for seed in "$@"; do
    # shellcheck disable=SC2086  # CONCEPTS is "MIN MAX"
    $coconut data --task prosqa --count 64000 --seed "$seed" --people 4 --names-from ../../data/prosqa/valid.json \
      --out "$prefix"full64k_s"$seed".json --concepts $concepts --path-steps 3 6 --shape "$shape"
    python3 ../../experiments/prosqa_bfs_steps.py "$prefix"full64k_s"$seed".json "$prefix"bfsc64k_s"$seed".json $((seed - 7))
  done
}
scores() {  # scores RUN CORE: the released file, then the two selection sets
  local run=$1 core=$2
  taskset -c "$core" $coconut eval --model "$run"/final --data ../../data/prosqa/valid.json --thought-top 72 \
    --out "$run"_valid.jsonl --force > "$run"_eval.log
  for set in dead_ends funnel; do
    taskset -c "$core" $coconut eval --model "$run"/final --data select_"$set"_1000.json --out "$run"_sel_"$set".jsonl \
      --force > "$run"_sel_"$set".log
  done
}
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
graphs funnel "" "12 24" 110 111
graphs dead-ends d "16 24" 120 121 122 123 124 125 126
$coconut data --task prosqa --count 1000 --seed 990 --people 4 --names-from ../../data/prosqa/valid.json \
  --out select_dead_ends_1000.json --concepts 16 24 --path-steps 3 6 --shape dead-ends
$coconut data --task prosqa --count 1000 --seed 991 --people 4 --names-from ../../data/prosqa/valid.json \
  --out select_funnel_1000.json --concepts 12 24 --path-steps 3 6
for run in kX6c kX6d bXf; do scores "$run" 0; done

thoughts kX6e kX6d bfsc64k_s110.json 0 &
chain bXg bXf bfsc64k_s111.json 1
wait
thoughts kD1 kX6e dbfsc64k_s120.json 0 &
thoughts kX6f kX6e bfsc64k_s111.json 1
wait
thoughts kD2 kD1 dbfsc64k_s121.json 0 &
chain bD1 bXf dbfsc64k_s122.json 1
wait
thoughts kD3 kD2 dbfsc64k_s123.json 0 &
chain bD2 bD1 dbfsc64k_s124.json 1
wait
thoughts kD4 kD3 dbfsc64k_s125.json 0 &
chain bD3 bD2 dbfsc64k_s126.json 1
wait
