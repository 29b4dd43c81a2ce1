#!/usr/bin/env bash
# ProsQA: training graphs in the released graphs' shape (`coconut data --shape dead-ends`), and a
# fixed selection set (docs/results-prosqa.md, "The released graphs' shape", 2026-11-26). Needs
# experiments/recipes/prosqa-coconut/3_bfs_deeper.sh's runs in runs/nm (kX6d, bXf and their configs). One core each.
#
# 1. One more round of the default (funnel) graphs: kX6e from kX6d; and the chain in words one round
#    further, bXg from bXf (does CoT climb as the thoughts do?).
# 2. Two fixed selection sets of 1,000 generated questions, never trained on (seed 990 in the
#    dead-ends shape, 991 in the funnel shape): every candidate is scored on both, with the released
#    validation file measured alongside and never used to choose.
# 3. kD1: kX6e one round on 64,000 dead-ends graphs, against kX6f: the same round on funnel graphs
#    (the control). Then kD2, kD3 and kD4 one round more each on fresh dead-ends graphs; bD1 and bD2
#    the chain in words (from bXf) on dead-ends graphs, the CoT of the same size and data. kD3 and
#    bD2 were shipped as models/prosqa-coconut and prosqa-cot for a few hours on 2026-11-26; kD4 and
#    bD3 came after the sweep.
set -euo pipefail
cd "$(dirname "$0")/../../../runs/nm"
export OMP_NUM_THREADS=1
selection_sets=(dead_ends funnel)
# shellcheck source=experiments/recipes/prosqa-coconut/rounds.sh
source ../../experiments/recipes/prosqa-coconut/rounds.sh
graphs funnel "" "12 24" 110 111
graphs dead-ends d "16 24" 120 121 122 123 124 125 126
$coconut data --task prosqa --count 1000 --seed 990 --people 4 --names-from ../../data/prosqa/valid.json \
  --out select_dead_ends_1000.json --concepts 16 24 --path-steps 3 6 --shape dead-ends
$coconut data --task prosqa --count 1000 --seed 991 --people 4 --names-from ../../data/prosqa/valid.json \
  --out select_funnel_1000.json --concepts 12 24 --path-steps 3 6
for run in kX6c kX6d bXf; do scores "$run" 0; done

thoughts kX6e kX6d bfsc64k_s110.json 0 &
chain bXg bXf bfsc64k_s111.json 1
wait
thoughts kD1 kX6e dbfsc64k_s120.json 0 &
thoughts kX6f kX6e bfsc64k_s111.json 1
wait
thoughts kD2 kD1 dbfsc64k_s121.json 0 &
chain bD1 bXf dbfsc64k_s122.json 1
wait
thoughts kD3 kD2 dbfsc64k_s123.json 0 &
chain bD2 bD1 dbfsc64k_s124.json 1
wait
thoughts kD4 kD3 dbfsc64k_s125.json 0 &
chain bD3 bD2 dbfsc64k_s126.json 1
wait
