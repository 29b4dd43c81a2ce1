#!/usr/bin/env bash
# Training throughput of SmolLM2-135M on the configs of configs/smollm2/: tokens per second (every
# position of the batch's sequences, thoughts included, padding not; the training log's own figure)
# and model-FLOPs utilisation of a CoT step and of Coconut steps at stages 1, 3 and 6, under LoRA
# and full fine-tuning, at several batch sizes, each a short `coconut train` run (STEPS steps, the
# last logged window counted: the first steps warm up).
#
#   bench/smollm2_train_throughput.sh [DEVICE] [BATCHES] [STEPS] [PEAK_FLOPS]
#
# DEVICE cuda (default) or cpu; BATCHES "32 128 256" by default; STEPS 15; PEAK_FLOPS the device's
# dense bf16 peak (default 989e12, an H100/H200 SXM's spec sheet; the CPU has none: MFU is left out).
# FLOPs per token: `coconut info`'s forward FLOPs at the data's mean length, times 3 for full
# fine-tuning (forward, input and weight gradients) and 2 under LoRA (no weight gradients for the
# frozen projections; the adapters' are negligible). Writes build/bench-smollm2-train.csv and
# prints the table. A run out of memory is reported as such and the grid goes on.
set -euo pipefail
cd "$(dirname "$0")/.."
device=${1:-cuda}
batches=${2:-32 128 256}
steps=${3:-15}
peak=${4:-989e12}
model=.models/smollm2-135m
[ -f "$model/config.json" ] || { echo "$model is missing: ./run fetch-model smollm2-135m" >&2; exit 1; }
bin=./build/coconut
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
csv=build/bench-smollm2-train.csv
# ProntoQA's mean sequence: 291 tokens (docs/smollm2-coconut.md); the forward FLOPs per token there.
forward=$("$bin" info "$model" --json --context 291 | python3 -c 'import json, sys; print(json.load(sys.stdin)["flops_per_token"])')
adapter=models/smollm2-prontoqa-coconut-chain
echo "step,tuning,batch,tokens_per_second,flops_per_token,mfu" >"$csv"
printf '%-10s %-6s %6s %14s %8s\n' step tuning batch tokens/s MFU
for tuning in lora full; do
  for step in cot s1 s3 s6; do
    for batch in $batches; do
      # Coconut under LoRA from the shipped chain adapter; a full fine-tune from the base (its speed
      # does not depend on where it starts).
      args=(train configs/smollm2/prontoqa_cot.yaml)
      [ "$step" != cot ] && args=(train configs/smollm2/prontoqa_coconut.yaml "first_stage=${step#s}")
      if [ "$tuning" = full ]; then args+=(lora_rank=0 lr=1.0e-4 'init_adapter=""'); elif [ "$step" != cot ]; then args+=("init_adapter=$adapter"); fi
      log=$work/$step-$tuning-$batch.log
      if ! "$bin" "${args[@]}" load_model_path="$model" device="$device" batch_size="$batch" gradient_accumulation_steps=1 \
          max_steps="$steps" log_every=5 eval_every_epochs=0 save_every_steps=0 output_dir="$work/run" >"$log" 2>&1; then
        grep -q "out of memory" "$log" && reason="out of memory" || reason="failed: $(tail -1 "$log")"
        printf '%-10s %-6s %6s %14s\n' "$step" "$tuning" "$batch" "$reason"
        continue
      fi
      rate=$(grep -o '[0-9]* tok/s' "$log" | tail -1 | cut -d' ' -f1)
      factor=$([ "$tuning" = full ] && echo 3 || echo 2)
      read -r flops mfu < <(python3 -c "f = $forward * $factor; r = $rate; print(f, '' if '$device' == 'cpu' else f'{r * f / $peak:.3f}')")
      echo "$step,$tuning,$batch,$rate,$flops,$mfu" >>"$csv"
      printf '%-10s %-6s %6s %14s %8s\n' "$step" "$tuning" "$batch" "$rate" "$mfu"
    done
  done
done
echo "bench: $csv"
