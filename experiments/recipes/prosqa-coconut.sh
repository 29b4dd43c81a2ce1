#!/usr/bin/env bash
# Retrains models/prosqa-coconut and models/prosqa-cot (models/README.md): one lineage makes both,
# the Coconut runs (k...) and the chain-of-thought runs (b...) side by side, one core each, each run
# from the one before, in runs/nm. The five CPU stages, in order (each script's header says what its
# runs are and why; they also run the side experiments docs/results-prosqa.md reports):
#   prosqa-coconut/1_name_match.sh      the name match: nm8 (recall lesson) -> nm9 (one-step questions)
#   prosqa-coconut/2_concept_hops.sh    the breadth-first chain in words: bA .. bA6
#   prosqa-coconut/3_bfs_deeper.sh      4 layers, the released spelling, into thoughts: bX7, bXe, bXf, kX6 .. kX6d
#   prosqa-coconut/4_dead_ends.sh       graphs in the released graphs' shape: kX6e, kD1 .. kD4, bD1 .. bD3
#   prosqa-coconut/5_released_shape.sh  released sizes and densities: kR1 .. kR5 (and bR1, bR2)
# (prosqa-coconut/rounds.sh is sourced by stages 4 and 5.) About 7 hours of one core for the
# Coconut part, 3.5 for the CoT part, two runs at a time on a 2-core machine; more with the side runs.
# Then the GPU step, on a machine with a CUDA PyTorch (experiments/gpu_prosqa_grow.sh, whose header
# says what to carry in .gpu/): kR5 and bD3 grown to 8 layers and trained two more rounds;
# g8hb is models/prosqa-coconut, c8b models/prosqa-cot. This script runs the CPU stages and then
# prints the GPU step.
#   experiments/recipes/prosqa-coconut.sh
set -euo pipefail
here=$(dirname "$0")/prosqa-coconut
for stage in 1_name_match 2_concept_hops 3_bfs_deeper 4_dead_ends 5_released_shape; do
  bash "$here/$stage.sh"
done
cat <<'TEXT'
CPU stages done: runs/nm/kR5/final and runs/nm/bD3/final. The GPU step (experiments/gpu_prosqa_grow.sh):
  carry in .gpu/: coconut built against the GPU machine's torch wheel, the .deb files its header
  names in .gpu/debs/, runs/nm/kR5/final as .gpu/models/kR5, runs/nm/bD3/final as .gpu/models/bD3,
  runs/nm/from_shipped.yaml and runs/nm/cot_continue.yaml; then, on the GPU machine:
    experiments/gpu_prosqa_grow.sh setup
    experiments/gpu_prosqa_grow.sh start
    experiments/gpu_prosqa_grow.sh watch SECONDS
    experiments/gpu_prosqa_grow.sh pack
  g8hb/final -> models/prosqa-coconut, c8b/final -> models/prosqa-cot.
TEXT
