#!/usr/bin/env bash
# Everything te does on the GPU test machine, in one run: build te-core for the local GPU with all
# cores, run the GPU tests (CUDA kernels against the CPU backend) and the CPU suite there, run the
# benchmarks, and leave logs + JSON in $TE_GPU_OUT (default $OUT, else /tmp/te-gpu-out).
# The short table printed last is what to paste into benchmarks/results/ and the issue note.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${TE_GPU_OUT:-${OUT:-/tmp/te-gpu-out}}
mkdir -p "$out"
cd "$root"
export PYTHONUNBUFFERED=1
# The test machine's default CXX (/opt/gcc) links libstdc++ statically and exports its std::
# symbols, which then clash with jaxlib's: build with the system compiler.
[ -x /usr/bin/g++ ] && export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
export PYTHONPATH="$root/packages/te-core/src:$root/packages/te-torch/src:$root/packages/te-jax/src:$root/packages/te-cpp-headers/src${PYTHONPATH:+:$PYTHONPATH}"

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, torch, jax; print("python", sys.version.split()[0], "torch", torch.__version__, "jax", jax.__version__)'
  nvcc --version | tail -1
} 2>&1 | tee "$out/env.txt"

status=0
TE_CUDA_ARCHS=${TE_CUDA_ARCHS:-90a} TE_BUILD_JOBS=$(nproc) bash ci/dev_build.sh build/gpu \
  > "$out/build.log" 2>&1 || { echo "BUILD FAILED"; tail -50 "$out/build.log"; exit 1; }
echo "build: ok ($(grep -c 'Building' "$out/build.log") compile steps)"

python3 -m pytest -ra -q tests/gpu -p no:cacheprovider --continue-on-collection-errors 2>&1 | tee "$out/gpu_tests.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
python3 -m pytest -q tests/core tests/torch tests/jax -p no:cacheprovider -x 2>&1 | tee "$out/cpu_suite.log" | tail -5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

for bench in benchmarks/*.py; do
  name=$(basename "$bench" .py)
  python3 "$bench" --json "$out/$name.json" > "$out/$name.log" 2>&1 || { status=1; echo "benchmark $name FAILED"; tail -20 "$out/$name.log"; }
done
for bench in benchmarks/*.py; do
  name=$(basename "$bench" .py)
  echo "== $name"; cat "$out/$name.log" | tail -25
done
exit $status
