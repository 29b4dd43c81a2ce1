#!/usr/bin/env bash
# Trains the ProntoQA / ProsQA latent-reasoning runs on a lent GPU machine, several runs side by
# side on the one GPU (small models are launch-bound: one process leaves the GPU mostly idle).
#   experiments/gpu_train.sh setup           # unpack the carried .deb files; build build-cuda/coconut
#                                            # unless a prebuilt one is carried in .gpubin/coconut
#   experiments/gpu_train.sh start RUN...    # start runs (names below), each in its own session
#   experiments/gpu_train.sh watch SECONDS   # print progress until SECONDS have passed
#   experiments/gpu_train.sh pack            # newest checkpoint (or final) of every run, logs -> $OUT
#   experiments/gpu_train.sh pack-weights RUN...  # their newest weights only (no optimizer), logs -> $OUT
# The .deb files (Debian bookworm's yaml-cpp, nlohmann-json, CLI11, PCRE2, fmt, GoogleTest,
# cpp-httplib, brotli, zlib, OpenSSL headers) sit in .deps/, fetched with `apt-get download`.
# A prebuilt binary (what ran on 2026-11-24: a binary built on the GPU machine itself segfaulted at
# its first checkpoint save, cause not established; this one did not), built here against the same
# PyTorch wheel as the machine's (torch 2.11.0+cu130 from PyPI); a cold build of the coconut
# target takes 268 s on 2 cores:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 torch==2.11.0 -d W && unzip W/torch-*.whl 'torch/*' -d W/x
#   cmake -S . -B build-t211 -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="W/x/torch;W/x/torch/share/cmake" \
#     -DCMAKE_CXX_FLAGS=-DFMT_HEADER_ONLY -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined
#   cmake --build build-t211 --target coconut && mkdir -p .gpubin && cp build-t211/coconut .gpubin/
# (--allow-shlib-undefined: cuDNN, NCCL, NVSHMEM are the wheel's dependencies, absent here; the
# machine has them.) Then carry .deps and .gpubin (both in .git/info/exclude).
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # repo root, deps=/tmp/deps, the gpu_* functions
out=${OUT:-results/gpu_train}
mkdir -p "$out" runs/gpu
if [ -x .gpubin/coconut ]; then bin=.gpubin/coconut; else bin=build-cuda/coconut; fi
gpu_library_path "$deps"
export OMP_NUM_THREADS=2

# name -> config and key=value overrides (no spaces inside one override)
w512='{"hidden_size":512,"intermediate_size":2048,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":8,"max_position_embeddings":512,"rope_theta":10000,"tie_word_embeddings":true}'
w256='{"hidden_size":256,"intermediate_size":1024,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":8,"max_position_embeddings":512,"rope_theta":10000,"tie_word_embeddings":true}'
declare -A runs=(
  [pq_rms]="experiments/gpu_runs/coconut_base.yaml latent_thought_rms=auto"
  [pq_plain]="experiments/gpu_runs/coconut_base.yaml"
  [pq_rms_b128]="experiments/gpu_runs/coconut_base.yaml latent_thought_rms=auto batch_size=128 lr=1.0e-3 epochs_per_stage=3 num_epochs=18"
  [pq_plain_b128]="experiments/gpu_runs/coconut_base.yaml batch_size=128 lr=1.0e-3 epochs_per_stage=3 num_epochs=18"
  [prosqa_cot]="experiments/gpu_runs/prosqa_cot.yaml"
  [prosqa_coconut]="experiments/gpu_runs/prosqa_coconut.yaml"
  [pz]="experiments/gpu_runs/prosqa_latent.yaml"
  [pz_step]="experiments/gpu_runs/prosqa_latent.yaml thought_step_loss=1.0"
  [pz_lr1e3]="experiments/gpu_runs/prosqa_latent.yaml lr=1.0e-3 thought_step_loss=1.0"
  [pz_cot]="experiments/gpu_runs/prosqa_latent.yaml mode=cot"
  [p6_step]='experiments/gpu_runs/prosqa_latent.yaml thought_step_loss=1.0 lr=1.0e-3 model={"hidden_size":256,"intermediate_size":1024,"num_hidden_layers":6,"num_attention_heads":8,"num_key_value_heads":8,"max_position_embeddings":512,"rope_theta":10000,"tie_word_embeddings":true}'
  [pz90]="experiments/gpu_runs/prosqa_latent.yaml train_path=data/prosqa_train90k.json epochs_per_stage=1 num_epochs=7 eval_every_epochs=1"
  [pz90_step]="experiments/gpu_runs/prosqa_latent.yaml train_path=data/prosqa_train90k.json epochs_per_stage=1 num_epochs=7 eval_every_epochs=1 thought_step_loss=1.0"
  [pz90_cot]="experiments/gpu_runs/prosqa_latent.yaml train_path=data/prosqa_train90k.json mode=cot num_epochs=7 eval_every_epochs=1"
  [pz90_cot_hi]="experiments/gpu_runs/prosqa_latent.yaml train_path=data/prosqa_train90k.json mode=cot num_epochs=7 eval_every_epochs=1 lr=1.0e-3"
  [pz90_hi]="experiments/gpu_runs/prosqa_latent.yaml train_path=data/prosqa_train90k.json epochs_per_stage=1 num_epochs=7 eval_every_epochs=1 lr=1.0e-3"
  # Reachable-set supervision (thought_reachable_loss): every thought puts its mass on the nodes
  # within its hop count of the root. All-latent from the first step (first_stage 7 > max 6), or
  # through the curriculum (_cur); widths 768 (Zhu et al.), 512 (shippable in bf16), 256.
  [rz768]="experiments/gpu_runs/prosqa_latent.yaml train_path=data/prosqa_train90k.json first_stage=7 thought_reachable_loss=1.0 latent_thought_rms=auto num_epochs=40 eval_every_epochs=1"
  [rz512]="experiments/gpu_runs/prosqa_latent.yaml train_path=data/prosqa_train90k.json first_stage=7 thought_reachable_loss=1.0 latent_thought_rms=auto num_epochs=40 eval_every_epochs=1 lr=5.0e-4 model=${w512}"
  [rz512_cur]="experiments/gpu_runs/prosqa_latent.yaml train_path=data/prosqa_train90k.json epochs_per_stage=1 thought_reachable_loss=1.0 latent_thought_rms=auto num_epochs=40 eval_every_epochs=1 lr=5.0e-4 model=${w512}"
  [rz256]="experiments/gpu_runs/prosqa_latent.yaml train_path=data/prosqa_train90k.json first_stage=7 thought_reachable_loss=1.0 latent_thought_rms=auto num_epochs=40 eval_every_epochs=1 lr=1.0e-3 model=${w256}"
)

case "${1:-}" in
setup)
  start=$SECONDS
  gpu_unpack_debs "$deps" .deps/*.deb
  gpu_report_torch
  if [ "$bin" = build-cuda/coconut ]; then
    # No pkg-config: the carried .pc files name /usr; CMakeLists finds PCRE2 and cpp-httplib without it.
    # fmt header-only: the torch wheel ships fmt 12 headers that shadow the carried fmt 9.
    cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=native \
      -DPKG_CONFIG_EXECUTABLE=/nonexistent -DCMAKE_CXX_FLAGS=-DFMT_HEADER_ONLY \
      -DCMAKE_PREFIX_PATH="$(gpu_cmake_prefix "$deps")" >"$out/configure.log" 2>&1 \
      || { tail -30 "$out/configure.log"; exit 1; }
    cmake --build build-cuda -j "$(nproc)" --target coconut >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 1; }
    echo "build: $((SECONDS - start)) s"
  fi
  ldd "$bin" | grep "not found"
  [ -f data/prosqa_train.json ] ||
    $bin data --task prosqa --count 18000 --seed 0 --names-from data/prosqa/valid.json --out data/prosqa_train.json
  # Five times the data, for the runs that overfit 18,000 questions (pz90*).
  [ -f data/prosqa_train90k.json ] ||
    $bin data --task prosqa --count 90000 --seed 1 --names-from data/prosqa/valid.json --out data/prosqa_train90k.json
  ;;
start)
  shift
  for name in "$@"; do
    read -r -a spec <<<"${runs[$name]}"
    resume=()
    [ -f "runs/gpu/$name/last_checkpoint" ] && resume=(resume=true)
    setsid nohup $bin train "${spec[0]}" name="$name" output_dir="runs/gpu/$name" "${spec[@]:1}" "${resume[@]}" \
      >>"runs/gpu/$name.log" 2>&1 </dev/null &
  done
  sleep 30
  tail -n 2 runs/gpu/*.log
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
  ;;
watch)
  until_s=${2:-540}
  while ((SECONDS < until_s)); do
    sleep 45
    echo "== ${SECONDS}s $(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader)"
    for log in runs/gpu/*.log; do echo "$log: $(grep -E "validation|rror|done|Segm" "$log" | tail -n 1)"; done
  done
  ;;
pack-weights)
  # The newest weights (no optimizer state) of the named runs, one archive each, split into 15 MB
  # parts: enough to evaluate, or to continue with load_model_path and a fresh optimizer.
  shift
  for name in "$@"; do
    dir=runs/gpu/$name
    pick=final
    [ -d "$dir/final" ] || pick=$(cat "$dir/last_checkpoint" 2>/dev/null)
    [ -n "$pick" ] && [ -d "$dir/$pick" ] || continue
    tar czf - -C runs/gpu --exclude=optimizer.pt "$name/$pick" "$name/metrics.jsonl" "$name/train_config.json" |
      split -b 15M - "$out/$name.weights.tgz.part-"
  done
  tar czf "$out/logs.tgz" runs/gpu/*.log runs/gpu/*/metrics.jsonl
  ls -la "$out"
  ;;
pack)
  # One archive per run, split into 15 MB parts (the device returns files of up to 16 MB).
  for dir in runs/gpu/*/; do
    name=$(basename "$dir")
    pick=final
    [ -d "$dir/final" ] || pick=$(cat "$dir/last_checkpoint" 2>/dev/null)
    [ -n "$pick" ] && [ -d "$dir/$pick" ] || continue
    tar czf - -C runs/gpu "$name/$pick" "$name/last_checkpoint" "$name/metrics.jsonl" "$name/train_config.json" 2>/dev/null |
      split -b 15M - "$out/$name.tgz.part-"
  done
  tar czf "$out/logs.tgz" runs/gpu/*.log runs/gpu/*/metrics.jsonl
  ls -la "$out"
  ;;
*)
  sed -n 2,12p "$0"
  exit 2
  ;;
esac
