#!/usr/bin/env bash
# Development build of te-core: compiles libte_core.so and te_core._C into build/dev (or $1) and
# copies them into packages/te-core/src/te_core/, so PYTHONPATH=packages/te-core/src imports the
# package in place. TE_CUDA_ARCHS="" builds CPU-only (fast); default 90a.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/dev}
archs=${TE_CUDA_ARCHS-90a}
cmake -S "$root/packages/te-core" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTE_CUDA_ARCHS="$archs" -DPython_EXECUTABLE="$(command -v python3)" \
  -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" -DCMAKE_INSTALL_PREFIX="$build/stage" \
  ${TE_XLA_FFI_INCLUDE_DIR:+-DTE_XLA_FFI_INCLUDE_DIR=$TE_XLA_FFI_INCLUDE_DIR} >/dev/null
cmake --build "$build" -j"${TE_BUILD_JOBS:-$(nproc)}"
cmake --install "$build" >/dev/null
mkdir -p "$root/packages/te-core/src/te_core/lib"
cp "$build"/stage/te_core/lib/libte_core.so "$root/packages/te-core/src/te_core/lib/"
cp "$build"/stage/te_core/_C*.so "$root/packages/te-core/src/te_core/"
echo "te-core built into $build and copied into packages/te-core/src/te_core"
