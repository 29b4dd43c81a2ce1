#!/usr/bin/env bash
# ProsQA on a lent GPU: the models of record (kR5, 4 layers of width 128, and its CoT twin bD3)
# grown deeper with `coconut expand` (zero-output layer copies: the grown model starts out answering
# as the original) and trained two or three more rounds on fresh released-shape graphs, lineages side
# by side on the one GPU (models this small leave it idle between launches). docs/results-prosqa.md, "Deeper, on the
# GPU" (2026-11-26).
#   experiments/gpu_prosqa_grow.sh setup          # unpack the libraries, make the data, grow the models
#   experiments/gpu_prosqa_grow.sh start          # every lineage in its own process session
#   experiments/gpu_prosqa_grow.sh lineage NAME   # one lineage (what start runs)
#   experiments/gpu_prosqa_grow.sh watch SECONDS  # progress until SECONDS have passed or all are done
#   experiments/gpu_prosqa_grow.sh pack           # newest final of each lineage, scores and logs -> $OUT
# Carried in .gpu/ (ignored by git): `coconut` built on the CPU machine against the PyPI wheel of
# torch 2.11.0 (the GPU machine's version), Debian's libyaml-cpp0.7, libcpp-httplib0.11, libbrotli1
# and libpcre2-8-0 as .deb files (`apt-get download`), models/kR5 and models/bD3 (runs/nm's finals),
# and runs/nm's from_shipped.yaml and cot_continue.yaml. COUNT and DEVICE shrink it for a dry run on
# the CPU (COUNT=300 DEVICE=cpu).
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # repo root (repo), deps=/tmp/deps, the gpu_* functions
carried=$repo/.gpu
work=${WORK:-/tmp/grow}
out=${OUT:-$repo/results/grow}
count=${COUNT:-64000}
device=${DEVICE:-cuda}
bin=$carried/coconut
gpu_library_path "$deps"
export OMP_NUM_THREADS=2
mkdir -p "$work" "$out"
cd "$work" || exit 1

# lineage -> "origin mode layers-to-copy-after seed:lr seed:lr seed:lr|-" (batch 64: twice the CPU
# rounds' batch at sqrt(2) their peak learning rate, cosine to 0 over one pass of 64,000 graphs).
# Shipped: g8hb (models/prosqa-coconut) and c8b (models/prosqa-cot), the best on the selection set.
declare -A lineages=(
  [g8]="kR5 coconut 0,1,2,3 140:7e-4 141:3.5e-4 144:1.75e-4"
  [g8h]="kR5 coconut 0,1,2,3 142:1.4e-3 143:3.5e-4 145:1.75e-4"
  [g6]="kR5 coconut 1,3 140:7e-4 141:3.5e-4 144:1.75e-4"
  [g4]="kR5 coconut - 140:3.5e-4 141:1.75e-4 -"
  [c8]="bD3 cot 0,1,2,3 140:7e-4 141:3.5e-4 144:1.75e-4"
  [c6]="bD3 cot 1,3 140:7e-4 141:3.5e-4 144:1.75e-4"
)

graphs() {  # seed: released-shape graphs, then the breadth-first chain as steps
  $bin data --task prosqa --count "$count" --seed "$1" --people 4 --names-from "$repo"/data/prosqa/valid.json \
    --out full_s"$1".json --concepts 15 25 --path-steps 3 6 --shape released >/dev/null &&
    python3 "$repo"/experiments/prosqa_bfs_steps.py full_s"$1".json bfs_s"$1".json $(($1 - 7)) && rm full_s"$1".json
}

round() {  # name from mode seed lr
  local name=$1 from=$2 mode=$3 seed=$4 lr=$5
  local common=(name="$name" output_dir="$name" load_model_path="$from" train_path=bfs_s"$seed".json val_split=200
                val_generate_limit=200 batch_size=64 log_every=50 save_every_steps=250 num_epochs=1 warmup_steps=0
                schedule=cosine min_lr_ratio=0 lr="$lr" device="$device")
  if [ "$mode" = cot ]; then
    $bin train cot_continue.yaml mode=cot "${common[@]}" >"$name".log 2>&1
  else
    $bin train from_shipped.yaml first_stage=6 max_latent_stage=6 "${common[@]}" >"$name".log 2>&1
  fi || return 1
  $bin eval --model "$name"/final --data "$repo"/data/prosqa/valid.json --out "$name"_valid.jsonl --force >"$name"_eval.log
  $bin eval --model "$name"/final --data select_released_1000.json --out "$name"_sel.jsonl --force >"$name"_sel.log
}

lineage() {  # name: grow, then its rounds, each from the one before
  read -r origin mode after r1 r2 r3 <<<"${lineages[$1]}"
  local from=models/$origin
  if [ "$after" != - ]; then
    $bin expand --model "$from" --after "$after" --out "$1"_0 >"$1"_expand.log 2>&1 || return 1
    from=$1_0
  fi
  round "$1"a "$from" "$mode" "${r1%%:*}" "${r1##*:}" || return 1
  round "$1"b "$1"a/final "$mode" "${r2%%:*}" "${r2##*:}" || return 1
  [ "$r3" = - ] || round "$1"c "$1"b/final "$mode" "${r3%%:*}" "${r3##*:}"
  echo finished >"$1".done
}

score() {  # accuracy from an eval log (the "accuracy" line of its JSON summary)
  grep -m1 '"accuracy"' "$1" | tr -dc '0-9.\n' || echo -
}

case ${1:-} in
  setup)
    gpu_report_smi 2>/dev/null
    gpu_unpack_debs "$deps" "$carried"/debs/*.deb
    mkdir -p models && cp -r "$carried"/models/* models/ && cp "$carried"/*.yaml .
    "$bin" --help >/dev/null || { echo "coconut does not start here"; ldd "$bin" | grep "not found"; exit 1; }
    $bin data --task prosqa --count 1000 --seed 992 --people 4 --names-from "$repo"/data/prosqa/valid.json \
      --out select_released_1000.json --concepts 15 25 --path-steps 3 6 --shape released >/dev/null
    md5sum select_released_1000.json
    for seed in 140 141 142 143 144 145; do graphs "$seed" & done
    wait
    ls -la bfs_s*.json
    ;;
  start)
    for name in "${!lineages[@]}"; do
      setsid "$repo/experiments/gpu_prosqa_grow.sh" lineage "$name" >"$name".out 2>&1 </dev/null &
    done
    sleep 5; ls
    ;;
  lineage) lineage "$2" ;;
  watch)
    end=$((SECONDS + ${2:-60}))
    while [ $SECONDS -lt $end ]; do
      sleep $((end - SECONDS < 60 ? end - SECONDS : 60))
      echo "== $(date +%T)"
      for name in "${!lineages[@]}"; do
        for r in a b c; do
          [ -f "$name$r".log ] && echo "$name$r: $(grep -E '^(stage|epoch|step|validation|done)' "$name$r".log | tail -1 | cut -c1-150)"
        done
      done
      n_done=$(find . -maxdepth 1 -name "*.done" | wc -l)
      [ "$n_done" -eq "${#lineages[@]}" ] && break
    done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null
    ;;
  pack)
    for name in "${!lineages[@]}"; do
      for r in a b c; do
        [ -f "$name$r"_sel.log ] && echo "$name$r released $(score "$name$r"_eval.log) selection $(score "$name$r"_sel.log)"
      done
      newest=""
      for r in a b c; do [ -f "$name$r"/final/model.safetensors ] && newest=$name$r; done
      [ -n "$newest" ] && tar czf "$out/$newest.tgz" "$newest"/final
    done
    tar czf "$out"/logs.tgz ./*.log ./*.out ./*.jsonl 2>/dev/null
    ls -la "$out"
    ;;
  *) sed -n 2,12p "$0"; exit 2 ;;
esac
