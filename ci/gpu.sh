#!/usr/bin/env bash
# Everything te does on the GPU test machine, in one run: build te-core for the local GPU with all
# cores, run the benchmarks and the GPU tests (CUDA kernels against the CPU backend), then the CPU
# suite there. Logs + JSON go to $TE_GPU_OUT (default $OUT, else /tmp/te-gpu-out); each step has
# its own time limit (TE_GPU_STEP_SECONDS, default 240) so one slow step cannot eat the others.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${TE_GPU_OUT:-${OUT:-/tmp/te-gpu-out}}
step_seconds=${TE_GPU_STEP_SECONDS:-240}
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
echo "build: ok"

step() {  # step NAME COMMAND...: runs with the step time limit, log in $out/NAME.log
  local name=$1; shift
  timeout "$step_seconds" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || status=1
  echo "== $name (exit $rc)"; tail -"${TAIL:-8}" "$out/$name.log"
}
# SM clock, power and temperature through the benchmarks (read-only): kernel times move 7-13% with
# them (benchmarks/NOTES.md), so a result can be read against the clocks it ran at.
smi_fields=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$smi_fields --format=csv -i 0 > /dev/null 2>&1 || smi_fields=timestamp,clocks.sm,power.draw,temperature.gpu
nvidia-smi --query-gpu=$smi_fields --format=csv -i 0 -lms 250 > "$out/smi.csv" 2>&1 &
smi_pid=$!
for bench in benchmarks/[!_]*.py; do
  name=$(basename "$bench" .py)
  TAIL=30 step "bench_$name" python3 "$bench" --json "$out/$name.json"
done
kill "$smi_pid" 2>/dev/null
for t in tests/gpu/test_*.py; do
  step "$(basename "$t" .py)" python3 -m pytest -ra -q "$t" -p no:cacheprovider --durations=5
done
# The CPU suite with the GPU hidden: its tests build modules on the default device and feed them
# CPU tensors, and with a GPU visible te's modules default to CUDA (the GPU paths are tests/gpu's).
step_seconds=$(( step_seconds > 600 ? step_seconds : 600 ))  # ~4 min there with 16 cores
step cpu_suite env CUDA_VISIBLE_DEVICES= python3 -m pytest -q tests/core tests/torch tests/jax tests/cpp tests/benchmarks -p no:cacheprovider
exit $status
