#!/usr/bin/env bash
# Sourced by experiments/recipes/prosqa-coconut/4_dead_ends.sh and 5_released_shape.sh, from runs/nm: one round of
# training on a file of 64,000 generated graphs (cosine 5e-4 -> 0), then its scores. Set
# `selection_sets` (names of select_NAME_1000.json files) before sourcing.
#   graphs SHAPE PREFIX CONCEPTS SEED...   64,000 graphs each, the breadth-first chain as released
#   scores RUN CORE                        the released file, then the selection sets
#   chain RUN FROM DATA CORE               the chain in words (CoT)
#   thoughts RUN FROM DATA CORE [LR]       every hop in thoughts (Coconut, six); peak lr 5e-4 unless given
coconut=../../build/coconut
cot=(mode=cot val_split=200 num_epochs=1 val_generate_limit=200 batch_size=32 save_every_steps=500 log_every=50
     warmup_steps=0 schedule=cosine min_lr_ratio=0 lr=5e-4)
graphs() {
  local shape=$1 prefix=$2 concepts=$3
  shift 3
  for seed in "$@"; do
    # shellcheck disable=SC2086  # CONCEPTS is "MIN MAX"
    $coconut data --task prosqa --count 64000 --seed "$seed" --people 4 --names-from ../../data/prosqa/valid.json \
      --out "$prefix"full64k_s"$seed".json --concepts $concepts --path-steps 3 6 --shape "$shape"
    python3 ../../experiments/prosqa_bfs_steps.py "$prefix"full64k_s"$seed".json "$prefix"bfsc64k_s"$seed".json $((seed - 7))
  done
}
scores() {
  local run=$1 core=$2
  taskset -c "$core" $coconut eval --model "$run"/final --data ../../data/prosqa/valid.json --thought-top 72 \
    --out "$run"_valid.jsonl --force > "$run"_eval.log
  # shellcheck disable=SC2154  # set by the script that sources this one
  for set in "${selection_sets[@]}"; do
    taskset -c "$core" $coconut eval --model "$run"/final --data select_"$set"_1000.json --out "$run"_sel_"$set".jsonl \
      --force > "$run"_sel_"$set".log
  done
}
chain() {
  taskset -c "$4" $coconut train cot_continue.yaml name="$1" output_dir="$1" load_model_path="$2"/final "${cot[@]}" \
    train_path="$3" > "$1".log 2>&1
  scores "$1" "$4"
}
thoughts() {
  taskset -c "$4" $coconut train from_shipped.yaml name="$1" output_dir="$1" load_model_path="$2"/final \
    train_path="$3" val_split=200 val_generate_limit=200 batch_size=32 log_every=50 save_every_steps=500 num_epochs=1 \
    warmup_steps=0 first_stage=6 max_latent_stage=6 schedule=cosine min_lr_ratio=0 lr="${5:-5e-4}" > "$1".log 2>&1
  scores "$1" "$4"
}
