#!/usr/bin/env bash
# Coconut on SmolLM2-135M-Instruct on a lent GPU machine (docs/smollm2-coconut.md): the runs of
# configs/smollm2/ as a queue of short jobs, each one epoch or one curriculum stage, each starting
# from the adapter of the job before it (init_adapter), so whatever a 15-minute lease finishes is
# kept and the next lease goes on from there. What comes back is adapters, logs and evaluations.
#
# The device reaches nothing outside, and a call carries at most 64 MiB of working tree plus carried
# paths; the tracked tree is larger (models/, test fixtures), and the base alone is 98 MB. So:
#   here:   experiments/gpu_smollm2.sh prepare    # .device/: payload (the binary built here, the
#                                                 # Debian libraries it needs that the device lacks,
#                                                 # the base GGUF, the adapters the queue continues
#                                                 # from) cut into chunks that fit beside the slim tree
#           experiments/gpu_smollm2.sh slim       # removes every tracked file the device does not
#                                                 # read (refuses a dirty tree; `restore` brings them back);
#                                                 # `slim PATH...` keeps those paths instead (other GPU scripts)
#   device: one call per chunk, back to back (a warm machine keeps ignored files about 30 s):
#             carry [".device/chunk.K"], command "experiments/gpu_smollm2.sh device-receive K"
#           and with the last chunk:
#             command "experiments/gpu_smollm2.sh device-receive N && experiments/gpu_smollm2.sh device-train 420"
#           (420: seconds of training before packing; the call's timeout 600 leaves time to pack;
#           the ProntoQA and ProsQA chains run side by side, one process each)
#           a chunk may also run "experiments/gpu_smollm2.sh device-measure" (issue 57's GPU targets)
#           where the reply says more parts wait: "experiments/gpu_smollm2.sh device-send 1" at once
#   here:   experiments/gpu_smollm2.sh restore    # the tracked files back (git checkout)
#           experiments/gpu_smollm2.sh collect DIR...  # unpack what came back (each reply's files_at)
#                                                 # into results/smollm2/<job>/
#   here:   experiments/gpu_smollm2.sh dry-run    # all of it on this CPU with tiny limits: prepare,
#                                                 # receive, train, pack, collect (no slimming)
# The binary is build/coconut, built here against libtorch 2.11's CUDA 13 wheel, which is the device's
# python3 torch (2.11.0+cu130): its libraries are the device's own.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
device_dir=.device                  # ignored (.gitignore); carried
results=results/smollm2             # one folder per finished job (adapter/, metrics.jsonl, train.log, eval.json)
payload_limit=$((64 * 1024 * 1024))
margin=$((2 * 1024 * 1024))         # headroom under the limit (file-system rounding, the chunk's own name)
gguf=.models/smollm2-135m.gguf

# The paths the device reads; every other tracked file is left behind by `slim`.
slim_keep=(experiments/gpu_smollm2.sh experiments/pick_micro_batch.py experiments/gpu_setup.sh bench/train_step_eager.py configs/smollm2 data/prontoqa data/prosqa/valid.json data/gsm8k .gitignore)

# The queue, in order: job | config | overrides | the job whose adapter it starts from ("-": none).
# ProntoQA first (shorter sequences), then ProsQA, then the baselines that need no curriculum, then
# pause-as-thought. One curriculum stage per job: the paper resets the optimizer at every stage, so
# chaining stages through adapters loses nothing.
queue() {
  local task
  for task in prontoqa prosqa; do
    echo "$(prefix "$task")_cot|configs/smollm2/${task}_cot.yaml||-"
    stages "$task" coconut
  done
  # Full fine-tuning against LoRA on ProntoQA CoT (lane pf, beside the chains): the same config and
  # schedule at the paper's learning rate for full fine-tuning; its validations at epochs 2, 4, 6
  # are compared with pq_cot's in docs/smollm2-coconut.md. No adapter: nothing continues from it.
  echo "pf_cotfull|configs/smollm2/prontoqa_cot.yaml|lora_rank=0 lr=1.0e-4|-"
  # Full fine-tuning won (99.5% against LoRA's 79.5%, 2026-11-28): the CoT baseline again, shipped
  # as a rank-16 adapter by extract-adapter on the device (both evaluated: what the extraction
  # costs), in micro-batches of 64 to share the GPU's memory with the chains.
  echo "pf_cotfull_ship|configs/smollm2/prontoqa_cot.yaml|lora_rank=0 lr=1.0e-4 batch_size=64 gradient_accumulation_steps=2|-"
  for task in prontoqa prosqa; do echo "$(prefix "$task")_nocot|configs/smollm2/${task}_nocot.yaml||-"; done
  for task in prontoqa prosqa; do stages "$task" pause; done
  # Issue 54 on the finished curriculum: the ProntoQA stage-6 adapter healed on every training
  # question to run without its least needed layers (docs/adaptive-depth.md, "On the pretrained model").
  echo "pq_anydepth|configs/smollm2/prontoqa_coconut_anydepth.yaml|first_stage=6 train_limit=0|pq_coconut_s6"
  # GSM8K (data/gsm8k/train.json, the 6,973 training problems that reach us), in the lane of the
  # full fine-tunes once those are done (lane "pf+gk"): CoT, then the paper's curriculum, c = 2,
  # three epochs per stage; stage 4 is the last layout (every step latent, 6 thoughts), 6 epochs.
  echo "gk_cot|configs/smollm2/gsm8k_cot.yaml||-"
  local stage previous=gk_cot
  for stage in 1 2 3; do
    echo "gk_coconut_s$stage|configs/smollm2/gsm8k_coconut.yaml|first_stage=$stage num_epochs=3 eval_every_epochs=3|$previous"
    previous=gk_coconut_s$stage
  done
  echo "gk_coconut_s4|configs/smollm2/gsm8k_coconut.yaml|first_stage=4 num_epochs=6 eval_every_epochs=3|$previous"
}
prefix() { [ "$1" = prosqa ] && echo pz || echo pq; }
# The validation set of JOB's task, by its prefix.
validation_of() {
  case "$1" in
  pz_*) echo data/prosqa/valid.json ;;
  gk_*) echo data/gsm8k/valid.json ;;
  *) echo data/prontoqa/valid.json ;;
  esac
}
# The jobs earlier leases finished, tracked (results/ is not: a fresh clone has none of it): a line
# "JOB ADAPTER" each, ADAPTER the shipped folder the queue continues from, or "-" (nothing continues
# from the job). `collect` does not write it: what a lease brought back is entered by hand once its
# adapters are shipped. The dry run reads none.
ledger=${SMOLLM2_LEDGER-configs/smollm2/finished_jobs.txt}
ledger_entry() { [ -n "$ledger" ] && [ -f "$ledger" ] && awk -v j="$1" '$1 == j {print $2; found = 1} END {exit !found}' "$ledger"; }
# A job is finished when its adapter came back (or, without one, its done mark), or the ledger has it.
finished() { [ -d "$results/$1/adapter" ] || [ -f "$results/$1/done" ] || ledger_entry "$1" >/dev/null; }
# The adapter JOB's successors start from: the one that came back, else the shipped one; empty if none.
adapter_of() {
  local shipped
  if [ -d "$results/$1/adapter" ]; then echo "$results/$1/adapter"
  elif shipped=$(ledger_entry "$1") && [ "$shipped" != - ] && [ -d "$shipped" ]; then echo "$shipped"
  fi
}
# stages TASK MODE: the six one-stage jobs of MODE's curriculum (the paper's 5 epochs each, the
# optimizer reset), the first from TASK's CoT job.
stages() {
  local p stage previous
  p=$(prefix "$1")
  previous=${p}_cot
  for stage in 1 2 3 4 5 6; do
    echo "${p}_$2_s$stage|configs/smollm2/$1_$2.yaml|first_stage=$stage num_epochs=5 eval_every_epochs=5|$previous"
    previous=${p}_$2_s$stage
  done
}

# The ProsQA training set in the released shape (the shipped from-scratch models' generator; the
# paper's 17,886 questions; a seed no other set uses).
make_prosqa_train() {
  local bin=$1 count=${2:-17886}
  [ -f data/prosqa_train_smollm2.json ] && return
  "$bin" data --task prosqa --count "$count" --seed 2055 --people 4 --names-from data/prosqa/valid.json \
    --concepts 15 25 --path-steps 3 6 --shape released --out data/prosqa_train_smollm2.json >/dev/null
}

tracked_slim_bytes() {
  git ls-files -z -- "${slim_keep[@]}" | xargs -0 stat -c %s | awk '{s += $1} END {print s + 0}'
}

# The jobs whose adapters a device run continues from: for each chain, the last finished job.
needed_adapters() {
  local job config overrides from
  while IFS='|' read -r job config overrides from; do
    finished "$job" && continue                          # nothing to do
    [ "$from" = - ] && continue
    [ -n "$(adapter_of "$from")" ] && echo "$from"
  done < <(queue) | sort -u
}

prepare() {
  local work=$device_dir/work
  [ -f "$gguf" ] || { echo "gpu_smollm2: $gguf missing: run ./run fetch-model smollm2-135m" >&2; exit 1; }
  [ -x build/coconut ] || { echo "gpu_smollm2: build/coconut missing: run ./run build" >&2; exit 1; }
  rm -rf "$device_dir"
  mkdir -p "$work/lib" "$work/adapters"
  cp build/coconut "$work/coconut"
  # The benchmarks of issue 57's GPU targets ride along (device-measure runs them from chunk 0).
  local bench
  for bench in bench_train bench_model bench_linear test_gpu; do [ -x build/$bench ] && cp build/$bench "$work/$bench"; done
  # Debian's libraries the binary links that the device image (Ubuntu, CUDA, PyTorch) lacks.
  local lib
  for lib in libyaml-cpp.so.0.7 libcpp-httplib.so.0.11 libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1 libpcre2-8.so.0; do
    cp -L "$(ldd build/coconut | awk -v l="$lib" '$1 == l {print $3}')" "$work/lib/$lib"
  done
  cp "$gguf" "$work/smollm2-135m.gguf"
  sha256sum "$work/smollm2-135m.gguf" | awk '{print $1}' >"$work/smollm2-135m.gguf.sha256"
  local job
  for job in $(needed_adapters); do
    mkdir -p "$work/adapters/$job"
    cp -r "$(adapter_of "$job")" "$work/adapters/$job/adapter"
  done
  # One tar, cut into chunks that fit beside the slim tree.
  local tree chunk
  tree=$(tracked_slim_bytes)
  chunk=$((payload_limit - tree - margin))
  # Binaries and libraries first: chunk 0 alone unpacks them (device-measure), the base comes last.
  (cd "$work" && tar cf - $(ls -d coconut bench_train bench_model bench_linear test_gpu lib smollm2-135m.gguf.sha256 adapters 2>/dev/null) smollm2-135m.gguf) | split -b "$chunk" -d -a 1 - "$device_dir/chunk."
  rm -rf "$work"
  local count
  count=$(find "$device_dir" -name 'chunk.*' | wc -l)
  echo "gpu_smollm2: slim tree $((tree / 1024)) KiB; $count chunks of at most $((chunk / 1024 / 1024)) MiB in $device_dir:"
  ls -l "$device_dir"
  echo "adapters carried: $(needed_adapters | tr '\n' ' ')"
  echo "device calls, back to back: carry [\"$device_dir/chunk.K\"], command \"experiments/gpu_smollm2.sh device-receive K\" for K = 0..$((count - 1)),"
  echo "the last one followed by \"&& experiments/gpu_smollm2.sh device-train 420\" (timeout_s 600)"
}

slim() {
  [ $# -gt 0 ] && slim_keep=("$@" experiments/gpu_smollm2.sh)
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "gpu_smollm2: the tree has uncommitted changes; commit them first (slim removes tracked files, restore checks them out)" >&2
    exit 1
  fi
  local keep_pattern
  keep_pattern=$(printf '%s\n' "${slim_keep[@]}")
  git ls-files -z | while IFS= read -r -d '' file; do
    local kept=0 path
    while IFS= read -r path; do
      case "$file" in "$path" | "$path"/*) kept=1 ;; esac
    done <<<"$keep_pattern"
    [ $kept = 1 ] || rm -f -- "$file"
  done
  find . -path ./.git -prune -o -type d -empty -delete 2>/dev/null || true
  echo "gpu_smollm2: slim tree $(($(tracked_slim_bytes) / 1024)) KiB; 'experiments/gpu_smollm2.sh restore' (or git checkout -- .) brings the rest back"
}

restore() {
  git checkout -- .
  echo "gpu_smollm2: tracked files restored"
}

# On the device: chunk K is appended to the payload outside the repository (kept while warm).
device_receive() {
  local k=$1 store=${SMOLLM2_STORE:-/tmp/smollm2}
  mkdir -p "$store"
  [ "$k" = 0 ] && rm -f "$store/payload.tar"
  cat "$device_dir/chunk.$k" >>"$store/payload.tar"
  echo "gpu_smollm2: chunk $k received ($(stat -c %s "$store/payload.tar") bytes so far)"
}

# On the device: unpack, check, import the base, run the queue for `budget` seconds, pack into $OUT.
device_train() {
  local budget=${1:-420} store=${SMOLLM2_STORE:-/tmp/smollm2} device=${SMOLLM2_DEVICE:-cuda}
  local started=$SECONDS out=${OUT:?OUT (where results go back) is not set}
  mkdir -p "$store/unpacked"
  tar xf "$store/payload.tar" -C "$store/unpacked"
  local bin=$store/unpacked/coconut
  (cd "$store/unpacked" && echo "$(cat smollm2-135m.gguf.sha256)  smollm2-135m.gguf" | sha256sum --check --quiet) ||
    { echo "gpu_smollm2: the base arrived damaged (sha256 differs)" >&2; exit 1; }
  if [ "$device" != cpu ]; then
    local torch_lib nvidia_libs
    torch_lib=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')/lib
    nvidia_libs=$(python3 -c 'import glob, os, torch; s = os.path.dirname(os.path.dirname(torch.__file__)); print(":".join(sorted(glob.glob(s + "/nvidia/*/lib"))))')
    export LD_LIBRARY_PATH="$store/unpacked/lib:$torch_lib:$nvidia_libs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    # The GPU's use and memory every 10 s, back with the results (what sizes the next lease's batches).
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 10 >"$out/smi.csv" 2>&1 &
    # Three processes share the memory: segments that grow leave less of it reserved and unused.
    export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
  else
    export LD_LIBRARY_PATH="$store/unpacked/lib:${LD_LIBRARY_PATH:-}"
  fi
  local base=${SMOLLM2_BASE:-.models/smollm2-135m}
  "$bin" import-gguf "$store/unpacked/smollm2-135m.gguf" --out "$base" --force >"$out/import.log" 2>&1
  echo "gpu_smollm2: setup took $((SECONDS - started)) s (unpack, check, import)" | tee -a "$out/import.log"
  # The step's new paths run on this GPU before a job compares them (test_gpu's Cuda.StepPaths*):
  # where they fail, or where the test is missing, every job trains on the old paths alone.
  if [ "$device" != cpu ]; then
    if [ -x "$store/unpacked/test_gpu" ] &&
      timeout 120 "$store/unpacked/test_gpu" --gtest_filter='Cuda.StepPaths*' >"$out/step_paths_test.log" 2>&1 &&
      grep -q '\[  PASSED  \] 1 test' "$out/step_paths_test.log"; then
      echo "gpu_smollm2: the step's new paths passed on this GPU; each lane's first job compares them"
    else
      export SMOLLM2_COMPARE_PATHS=0
      echo "gpu_smollm2: the step's new paths did not pass on this GPU (step_paths_test.log); nothing compared"
    fi
  fi
  make_prosqa_train "$bin" "${SMOLLM2_PROSQA_COUNT:-17886}"
  # Adapters carried in are finished jobs of earlier leases.
  mkdir -p "$results"
  local job
  for job in $(ls "$store/unpacked/adapters" 2>/dev/null); do
    mkdir -p "$results/$job" && cp -r "$store/unpacked/adapters/$job/adapter" "$results/$job/"
  done
  # The two tasks' chains are independent: each runs in its own process on the one GPU, where a
  # 135M model's passes are launch-bound and two processes interleave (SMOLLM2_LANES: the lanes,
  # by job prefix, "A+B" one lane for two prefixes, A's jobs first; "pq pz pf+gk" by default).
  local deadline=$(($(date +%s) + budget - (SECONDS - started))) lane lanes=(${SMOLLM2_LANES:-pq pz pf+gk})
  rm -f "$store"/lane_*.finished "$store"/lane_*.failed
  # The cores shared between the lanes (each process would otherwise take them all).
  local threads=$(($(nproc) / ${#lanes[@]}))
  for lane in "${lanes[@]}"; do
    SMOLLM2_LANE_COUNT=${#lanes[@]} OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((threads > 0 ? threads : 1))} \
      run_lane "$lane" "$deadline" "$bin" "$base" "$device" "$store" >"$store/lane_$lane.log" 2>&1 &
  done
  wait
  cat "$store"/lane_*.log
  pack "$out" "$(cat "$store"/lane_*.finished 2>/dev/null | tr '\n' ' ')" "$(cat "$store"/lane_*.failed 2>/dev/null | tr '\n' ' ')"
  [ "$device" != cpu ] && pkill -f "nvidia-smi --query-gpu=timestamp" || true
  echo "gpu_smollm2: device-train took $((SECONDS - started)) s"
}

# One lane of the queue (the jobs named LANE_*, or A_* then B_* for a lane A+B) until DEADLINE (epoch seconds): each job whose
# predecessor has finished, one after another; the names of finished and failed jobs go to
# STORE/lane_LANE.finished and .failed.
run_lane() {
  local lane=$1 deadline=$2 bin=$3 base=$4 device=$5 store=$6
  local job config overrides from prefix first=1
  for prefix in ${lane//+/ }; do
    while IFS='|' read -r job config overrides from; do
      [[ "$job" == "${prefix}"_* ]] || continue
      finished "$job" && continue
      if [ "$from" != - ] && [ -z "$(adapter_of "$from")" ]; then continue; fi
      local left=$((deadline - $(date +%s)))
      [ "$left" -lt 30 ] && { echo "gpu_smollm2: $left s left; stopping before $job"; return; }
      local init=""
      [ "$from" != - ] && init="init_adapter=$(adapter_of "$from")"
      mkdir -p "$results/$job"
      # The micro-batch that fits the lane's share of the GPU's memory (the schedule's batch kept).
      local micro
      micro=$(micro_batch "$job" "$config" "$overrides" "$bin" "$base")
      # The lane's first job measures the step's new paths against the old ones in its own first
      # steps (TrainConfig::compare_paths: about 20 steps, under 30 s), then trains as configured.
      local compare=""
      [ "$first" = 1 ] && [ "${SMOLLM2_COMPARE_PATHS:-4}" -gt 0 ] && compare="compare_paths=${SMOLLM2_COMPARE_PATHS:-4}"
      first=0
      echo "gpu_smollm2: $job ($config $overrides $micro $compare${init:+ $init}), $left s left"
      # shellcheck disable=SC2086  # overrides are key=value words
      local runs=${SMOLLM2_RUNS:-runs}
      if timeout "$left" "$bin" train "$config" $overrides $micro $compare $init load_model_path="$base" device="$device" output_dir="$runs/$job" \
          ${SMOLLM2_LIMITS:-} </dev/null >"$results/$job/train.log" 2>&1; then
        # A full fine-tune has no adapter; it is marked finished instead.
        if [ -d "$runs/$job/final/adapter" ]; then cp -r "$runs/$job/final/adapter" "$results/$job/adapter"; else touch "$results/$job/done"; fi
        # A full fine-tune to ship: its rank-16 adapter (embedding rows that moved by more than 5% whole).
        if [[ "$job" == *_ship ]]; then
          "$bin" extract-adapter --model "$runs/$job/final" --base "$base" --rank 16 --row-tolerance 0.05 \
            --out "$results/$job/adapter" </dev/null >"$results/$job/extract.log" 2>&1 || echo "gpu_smollm2: $job's extraction failed"
        fi
        cp "$runs/$job/metrics.jsonl" "$results/$job/"
        echo "$job" >>"$store/lane_$lane.finished"
        grep '"event":"validation"' "$results/$job/metrics.jsonl" | tail -1 || true
        # A chain's last job: accuracy, tokens, thoughts, FLOPs and latency per answer on the validation set.
        case "$job" in
        *_cot | *_nocot | *_s6 | gk_coconut_s4 | *_anydepth)
          evaluate_job "$deadline" "$bin" "$device" "$(validation_of "$job")" "$results/$job/eval.json" "$results/$job/eval.log" "$job's evaluation" \
            --model "$base" --adapter "$results/$job/adapter"
          ;;
        *_ship)  # the extracted adapter and the full model it came from
          if [ -d "$results/$job/adapter" ]; then
            evaluate_job "$deadline" "$bin" "$device" data/prontoqa/valid.json "$results/$job/eval.json" "$results/$job/eval.log" \
              "$job's evaluation" --model "$base" --adapter "$results/$job/adapter"
          fi
          evaluate_job "$deadline" "$bin" "$device" data/prontoqa/valid.json "$results/$job/eval_full.json" "$results/$job/eval.log" \
            "$job's full evaluation" --model "$runs/$job/final"
          ;;
        esac
      else
        echo "gpu_smollm2: $job did not finish (its log comes back; it starts again next time)"
        tail -3 "$results/$job/train.log"
        echo "$job" >>"$store/lane_$lane.failed"
        return
      fi
    done < <(queue)
  done
}

# A job's kind in configs/smollm2/memory_measured.txt: what the last lease measured for it, or
# the nearest larger one measured (LoRA's CoT keeps about what a full fine-tune's does; ProsQA's
# thought stages less than its CoT); GSM8K has none yet.
memory_kind() {
  case "$1" in
  pf_* | pq_cot | pq_nocot) echo prontoqa_cot_full ;;
  pq_*) echo prontoqa_thoughts_lora ;;
  pz_*) echo prosqa_cot_lora ;;
  *) echo none ;;
  esac
}
# The value of KEY for a job: its overrides', else its config's, else DEFAULT.
job_setting() {
  local key=$1 config=$2 overrides=$3 default=$4 value
  value=$(tr ' ' '\n' <<<"$overrides" | sed -n "s/^$key=//p" | tail -1)
  [ -z "$value" ] && value=$(sed -n "s/^$key: *\([0-9]*\).*/\1/p" "$config" | tail -1)
  echo "${value:-$default}"
}
# "batch_size=M gradient_accumulation_steps=A" for JOB: its effective batch in micro-batches that
# fit the lane's share of the GPU's memory (SMOLLM2_MEMORY_MIB, else the GPU's, over the lanes),
# by experiments/pick_micro_batch.py; nothing where no share is known (the CPU) or nothing changes.
micro_batch() {
  local job=$1 config=$2 overrides=$3 bin=$4 base=$5 total=${SMOLLM2_MEMORY_MIB:-}
  if [ -z "$total" ] && command -v nvidia-smi >/dev/null; then
    total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -d ' ')
  fi
  [ -n "$total" ] || return 0
  local batch accumulation picked
  batch=$(job_setting batch_size "$config" "$overrides" 16)
  accumulation=$(job_setting gradient_accumulation_steps "$config" "$overrides" 1)
  # 90% of the memory shared by the lanes (the CUDA context, the smi poller, fragmentation).
  picked=$(python3 experiments/pick_micro_batch.py --coconut "$bin" --model "$base" --measured configs/smollm2/memory_measured.txt \
    --kind "$(memory_kind "$job")" --batch $((batch * accumulation)) --share-mib $((total * 9 / 10 / ${SMOLLM2_LANE_COUNT:-1}))) || return 0
  set -- $picked
  [ "$1" = "$batch" ] && [ "$2" = "$accumulation" ] && return 0
  echo "batch_size=$1 gradient_accumulation_steps=$2"
}

# `coconut eval` of the model the arguments after WHAT name, on DATA, into SUMMARY (its stderr
# appended to LOG), where more than 30 s are left before DEADLINE (epoch seconds); says so when it
# does not finish.
evaluate_job() {
  local deadline=$1 bin=$2 device=$3 data=$4 summary=$5 log=$6 what=$7
  shift 7
  local left=$((deadline - $(date +%s)))
  [ "$left" -gt 30 ] && timeout "$left" "$bin" eval "$@" --data "$data" --device "$device" --dtype bfloat16 --batch-size 256 \
    --max-new-tokens 160 ${SMOLLM2_EVAL_LIMITS:-} --summary "$summary" </dev/null >/dev/null 2>>"$log" ||
    echo "gpu_smollm2: $what did not finish"
}

# On the device, after chunk 0: the GPU targets of issue 57 from the binaries at the head of the
# payload (a partial tar unpacks the members it holds whole), each command under its own timeout.
device_measure() {
  local store=${SMOLLM2_STORE:-/tmp/smollm2} out=${OUT:?OUT (where results go back) is not set}
  local dir=$store/measure
  mkdir -p "$dir"
  tar xf "$store/payload.tar" -C "$dir" coconut bench_train bench_model bench_linear lib 2>/dev/null || true
  local torch_lib nvidia_libs
  torch_lib=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')/lib
  nvidia_libs=$(python3 -c 'import glob, os, torch; s = os.path.dirname(os.path.dirname(torch.__file__)); print(":".join(sorted(glob.glob(s + "/nvidia/*/lib"))))')
  export LD_LIBRARY_PATH="$dir/lib:$torch_lib:$nvidia_libs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
    local one_b=(--only llama-3.2-1B --batch 8 --length 1024 --question 512)
    timeout 60 "$dir"/bench_model --device cuda --only llama-3.2-1B --prompt 1024 --decode 512 --fixed-cache
    timeout 60 "$dir"/bench_model --device cuda --only llama-3.2-1B --prompt 1024 --decode 512 --cuda-graph
    timeout 100 "$dir"/bench_train --device cuda --bf16 "${one_b[@]}" --latents 6 --repeats 4
    timeout 80 python3 bench/train_step_eager.py --device cuda --bf16 "${one_b[@]}" --repeats 4 --sdpa --latents 6
    timeout 40 "$dir"/bench_train --device cuda --bf16 --only 1M 25M --latents 6 --repeats 10
    # The host's CPU (an Intel one is where MKL beats the tiles): the measured choice between tiles
    # and BLAS against a longer measurement, and the float32 training step against eager, 2 threads.
    grep -m1 'model name' /proc/cpuinfo
    timeout 30 "$dir"/bench_linear --choice-only --threads 2 --repeats 5 | tail -n 1
    COCONUT_CACHE_DIR=$dir/cache OMP_NUM_THREADS=2 timeout 40 "$dir"/bench_train --only 1M 25M --latents 6 --repeats 3
    timeout 40 python3 bench/train_step_eager.py --threads 2 --only 1M 25M --latents 6 --repeats 3
  } 2>&1 | tee "$out/measure.log"
}

# Into $OUT: a tar of the jobs' logs and evaluations, finished ($2) or not ($3), with the adapters
# of the finished jobs that end a chain or are shipped (CoT, no-CoT and stage-6 models; earlier
# stages are not needed to go on), cut into at most 4 files of 15 MiB (3 adapters of 19.5 MB).
# Paths inside are relative to $results.
pack() {
  local out=$1 finished=$2 failed=$3
  local job file keep=() parts_dir=${SMOLLM2_STORE:-/tmp/smollm2}/parts
  for job in $finished $failed; do
    for file in train.log metrics.jsonl eval.json eval_full.json eval.log extract.log done; do [ -f "$results/$job/$file" ] && keep+=("$job/$file"); done
  done
  # shellcheck disable=SC2086
  for job in $( (last_of_chains $finished; printf '%s\n' $finished | grep -E '_(cot|nocot|s6)$') | sort -u); do
    [ -d "$results/$job/adapter" ] && keep+=("$job/adapter")
  done
  [ ${#keep[@]} -gt 0 ] || { echo "gpu_smollm2: nothing finished"; return; }
  rm -rf "$parts_dir" && mkdir -p "$parts_dir"
  tar cf - -C "$results" "${keep[@]}" | split -b $((15 * 1024 * 1024)) -d -a 2 - "$parts_dir/results.tar."
  send_parts 0 "$out"
}

# Parts 4K .. 4K+3 of the packed results into OUT (a reply brings back at most 4 of 15 MiB). While
# the machine is warm, `device-send K` in the next call brings the next four.
send_parts() {
  local k=$1 out=$2 parts_dir=${SMOLLM2_STORE:-/tmp/smollm2}/parts part index=0 total
  total=$(find "$parts_dir" -name 'results.tar.*' 2>/dev/null | wc -l)
  for part in $(ls "$parts_dir"/results.tar.* 2>/dev/null); do
    [ $((index / 4)) = "$k" ] && cp "$part" "$out/"
    index=$((index + 1))
  done
  ls -l "$out"
  if [ "$total" -gt $((4 * (k + 1))) ]; then
    echo "gpu_smollm2: $total parts; the next four come with \"experiments/gpu_smollm2.sh device-send $((k + 1))\" (while warm)"
  fi
}

# The jobs among $@ that no other job among $@ continues from.
last_of_chains() {
  local job config overrides from continued=" "
  while IFS='|' read -r job config overrides from; do
    [[ " $* " == *" $job "* ]] && [ "$from" != - ] && continued+="$from "
  done < <(queue)
  for job in "$@"; do [[ "$continued" == *" $job "* ]] || echo "$job"; done
}

collect() {  # DIR...: the folders the parts came back to, in any order
  mkdir -p "$results"
  local dir
  for dir in "$@"; do ls "$dir"/results.tar.*; done | awk -F/ '{print $NF "\t" $0}' | sort | cut -f2 | xargs cat | tar xf - -C "$results"
  echo "gpu_smollm2: collected into $results: $(ls "$results" | tr '\n' ' ')"
}

dry_run() {
  local scratch
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' RETURN
  local saved_results=$results
  results=$scratch/results
  ledger=""  # the whole queue, as on a first lease
  prepare
  local k
  for k in $(ls "$device_dir" | sed -n 's/^chunk\.//p' | sort -n); do SMOLLM2_STORE=$scratch/store device_receive "$k"; done
  mkdir -p "$scratch/out"
  local made_prosqa=0
  [ -f data/prosqa_train_smollm2.json ] || made_prosqa=1
  # A GPU of 80 GB, so that the micro-batches are picked as on a lease (the limits' batch_size wins).
  SMOLLM2_MEMORY_MIB=${SMOLLM2_MEMORY_MIB:-80000} \
  SMOLLM2_BASE=$scratch/base SMOLLM2_STORE=$scratch/store SMOLLM2_DEVICE=cpu SMOLLM2_PROSQA_COUNT=64 SMOLLM2_RUNS=$scratch/runs OUT=$scratch/out \
    SMOLLM2_LIMITS="num_epochs=2 train_limit=8 val_limit=4 val_generate_limit=4 max_new_tokens=16 batch_size=4 eval_batch_size=4 log_every=1" \
    SMOLLM2_EVAL_LIMITS="--limit 4" device_train "${1:-240}"
  results=$scratch/collected
  local sends=("$scratch/out") k=1
  while [ "$(find "$scratch/store/parts" -name 'results.tar.*' | wc -l)" -gt $((4 * k)) ]; do
    mkdir -p "$scratch/out$k" && SMOLLM2_STORE=$scratch/store send_parts "$k" "$scratch/out$k" >/dev/null
    sends+=("$scratch/out$k") && k=$((k + 1))
  done
  collect "${sends[@]}"
  echo "gpu_smollm2: dry run collected: $(cd "$results" && find . -name adapter_config.json -o -name eval.json | sort | tr '\n' ' ')"
  results=$saved_results
  rm -rf "$device_dir"
  [ $made_prosqa = 1 ] && rm -f data/prosqa_train_smollm2.json
  return 0
}

case "${1:-}" in
prepare) prepare ;;
slim) shift; slim "$@" ;;
restore) restore ;;
device-receive) device_receive "${2:?chunk number}" ;;
device-train) device_train "${2:-420}" ;;
device-measure) device_measure ;;
device-send) send_parts "${2:?which four parts: 1 for parts 4-7, ...}" "${OUT:?OUT (where results go back) is not set}" ;;
collect) shift; collect "${@:?the folders the files came back to}" ;;
dry-run) dry_run "${2:-240}" ;;
queue) queue ;;
*) sed -n '2,29p' "$0"; exit 2 ;;
esac
