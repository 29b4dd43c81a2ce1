#!/usr/bin/env bash
# The setup the GPU scripts share (gpu.sh, gpu_measure.sh, gpu_train.sh, gpu_prosqa_grow.sh source
# it; it runs nothing by itself). It goes to the repository root and defines:
#   repo                           the repository root (the working directory after sourcing)
#   deps                           /tmp/deps, where gpu_train.sh and gpu_prosqa_grow.sh unpack the
#                                  Debian packages they carry
#   gpu_unpack_debs DIR DEB...     unpack .deb files (dpkg -x) under DIR: yaml-cpp, nlohmann-json,
#                                  CLI11, PCRE2, fmt, ... where apt cannot install them
#   gpu_library_path [DIR]         export LD_LIBRARY_PATH: DIR's unpacked libraries (when DIR is
#                                  given), python3's torch/lib, /usr/local/cuda/lib64, then the old value
#   gpu_cmake_prefix [DIR]         print the CMAKE_PREFIX_PATH that builds against python3's torch,
#                                  followed by DIR's packages (when DIR is given)
#   gpu_report_torch               print torch's version, its CUDA version and GPU 0's name
#   gpu_report_smi                 print the GPU's name, memory, driver and highest SM clock
# Usage, at the top of a script in experiments/, after its `set` line:
#   source "$(dirname "$0")/gpu_setup.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
repo=$PWD
deps=/tmp/deps

gpu_unpack_debs() {
  local dir=$1 deb
  shift
  mkdir -p "$dir"
  for deb in "$@"; do dpkg -x "$deb" "$dir"; done
}

gpu_library_path() {
  local torch_lib
  torch_lib=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)/lib
  export LD_LIBRARY_PATH="${1:+$1/usr/lib/x86_64-linux-gnu:}$torch_lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
}

gpu_cmake_prefix() {
  local torch_prefix
  torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
  echo "$torch_prefix${1:+;$1/usr;$1/usr/lib/x86_64-linux-gnu/cmake}"
}

gpu_report_torch() {
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
}

gpu_report_smi() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
}
