#!/usr/bin/env bash
# Generated ProsQA questions in the released shape (names from the released questions, 15-25
# concepts, 3-6 path steps), their steps rewritten as the released BFS steps, into OUT unless it
# exists: the any-depth recipes' healing and calibration sets.
#
#   experiments/generate_prosqa_questions.sh COUNT SEED OUT
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:?usage: COUNT SEED OUT} seed=${2:?usage: COUNT SEED OUT} out=${3:?usage: COUNT SEED OUT}
[ -s "$out" ] && exit 0
raw="${out%.json}_raw.json"
build/coconut data --task prosqa --count "$count" --seed "$seed" --people 4 --names-from data/prosqa/valid.json \
  --concepts 15 25 --path-steps 3 6 --shape released --out "$raw"
python3 experiments/prosqa_bfs_steps.py "$raw" "$out" 1
