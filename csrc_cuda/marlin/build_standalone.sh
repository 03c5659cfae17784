#!/usr/bin/env bash
# Standalone build of the marlin kernels into a test library (for development before/without the
# shared CMake project): build_standalone.sh OUT_DIR [extra nvcc flags]. Produces
# OUT_DIR/libqbackend_marlin_test.so exporting the qb_marlin_* entry points (static cudart).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build_standalone.sh OUT_DIR}"; shift || true
mkdir -p "$out"
NVCC="${NVCC:-nvcc}"
common=(-std=c++17 -O3 -Xcompiler -fPIC -Xcompiler -fvisibility=hidden -I"$here/../include" -I"$here" --expt-relaxed-constexpr "$@")
"$NVCC" "${common[@]}" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_80,code=compute_80 \
  -Xptxas -v -c "$here/marlin_sm80.cu" -o "$out/marlin_sm80.o" 2> "$out/ptxas_sm80.log"
"$NVCC" "${common[@]}" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_80,code=compute_80 \
  -c "$here/marlin_unpack.cu" -o "$out/marlin_unpack.o"
"$NVCC" "${common[@]}" -gencode arch=compute_75,code=sm_75 -gencode arch=compute_75,code=compute_75 \
  -Xptxas -v -c "$here/marlin_sm75.cu" -o "$out/marlin_sm75.o" 2> "$out/ptxas_sm75.log"
"$NVCC" "${common[@]}" -DQB_HAS_MARLIN_80 -DQB_HAS_MARLIN_75 -Xcompiler -fvisibility=default \
  -gencode arch=compute_75,code=compute_75 -c "$here/marlin_api.cu" -o "$out/marlin_api.o"
"$NVCC" -shared -cudart static -o "$out/libqbackend_marlin_test.so" "$out/marlin_api.o" "$out/marlin_sm80.o" "$out/marlin_unpack.o" "$out/marlin_sm75.o"
echo "built $out/libqbackend_marlin_test.so"
