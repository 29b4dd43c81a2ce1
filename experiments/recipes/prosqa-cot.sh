#!/usr/bin/env bash
# Retrains models/prosqa-cot (models/README.md): the chain-of-thought runs (nm8, nm9, bA .. bA6, bX7,
# bXe, bXf, bD1 .. bD3, then c8b grown to 8 layers on a GPU) are trained side by side with
# models/prosqa-coconut's in one lineage, so its recipe is that one: experiments/recipes/prosqa-coconut.sh.
#   experiments/recipes/prosqa-cot.sh
exec "$(dirname "$0")/prosqa-coconut.sh" "$@"
