#!/usr/bin/env bash
# ProsQA's hops between concepts (docs/results-prosqa.md, "The hops between concepts", 2026-11-25).
# Needs experiments/recipes/prosqa-coconut/1_name_match.sh's runs in runs/nm (nm9, cA2 and their data). One core each.
#
# The name-match runs' thoughts find the root's children (cA2: first hop 0.989 / 0.004) but not the
# children of a set of concepts: at thought 2 of cA2 the new mass per node is alike on the root's
# grandchildren (0.035), other people's children (0.034) and the children of concepts the root does
# not reach (0.024): a spread over every fact's object, no lookup by subject.
# 1. Is it what a thought feeds back? The lookup learned in words (nm8) reads token embeddings; a
#    thought is a last hidden state. eA: nm9 -> cA's recipe with thoughts fed back as
#    softmax(logits) @ embed_tokens (latent_thought_input: expected_embedding, the superposition of
#    the embeddings of the nodes a thought names), rescaled to the tokens' RMS; eB: not rescaled.
# 2. Questions where the hop between concepts decides (as nm9's one-step questions carried the first
#    hop's match to the thoughts): 64,000 released-size graphs whose answer is two edges from the
#    root (--path-steps 2 2), Coconut recipe as cA: f2A from cA2, f2B from nm9.
# 3. The same questions with the other option replaced by a child of concepts the root does not
#    reach (experiments/prosqa_concept_negatives.py), so that no "a concept's child, not a person's"
#    shortcut separates the options: g2A from cA2, g2B from f2A.
# 4. Hop 2 in words: nm8's lookup of one concept ("Every X" -> X's objects), and a chain of thought
#    that is the breadth-first search (experiments/prosqa_bfs_steps.py: step k lists the nodes first
#    reached at hop k), so that each listed node is a lookup from the set the step before lists:
#    CoT on 64,000 such questions from nm9 (bA) and from nm8 (bB), then 128,000 more (bA2, bB2),
#    and bA2 on those 128,000 again (bA3); the recall lesson with 2 heads of 64 (nm8h2) -> bA's
#    questions (bH2).
# 5. bA3's breadth-first chain into thoughts (one thought per hop), the Coconut recipe as cA: kA
#    every hop latent from the start on bA's questions; kB the curriculum, one hop more latent per
#    epoch of 16,000 (stages 1-6).
# 6. The chain further: bA3 -> bA's 64,000 again (bA4) -> 64,000 fresh graphs (bA5) -> 64,000 more
#    (bA6), and kA's recipe on the same fresh graphs from bA4 (kA2) and from bA5 (kA3).
# The released validation set is only evaluated, respelled (valid_nocopula.json, valid_bfs.json).
set -euo pipefail
cd "$(dirname "$0")/../../../runs/nm"
export OMP_NUM_THREADS=1
coconut=../../build/coconut
full=(load_model_path=nm9/final train_path=full_nocopula64k.json val_split=200 num_epochs=1 val_generate_limit=200
      warmup_steps=100 batch_size=32 save_every_steps=250 log_every=50)
probe() {  # probe RUN...: the released set, respelled, and what each run's thoughts hold
  for run in "$@"; do
    $coconut eval --model "$run"/final --data valid_nocopula.json --thought-top 72 --out "$run"_valid.jsonl --force
    python3 ../../experiments/prosqa_thought_probe.py "$run"_valid.jsonl valid_nocopula.json
  done
}
expected=("${full[@]}" latent_thought_input=expected_embedding)
taskset -c 0 $coconut train from_shipped.yaml name=eA output_dir=eA "${expected[@]}" > eA.log 2>&1 &
taskset -c 1 $coconut train from_shipped.yaml name=eB output_dir=eB "${expected[@]}" latent_thought_rms=0 > eB.log 2>&1
wait
probe eA eB

$coconut data --task prosqa --count 64000 --seed 81 --people 4 --names-from ../../data/prosqa/valid.json \
  --out twostep64k.json --concepts 12 24 --path-steps 2 2
python3 ../../experiments/prosqa_without_copula.py twostep64k.json twostep_nocopula64k.json
twostep=("${full[@]}" train_path=twostep_nocopula64k.json)
taskset -c 0 $coconut train from_shipped.yaml name=f2A output_dir=f2A "${twostep[@]}" load_model_path=cA2/final > f2A.log 2>&1 &
taskset -c 1 $coconut train from_shipped.yaml name=f2B output_dir=f2B "${twostep[@]}" > f2B.log 2>&1
wait
probe f2A f2B

python3 ../../experiments/prosqa_concept_negatives.py twostep_nocopula64k.json twostep_conceptneg.json 82
conceptneg=("${full[@]}" train_path=twostep_conceptneg.json)
taskset -c 0 $coconut train from_shipped.yaml name=g2A output_dir=g2A "${conceptneg[@]}" load_model_path=cA2/final > g2A.log 2>&1 &
taskset -c 1 $coconut train from_shipped.yaml name=g2B output_dir=g2B "${conceptneg[@]}" load_model_path=f2A/final > g2B.log 2>&1
wait
probe g2A g2B

python3 ../../experiments/prosqa_word_lookup.py nm8/final valid_nocopula.json
python3 ../../experiments/prosqa_bfs_steps.py full_nocopula64k.json bfs64k.json 91
python3 ../../experiments/prosqa_bfs_steps.py full_nocopula128k_s72.json bfs128k.json 93
python3 -c "import json; json.dump(json.load(open('bfs128k.json'))[:16000], open('bfs16k.json', 'w'))"
python3 ../../experiments/prosqa_bfs_steps.py valid_nocopula.json valid_bfs.json 92
cot=(mode=cot train_path=bfs64k.json val_split=200 num_epochs=1 val_generate_limit=200 warmup_steps=100 batch_size=32
     save_every_steps=250 log_every=50)
taskset -c 0 $coconut train cot_continue.yaml name=bA output_dir=bA load_model_path=nm9/final "${cot[@]}" > bA.log 2>&1 &
taskset -c 1 $coconut train cot_continue.yaml name=bB output_dir=bB load_model_path=nm8/final "${cot[@]}" > bB.log 2>&1
wait
more=("${cot[@]}" train_path=bfs128k.json warmup_steps=0 save_every_steps=500)
taskset -c 0 $coconut train cot_continue.yaml name=bA2 output_dir=bA2 load_model_path=bA/final "${more[@]}" > bA2.log 2>&1 &
taskset -c 1 $coconut train cot_continue.yaml name=bB2 output_dir=bB2 load_model_path=bB/final "${more[@]}" > bB2.log 2>&1
wait
taskset -c 0 $coconut train cot_continue.yaml name=bA3 output_dir=bA3 load_model_path=bA2/final "${more[@]}" > bA3.log 2>&1 &
sed -e 's/num_attention_heads: 4/num_attention_heads: 2/' -e 's/num_key_value_heads: 4/num_key_value_heads: 2/' \
  cot_small_from_scratch.yaml > cot_small_2heads.yaml
small=(mode=cot val_split=200 val_generate_limit=200 save_every_steps=500 log_every=100 warmup_steps=100 batch_size=32)
taskset -c 1 $coconut train cot_small_2heads.yaml name=nm8h2 output_dir=nm8h2 train_path=recall_nocopula64k.json \
  num_epochs=3 "${small[@]}" > nm8h2.log 2>&1
taskset -c 1 $coconut train cot_continue.yaml name=bH2 output_dir=bH2 load_model_path=nm8h2/final "${cot[@]}" > bH2.log 2>&1
wait
for run in bA bB bA2 bB2 bA3 bH2; do
  $coconut eval --model $run/final --data valid_bfs.json --out "$run"_valid.jsonl --force
  python3 ../../experiments/prosqa_bfs_steps.py --score "$run"_valid.jsonl valid_bfs.json
done

base=(load_model_path=bA3/final val_split=200 val_generate_limit=200 batch_size=32 log_every=50 save_every_steps=250)
taskset -c 0 $coconut train from_shipped.yaml name=kA output_dir=kA "${base[@]}" train_path=bfs64k.json num_epochs=1 \
  warmup_steps=100 > kA.log 2>&1 &
taskset -c 1 $coconut train from_shipped.yaml name=kB output_dir=kB "${base[@]}" train_path=bfs16k.json first_stage=1 \
  epochs_per_stage=1 num_epochs=6 warmup_steps=0 > kB.log 2>&1
wait
probe kA kB

taskset -c 0 $coconut train cot_continue.yaml name=bA4 output_dir=bA4 load_model_path=bA3/final "${more[@]}" \
  train_path=bfs64k.json > bA4.log 2>&1
# further SEED ORDER_SEED FROM KRUN BRUN: 64,000 fresh graphs, then from FROM's chain kA's recipe
# (KRUN, core 0) and the chain in words (BRUN, core 1) on them.
further() {
  local seed=$1 order_seed=$2 from=$3 krun=$4 brun=$5
  $coconut data --task prosqa --count 64000 --seed "$seed" --people 4 --names-from ../../data/prosqa/valid.json \
    --out full64k_s"$seed".json --concepts 12 24 --path-steps 3 6
  python3 ../../experiments/prosqa_without_copula.py full64k_s"$seed".json full_nocopula64k_s"$seed".json
  python3 ../../experiments/prosqa_bfs_steps.py full_nocopula64k_s"$seed".json bfs64k_s"$seed".json "$order_seed"
  taskset -c 0 $coconut train from_shipped.yaml name="$krun" output_dir="$krun" "${base[@]}" load_model_path="$from"/final \
    train_path=bfs64k_s"$seed".json num_epochs=1 warmup_steps=100 > "$krun".log 2>&1 &
  taskset -c 1 $coconut train cot_continue.yaml name="$brun" output_dir="$brun" load_model_path="$from"/final "${more[@]}" \
    train_path=bfs64k_s"$seed".json > "$brun".log 2>&1
  wait
}
further 101 94 bA4 kA2 bA5
further 102 95 bA5 kA3 bA6
probe kA2 kA3
for run in bA4 bA5 bA6; do
  $coconut eval --model $run/final --data valid_bfs.json --out "$run"_valid.jsonl --force
  python3 ../../experiments/prosqa_bfs_steps.py --score "$run"_valid.jsonl valid_bfs.json
done
