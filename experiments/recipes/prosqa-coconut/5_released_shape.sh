#!/usr/bin/env bash
# ProsQA: training graphs drawn as the released ones in size and density too (`coconut data --shape
# released`), and a selection set in that shape (docs/results-prosqa.md, "The released shape, sizes and densities
# too", 2026-11-26). Needs experiments/recipes/prosqa-coconut/4_dead_ends.sh's runs in runs/nm (kD3, bD3
# and the configs). One core each.
#
# 1. A selection set of 1,000 generated questions in the released shape (seed 992, never trained
#    on); every candidate is scored on it, with the released validation file and the dead-ends
#    selection set measured alongside and never used to choose.
# 2. kR1 from kD3 and bR1 from bD3 (the chain in words), one round each on 64,000 released-shape
#    graphs; then kR2 / bR2 one round more each on fresh graphs; then kR3 one round more, and
#    kR4 / kR5 the same round from kR2 at peak lr 1e-3 / 2.5e-4. kR5 and bD3 are what
#    experiments/gpu_prosqa_grow.sh grows into models/prosqa-coconut and models/prosqa-cot.
# Seeds 130 and 131 were made by commit 7b69033, whose released shape kept one in 12 edges onto the
# answer's path (810645a keeps one in 5): to train kR1 and bR1 on the same graphs, build that
# commit for those two files; this script makes them with the current code.
set -euo pipefail
cd "$(dirname "$0")/../../../runs/nm"
export OMP_NUM_THREADS=1
selection_sets=(dead_ends released)
# shellcheck source=experiments/recipes/prosqa-coconut/rounds.sh
source ../../experiments/recipes/prosqa-coconut/rounds.sh
graphs released r "15 25" 130 131 132 133 134 135 136
$coconut data --task prosqa --count 1000 --seed 992 --people 4 --names-from ../../data/prosqa/valid.json \
  --out select_released_1000.json --concepts 15 25 --path-steps 3 6 --shape released
for run in kD3 bD3; do scores "$run" 0; done

thoughts kR1 kD3 rbfsc64k_s130.json 1 &
chain bR1 bD3 rbfsc64k_s131.json 0
wait
thoughts kR2 kR1 rbfsc64k_s132.json 1 &
chain bR2 bR1 rbfsc64k_s133.json 0
wait
# One round more (kR3), and the same from kR2 at other peak learning rates.
thoughts kR3 kR2 rbfsc64k_s134.json 1
thoughts kR4 kR2 rbfsc64k_s135.json 1 1e-3 &
thoughts kR5 kR2 rbfsc64k_s136.json 0 2.5e-4
wait
