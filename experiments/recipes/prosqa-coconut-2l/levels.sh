#!/usr/bin/env bash
# ProsQA on graphs shaped like the released ones (docs/results-prosqa.md, "A second generator fix"; runs ps5, ps6,
# ps6b, cs1, cs2 of 2026-11-24). The reachable-set recipe of
# experiments/recipes/prosqa-coconut-2l/graph_curriculum.sh (prosqa_from_shipped.yaml, made there), one core per run,
# about 25 minutes an epoch of 24,000 graphs. ps5 trained on graphs from commit 0b6f332 (levels, no
# shortcuts; parts apart, three people); ps6 and ps6b on today's generator (0cd41c1: people drawn as
# released, parts joined), which is what this script generates for both steps.
# The CoT baseline of the same size continues the CoT model shipped before (rcot, 40.3%) on the same
# graphs (cs1 on small graphs, which in the session came from the generator of commit 9feb27e; cs2
# on ps5's). "../../models/..." below are the models as shipped before these runs (2026-11-24)
# (`git show 7ca917a:models/...`); the session stopped ps5 at step 1,000 and ps6 after 2 epochs.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
mkdir -p runs/graph_curriculum
cd runs/graph_curriculum
coconut=../../build/coconut
names=../../data/prosqa/valid.json
[ -f prosqa_from_shipped.yaml ] || { echo "run experiments/recipes/prosqa-coconut-2l/graph_curriculum.sh first (it writes the config and ps3's lineage)"; exit 1; }
$coconut data --task prosqa --count 24000 --seed 10 --concepts 12 24 --path-steps 2 6 --people 3 --names-from $names --out levels24k.json
$coconut data --task prosqa --count 24000 --seed 13 --concepts 12 24 --path-steps 2 6 --people 4 --names-from $names --out joined24k.json
$coconut data --stats joined24k.json
# From ps3's epoch-5 weights (models/prosqa-coconut-2l as of 2026-11-24).
$coconut train prosqa_from_shipped.yaml name=ps5 output_dir=ps5 train_path=levels24k.json load_model_path=../../models/prosqa-coconut-2l \
  val_split=200 num_epochs=6 val_generate_limit=200 warmup_steps=0 max_steps=1000
$coconut train prosqa_from_shipped.yaml name=ps6 output_dir=ps6 train_path=joined24k.json load_model_path=ps5/checkpoint-1000 \
  val_split=200 num_epochs=2 val_generate_limit=200 warmup_steps=0
$coconut train prosqa_from_shipped.yaml name=ps6b output_dir=ps6b train_path=joined24k.json load_model_path=ps5/checkpoint-1000 \
  val_split=200 num_epochs=2 val_generate_limit=200 warmup_steps=0 lr=3e-4
# CoT of the same size on the same graphs, from the shipped CoT model.
cat > cot.yaml <<'YAML'
name: prosqa_cot_levels
mode: cot
word_forms: true
articles: joined
shuffle_facts: true
batch_size: 64
lr: 1.0e-3
schedule: constant
weight_decay: 0.01
max_grad_norm: 1.0
bf16: true
seed: 0
log_every: 20
eval_every_epochs: 1
save_every_steps: 200
val_generate_limit: 200
max_new_tokens: 64
YAML
$coconut data --task prosqa --count 24000 --seed 8 --concepts 8 10 --path-steps 2 3 --people 2 --names-from $names --out small24k_levels.json
$coconut train cot.yaml name=cs1 output_dir=cs1 train_path=small24k_levels.json load_model_path=../../models/prosqa-cot-2l val_split=200 num_epochs=2
$coconut train cot.yaml name=cs2 output_dir=cs2 train_path=levels24k.json load_model_path=cs1/final val_split=200 num_epochs=2
for run in ps6/final ps6b/final cs2/final; do $coconut eval --model $run --data $names --out ${run%/final}_valid.jsonl --force; done
