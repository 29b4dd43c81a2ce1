#!/usr/bin/env bash
# ProsQA: three continuations of models/prosqa-coconut-2l (ps6's epoch 2, 64.7% on the released
# validation set) on 96,000 fresh graphs shaped as released, one core each, about 90 minutes for
# the 1,497 steps of one epoch (docs/results-prosqa.md, "The first hop", runs ps8, ps8w, ps8r of 2026-11-25):
#   ps8   the reachable-set recipe as before, with a cosine schedule (1e-3 -> 5e-5);
#   ps8w  ps8 with the first thought's set loss weighted 4x (thought_reachable_weights: [4, 1]);
#         the session stopped it after step 700 for ps8r's core (its figures are checkpoint-700's);
#   ps8r  ps8 with the sets one hop back (thought_reachable_start: root: the first thought names
#         the root) and seven thoughts, 1,000 steps.
# Then the first hop alone (ps9, ps9m; 20-22 minutes each): one-step questions (--path-steps 1 1,
# the answer a child of the root, the other option another person's child), alone and mixed half
# and half with ps8's graphs, one epoch of 24,000 each from the shipped model.
# Each validates on 200 of its own generated questions (val_split); the released validation set
# is only evaluated, and experiments/prosqa_thought_probe.py reads what the thoughts hold.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
mkdir -p runs/ps8
cd runs/ps8
coconut=../../build/coconut
names=../../data/prosqa/valid.json
$coconut data --task prosqa --count 96000 --seed 31 --concepts 12 24 --path-steps 2 6 --people 4 --names-from $names \
  --out joined96k_s31.json
# The recipe without its own model (it starts from the shipped one) and without the released set.
python3 ../../experiments/config_without_model.py ../../configs/prosqa_reachable.yaml from_shipped.yaml val_path
common=(train_path=joined96k_s31.json load_model_path=../../models/prosqa-coconut-2l val_split=200 num_epochs=1
        val_generate_limit=200 warmup_steps=0 schedule=cosine min_lr_ratio=0.05 save_every_steps=100)
taskset -c 0 $coconut train from_shipped.yaml name=ps8 output_dir=ps8 "${common[@]}" > ps8.log 2>&1 &
taskset -c 1 $coconut train from_shipped.yaml name=ps8w output_dir=ps8w "${common[@]}" thought_reachable_weights=4,1 \
  > ps8w.log 2>&1
taskset -c 1 $coconut train from_shipped.yaml name=ps8r output_dir=ps8r "${common[@]}" thought_reachable_start=root \
  max_latent_stage=7 first_stage=8 max_steps=1000 > ps8r.log 2>&1
wait
$coconut data --task prosqa --count 24000 --seed 41 --concepts 12 24 --path-steps 1 1 --people 4 --names-from $names \
  --out onehop24k.json
$coconut data --task prosqa --count 400 --seed 42 --concepts 12 24 --path-steps 1 1 --people 4 --names-from $names \
  --out onehop400_s42.json
python3 -c "
import json
one, many = json.load(open('onehop24k.json'))[:12000], json.load(open('joined96k_s31.json'))[:12000]
json.dump(one + many, open('mixed_onehop24k.json', 'w'))"
first_hop=(load_model_path=../../models/prosqa-coconut-2l val_split=200 num_epochs=1 val_generate_limit=200 warmup_steps=0
           save_every_steps=100)
taskset -c 0 $coconut train from_shipped.yaml name=ps9 output_dir=ps9 train_path=onehop24k.json "${first_hop[@]}" > ps9.log 2>&1 &
taskset -c 1 $coconut train from_shipped.yaml name=ps9m output_dir=ps9m train_path=mixed_onehop24k.json "${first_hop[@]}" \
  > ps9m.log 2>&1
wait
for run in ps9/final ps9m/final ../../models/prosqa-coconut-2l; do
  out=$(basename "${run%/final}")_onehop.jsonl
  $coconut eval --model $run --data onehop400_s42.json --thought-top 73 --out "$out" --force
  python3 ../../experiments/prosqa_thought_probe.py "$out" onehop400_s42.json
done
for run in ps8/final ps8w/checkpoint-700 ps8r/checkpoint-1000 ps9/final ps9m/final; do
  out=${run%%/*}_valid.jsonl
  $coconut eval --model $run --data $names --thought-top 73 --out "$out" --force
  flags=()
  [ "$run" = ps8r/checkpoint-1000 ] && flags=(--from-root)
  python3 ../../experiments/prosqa_thought_probe.py "$out" $names "${flags[@]}"
done
