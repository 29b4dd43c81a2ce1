#!/usr/bin/env bash
# Retrains models/prosqa-cot-2l (models/README.md): rcot, configs/prosqa_reachable.yaml's model and
# 90,000 questions as chain of thought, stopped after 400 steps (2026-11-24; its command was not
# recorded beyond that), then cs1 -> cs2, which the levels step of
# experiments/recipes/prosqa-coconut-2l.sh runs beside the Coconut runs ps5 -> ps6 (read that
# script's header first: the step starts from the model shipped before it, rcot here).
#   experiments/recipes/prosqa-cot-2l.sh
exec "$(dirname "$0")/prosqa-coconut-2l.sh" levels
