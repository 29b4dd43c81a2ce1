#!/usr/bin/env bash
# Retrains models/prosqa-coconut-2l (and, in its last step, models/prosqa-cot-2l; models/README.md):
# three steps, run one at a time, each from the model the step before shipped:
#   experiments/recipes/prosqa-coconut-2l.sh rlk1              configs/prosqa_reachable.yaml from
#       scratch on 90,000 generated questions (runs/prosqa_reachable); the model shipped was its
#       weights at step 2,820 (the config's 10 epochs run longer; 94 minutes to there on one core)
#   experiments/recipes/prosqa-coconut-2l.sh graph-curriculum  prosqa-coconut-2l/graph_curriculum.sh:
#       ps1 (small graphs) -> ps2 (medium graphs; ps3 on today's generator), from the rlk1 model
#   experiments/recipes/prosqa-coconut-2l.sh levels            prosqa-coconut-2l/levels.sh: ps5 ->
#       ps6 (the ps6 epoch-2 weights are models/prosqa-coconut-2l), from the ps3 model; and the CoT
#       twin cs1 -> cs2 (models/prosqa-cot-2l), from the rcot model
# The two later steps read their starting model from models/prosqa-coconut-2l and
# models/prosqa-cot-2l, which held the previous step's model when they ran (then named
# models/prosqa-coconut and models/prosqa-cot: `git show 7ca917a:models/prosqa-coconut/...` for the
# levels step): put that model there before each step to retrace the lineage; as they stand the
# scripts continue today's shipped models. Each script's header says what differed from the runs
# as recorded. One core per run.
set -euo pipefail
here=$(dirname "$0")
case ${1:-} in
  rlk1)
    cd "$here/../.."
    export OMP_NUM_THREADS=1
    # The command configs/prosqa_reachable.yaml's header gives.
    build/coconut data --task prosqa --count 90000 --seed 1 --names-from data/prosqa/valid.json \
      --out data/prosqa_train90k.json
    build/coconut train configs/prosqa_reachable.yaml
    ;;
  graph-curriculum) bash "$here/prosqa-coconut-2l/graph_curriculum.sh" ;;
  levels) bash "$here/prosqa-coconut-2l/levels.sh" ;;
  *)
    sed -n '2,/^[^#]/{/^#/p}' "$0"
    exit 2
    ;;
esac
