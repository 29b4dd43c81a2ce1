#!/usr/bin/env bash
# ProsQA: the breadth-first chain at 4 layers, on the released spelling, and into continuous thoughts
# (docs/results-prosqa.md, "The breadth-first chain, deeper", 2026-11-25). Needs
# experiments/recipes/prosqa-coconut/2_concept_hops.sh's runs in runs/nm (bA6 and its data). One core each.
#
# 1. bA6 (2 layers, width 128, the chain in words, 59.0% released) one round further at a constant
#    lr 1e-3 (bA7, 64,000 fresh graphs), and grown to 4 layers (coconut expand --after 0,1: bX4,
#    computes what bA6 does) for the same round (bX7); bA6 with the learning rate decayed (cosine
#    to 0) over the next 64,000 (bAd).
# 2. The released spelling: experiments/articles_behind_vocab.py gives a model trained without the
#    copula the marks of `articles: joined_postfix` ("Every A is a B." -> every A B ~is~a .), and the
#    chain continues on fresh graphs written as released (bfsc64k_sN), each round a cosine decay:
#    bAd -> bAe (2 layers), bX7 -> bXe -> bXf (4 layers). From here on every figure is
#    `coconut eval` on data/prosqa/valid.json itself.
# 3. Into thoughts (from_shipped.yaml's recipe: reachable-set loss, a tenth of the questions at an
#    earlier stage), fresh graphs each: kH2 the first two hops latent, the rest in words (from bAe);
#    kX6 every hop latent, six thoughts (from bXe), kX6b, kX6c and kX6d one round more each (kX6c and bXf
#    were shipped as models/prosqa-coconut and prosqa-cot on 2026-11-25); kXf6 the same from bXf.
set -euo pipefail
cd "$(dirname "$0")/../../../runs/nm"
export OMP_NUM_THREADS=1
coconut=../../build/coconut
cot=(mode=cot val_split=200 num_epochs=1 val_generate_limit=200 batch_size=32 save_every_steps=500 log_every=50
     warmup_steps=0)
graphs() {  # graphs SEED...: 64,000 fresh graphs each, the chain without the copula and as released
  for seed in "$@"; do
    $coconut data --task prosqa --count 64000 --seed "$seed" --people 4 --names-from ../../data/prosqa/valid.json \
      --out full64k_s"$seed".json --concepts 12 24 --path-steps 3 6
    python3 ../../experiments/prosqa_without_copula.py full64k_s"$seed".json full_nocopula64k_s"$seed".json
    python3 ../../experiments/prosqa_bfs_steps.py full_nocopula64k_s"$seed".json bfs64k_s"$seed".json $((seed - 7))
    python3 ../../experiments/prosqa_bfs_steps.py full64k_s"$seed".json bfsc64k_s"$seed".json $((seed - 7))
  done
}
released() {  # released RUN: the released validation file, and the chain's per-hop precision and recall
  $coconut eval --model "$1"/final --data "${2:-../../data/prosqa/valid.json}" --thought-top 72 --out "$1"_valid.jsonl \
    --force > "$1"_eval.log
  python3 ../../experiments/prosqa_bfs_steps.py --score "$1"_valid.jsonl valid_bfs.json
}
chain() {  # chain RUN FROM DATA CORE [KEY=VALUE...]
  local run=$1 from=$2 data=$3 core=$4
  shift 4
  taskset -c "$core" $coconut train cot_continue.yaml name="$run" output_dir="$run" load_model_path="$from"/final \
    "${cot[@]}" train_path="$data" "$@" > "$run".log 2>&1
}
thoughts() {  # thoughts RUN FROM SEED CORE STAGE LR
  local run=$1 from=$2 seed=$3 core=$4 stage=$5 lr=$6
  taskset -c "$core" $coconut train from_shipped.yaml name="$run" output_dir="$run" load_model_path="$from"/final \
    train_path=bfsc64k_s"$seed".json val_split=200 val_generate_limit=200 batch_size=32 log_every=50 \
    save_every_steps=500 num_epochs=1 warmup_steps=0 first_stage="$stage" max_latent_stage="$stage" schedule=cosine \
    min_lr_ratio=0 lr="$lr" > "$run".log 2>&1
}
graphs 103 104 105 106 107 108

$coconut expand --model bA6/final --out bX4/final --after 0,1
chain bX7 bX4 bfs64k_s103.json 0 &
chain bA7 bA6 bfs64k_s103.json 1
wait
chain bAd bA6 bfs64k_s104.json 1 schedule=cosine min_lr_ratio=0
for run in bA7 bX7 bAd; do released $run valid_bfs.json; done

python3 ../../experiments/articles_behind_vocab.py bAd/final bAdP/final
python3 ../../experiments/articles_behind_vocab.py bX7/final bX7P/final
chain bXe bX7P bfsc64k_s105.json 0 schedule=cosine min_lr_ratio=0 lr=1e-3 &
chain bAe bAdP bfsc64k_s105.json 1 schedule=cosine min_lr_ratio=0 lr=5e-4
wait
thoughts kH2 bAe 106 1 2 5e-4 &
chain bXf bXe bfsc64k_s107.json 0 schedule=cosine min_lr_ratio=0 lr=5e-4
wait
thoughts kX6 bXe 106 1 6 1e-3
thoughts kX6b kX6 107 1 6 5e-4 &
thoughts kXf6 bXf 108 0 6 1e-3
wait
thoughts kX6c kX6b 108 1 6 5e-4
graphs 109
thoughts kX6d kX6c 109 1 6 5e-4
for run in bAe bXe bXf kH2 kX6 kX6b kXf6 kX6c kX6d; do released $run; done
for run in kX6 kX6b kX6c; do python3 ../../experiments/prosqa_thought_probe.py "$run"_valid.jsonl valid_nocopula.json; done
