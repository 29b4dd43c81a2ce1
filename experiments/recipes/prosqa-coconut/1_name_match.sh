#!/usr/bin/env bash
# ProsQA's name match (which person a fact is about): why no model here learned it, and a lesson
# that teaches it (docs/results-prosqa.md, "The name match", runs of 2026-11-25). One core each.
#
# 1. One-step questions (--path-steps 1 1: the answer a child of the root, the other option a child
#    of another person, so only the root's name tells them apart) on small graphs (8-12 concepts, up
#    to 4 people, about 100 tokens):
#    nm1  the shipped models/prosqa-coconut-2l, its own recipe, 12 epochs of 16,000;
#    nm2  the same size (2 layers, width 256) from scratch as CoT (stopped after epoch 10, at chance);
#    nm5  2 layers of width 128 from scratch, CoT, batch 32, 64,000 questions with the copula left
#         out ("Sally is a zhorpus." -> "Sally zhorpus."): the textbook induction pattern;
#    nm6  nm5 on the same questions as written ("is~a" between subject and object).
#    nm5 and nm6 were stopped at chance after 16,300 and 11,000 steps.
# 2. The lesson: associative recall in ProsQA's words (experiments/prosqa_recall_data.py: 16 facts
#    with distinct subjects, the chain restates 8 of them, so every restated object is a recall
#    target), CoT from scratch at nm5's size, 3 epochs of 64,000: nm8 without the copula, nm7 with
#    it (nm7b: 3 more epochs); then nm8 on nm5's one-step questions (nm9, 4 epochs of 16,000).
# 3. The released sizes (64,000 generated graphs, paths of 3-6 steps, without the copula) from nm9:
#    cA the Coconut recipe of configs/prosqa_reachable.yaml (six thoughts, reachable-set loss),
#    cB CoT; then cA2, cA on 128,000 fresh graphs, and cC, cA with the sets one hop back
#    (thought_reachable_start: root, seven thoughts: the first names the root, the second must find
#    the root's children from a thought); cD, cA2 on cA's graphs again with a cosine schedule
#    (1e-3 -> 5e-5); cE, cA from nm8 (the recall lesson without nm9's one-step questions).
# The released validation set is only evaluated, respelled the same way (valid_nocopula.json).
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
mkdir -p runs/nm
cd runs/nm
coconut=../../build/coconut
names=../../data/prosqa/valid.json
respell=../../experiments/prosqa_without_copula.py
prosqa() {  # prosqa COUNT SEED OUT GENERATOR-ARGS...
  local count=$1 seed=$2 out=$3
  shift 3
  $coconut data --task prosqa --count "$count" --seed "$seed" --people 4 --names-from $names --out "$out" "$@"
}
prosqa 16000 51 onestep_small16k.json --concepts 8 12 --path-steps 1 1
prosqa 64000 53 onestep_small64k.json --concepts 8 12 --path-steps 1 1
prosqa 64000 71 full64k.json --concepts 12 24 --path-steps 3 6
prosqa 128000 72 full128k_s72.json --concepts 12 24 --path-steps 3 6
python3 $respell onestep_small16k.json nocopula_small16k.json
python3 $respell onestep_small64k.json nocopula_small64k.json
python3 $respell full64k.json full_nocopula64k.json
python3 $respell full128k_s72.json full_nocopula128k_s72.json
python3 $respell $names valid_nocopula.json
python3 ../../experiments/prosqa_recall_data.py $names 64000 61 recall64k.json
python3 ../../experiments/prosqa_recall_data.py $names 64000 61 recall_nocopula64k.json --no-copula

python3 ../../experiments/config_without_model.py ../../configs/prosqa_reachable.yaml from_shipped.yaml val_path
# The recipe's model and optimiser as CoT: its Coconut keys and the released set left out.
grep -v -E '^(mode|val_path|first_stage|max_latent_stage|epochs_per_stage|pad_latent_to_max|uniform_prob|thought_reachable_loss|latent_thought_rms):' \
  ../../configs/prosqa_reachable.yaml > cot_from_scratch.yaml
sed -e 's/hidden_size: 256/hidden_size: 128/' -e 's/intermediate_size: 1024/intermediate_size: 512/' \
  -e 's/num_attention_heads: 8/num_attention_heads: 4/' -e 's/num_key_value_heads: 8/num_key_value_heads: 4/' \
  cot_from_scratch.yaml > cot_small_from_scratch.yaml
python3 ../../experiments/config_without_model.py cot_small_from_scratch.yaml cot_continue.yaml

common=(train_path=onestep_small16k.json val_split=200 num_epochs=12 val_generate_limit=200 warmup_steps=0
        save_every_steps=250 log_every=50)
taskset -c 0 $coconut train from_shipped.yaml name=nm1 output_dir=nm1 load_model_path=../../models/prosqa-coconut-2l \
  "${common[@]}" > nm1.log 2>&1 &
taskset -c 1 $coconut train cot_from_scratch.yaml name=nm2 output_dir=nm2 mode=cot "${common[@]}" warmup_steps=100 \
  max_steps=2470 > nm2.log 2>&1
wait
small=(mode=cot val_split=200 val_generate_limit=200 save_every_steps=500 log_every=100 warmup_steps=100 batch_size=32)
taskset -c 1 $coconut train cot_small_from_scratch.yaml name=nm5 output_dir=nm5 train_path=nocopula_small64k.json \
  num_epochs=10 max_steps=16300 "${small[@]}" > nm5.log 2>&1 &
taskset -c 0 $coconut train cot_small_from_scratch.yaml name=nm6 output_dir=nm6 train_path=onestep_small64k.json \
  num_epochs=10 max_steps=11000 "${small[@]}" > nm6.log 2>&1
wait
taskset -c 0 $coconut train cot_small_from_scratch.yaml name=nm7 output_dir=nm7 train_path=recall64k.json num_epochs=3 \
  "${small[@]}" > nm7.log 2>&1 &
taskset -c 1 $coconut train cot_small_from_scratch.yaml name=nm8 output_dir=nm8 train_path=recall_nocopula64k.json \
  num_epochs=3 "${small[@]}" > nm8.log 2>&1
taskset -c 1 $coconut train cot_continue.yaml name=nm9 output_dir=nm9 load_model_path=nm8/final \
  train_path=nocopula_small16k.json num_epochs=4 "${small[@]}" warmup_steps=0 > nm9.log 2>&1
wait
full=(load_model_path=nm9/final train_path=full_nocopula64k.json val_split=200 num_epochs=1 val_generate_limit=200
      warmup_steps=100 batch_size=32 save_every_steps=250 log_every=50)
taskset -c 0 $coconut train from_shipped.yaml name=cA output_dir=cA "${full[@]}" > cA.log 2>&1 &
taskset -c 1 $coconut train cot_continue.yaml name=cB output_dir=cB mode=cot "${full[@]}" > cB.log 2>&1
wait
# Continuations: full's settings, the later key=value winning.
continued=(warmup_steps=0 save_every_steps=500)
taskset -c 0 $coconut train from_shipped.yaml name=cA2 output_dir=cA2 "${full[@]}" "${continued[@]}" load_model_path=cA/final \
  train_path=full_nocopula128k_s72.json > cA2.log 2>&1 &
taskset -c 1 $coconut train cot_continue.yaml name=nm7b output_dir=nm7b load_model_path=nm7/final train_path=recall64k.json \
  num_epochs=3 "${small[@]}" warmup_steps=0 > nm7b.log 2>&1
taskset -c 1 $coconut train from_shipped.yaml name=cC output_dir=cC "${full[@]}" thought_reachable_start=root \
  max_latent_stage=7 first_stage=8 > cC.log 2>&1
wait
taskset -c 0 $coconut train from_shipped.yaml name=cD output_dir=cD "${full[@]}" "${continued[@]}" load_model_path=cA2/final \
  schedule=cosine min_lr_ratio=0.05 > cD.log 2>&1
taskset -c 0 $coconut train from_shipped.yaml name=cE output_dir=cE "${full[@]}" load_model_path=nm8/final > cE.log 2>&1
for run in cA/final cB/final cA2/final cC/final cD/final cE/final; do
  out=${run%%/*}_valid.jsonl
  $coconut eval --model $run --data valid_nocopula.json --thought-top 72 --out "$out" --force
  case ${run%%/*} in
    cA | cA2 | cD | cE) python3 ../../experiments/prosqa_thought_probe.py "$out" valid_nocopula.json ;;
    cC) python3 ../../experiments/prosqa_thought_probe.py "$out" valid_nocopula.json --from-root ;;
  esac
done
