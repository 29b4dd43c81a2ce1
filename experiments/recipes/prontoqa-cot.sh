#!/bin/bash
# How models/prontoqa-cot was trained (issue 19, runs x1 -> x3 -> x6; models/README.md): three runs,
# each from the last one's weights, on the released ProntoQA training set respelled for the
# tokenizer options that did not exist yet, then the vocabulary renamed to read the released text.
# About 116 minutes on one core of the 2-core CPU (OMP_NUM_THREADS=1, bf16).
# configs/prontoqa_cot.yaml is the same recipe in one run on the released text.
set -euo pipefail
cd "$(dirname "$0")/../.."
for spelling in isa isa_marked; do
  mkdir -p runs/respelled/$spelling
  flags=(--isa); [ $spelling = isa_marked ] && flags+=(--marked-not)
  for split in train valid; do
    python3 experiments/prontoqa_respell.py "${flags[@]}" data/prontoqa/$split.json runs/respelled/$spelling/$split.json
  done
done
build/coconut train experiments/recipes/prontoqa-cot/x1.yaml
build/coconut train experiments/recipes/prontoqa-cot/x3.yaml
build/coconut train experiments/recipes/prontoqa-cot/x6.yaml
mkdir -p models/prontoqa-cot
cp runs/x6/checkpoint-2820/{config.json,model.safetensors,tokenizer.json,coconut.json} models/prontoqa-cot/
python3 experiments/released_text_vocab.py --marked-not models/prontoqa-cot/tokenizer.json
build/coconut eval --model models/prontoqa-cot --data data/prontoqa/valid.json
