#!/usr/bin/env bash
# ProsQA at 4 layers (docs/results-pruning.md, "ProsQA, the earlier 2- and 4-layer models"; runs ps7 and cs3 of 2026-11-24): the
# shipped 2-layer models grown to 4 with `coconut expand` (a zero-output copy after each layer, so
# training starts from exactly what the 2-layer model computes), then trained on 24,000 fresh
# graphs of the corrected generator (the same options as experiments/recipes/prosqa-coconut-2l/levels.sh's
# joined24k.json, another seed). One core each, about 43 minutes an epoch at 4 layers. The recipes
# are the 2-layer runs' (ps6 / cs2 in experiments/recipes/prosqa-coconut-2l/levels.sh) with 50 warm-up steps.
# "../../models/..." are the models as shipped at commit 94b3c72 (2 layers).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
mkdir -p runs/prosqa_expand
cd runs/prosqa_expand
coconut=../../build/coconut
names=../../data/prosqa/valid.json
$coconut data --task prosqa --count 24000 --seed 21 --concepts 12 24 --path-steps 2 6 --people 4 --names-from $names --out joined24k_s21.json
$coconut expand --model ../../models/prosqa-coconut-2l --after 0,1 --out ps7_init
$coconut expand --model ../../models/prosqa-cot-2l --after 0,1 --out cs3_init
# The keys both runs share; each run's file is these plus its own.
cat > shared.yaml <<'YAML'
word_forms: true
articles: joined
shuffle_facts: true
batch_size: 64
lr: 1.0e-3
schedule: constant
warmup_steps: 50
weight_decay: 0.01
max_grad_norm: 1.0
bf16: true
seed: 0
log_every: 20
eval_every_epochs: 1
save_every_steps: 200
val_split: 200
val_generate_limit: 200
max_new_tokens: 64
YAML
{ cat shared.yaml; cat <<'YAML'; } > coconut.yaml
name: ps7
mode: coconut
c_thought: 1
first_stage: 7
max_latent_stage: 6
epochs_per_stage: 6
pad_latent_to_max: true
uniform_prob: 0.1
thought_reachable_loss: 1.0
latent_thought_rms: auto
YAML
{ cat shared.yaml; printf 'name: cs3\nmode: cot\n'; } > cot.yaml
$coconut train coconut.yaml output_dir=ps7 train_path=joined24k_s21.json load_model_path=ps7_init num_epochs=3 &
$coconut train cot.yaml output_dir=cs3 train_path=joined24k_s21.json load_model_path=cs3_init num_epochs=2 &
wait
for run in ps7 cs3; do $coconut eval --model $run/final --data $names --out ${run}_valid.jsonl --force; done
