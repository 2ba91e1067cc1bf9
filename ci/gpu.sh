#!/usr/bin/env bash
# Everything te does on the GPU test machine: build te-core for the local GPU with all cores, run
# the benchmarks and the GPU tests (CUDA kernels against the CPU backend), then the CPU suite
# there. Logs + JSON go to $TE_GPU_OUT (default $OUT, else /tmp/te-gpu-out); each step has its
# own time limit (TE_GPU_STEP_SECONDS, default 240) so one slow step cannot eat the others.
#
#   ci/gpu.sh [all]               all of it (longer than one 10-minute device call)
#   ci/gpu.sh bench [NAME...]     the benchmarks (default all; NAME: benchmarks/NAME.py, e.g. the
#                                 issues' figures: norm linear mlp jax_dense)
#   ci/gpu.sh tests [FILE...]     the GPU test files (default tests/gpu/test_*.py), TE_GPU_JOBS
#                                 of them at a time (default 1; the GPU has room for several)
#   ci/gpu.sh cpu                 the CPU suite, with the GPU hidden
#
# TE_GPU_CARD=TEXT: stop before building (exit 3) unless the GPU's name contains TEXT (e.g. H200,
# where a device call may come on another card and only that card's figures count).
#
# TE_GPU_WORKERS=N (needs pytest-xdist): the test files go to one pytest run of N worker
# processes, which take tests from every file (TE_GPU_JOBS is then unused; the run is one step,
# under TE_GPU_STEP_SECONDS), and the CPU suite runs on N workers too. With 14 workers on the H200
# machine's 16 cores the torch and jax files ran ~6x faster than file by file, the kernel files
# (CPU reference on large shapes) 2.5-4.5x.
set -uo pipefail
part=${1:-all}
[ $# -gt 0 ] && shift
case $part in
  all | bench | tests | cpu) ;;
  *) echo "usage: ci/gpu.sh [all | bench [NAME...] | tests [FILE...] | cpu]; got '$part'" >&2; exit 2 ;;
esac
[ "$part" = tests ] || [ "$part" = bench ] || [ $# -eq 0 ] || { echo "ci/gpu.sh: only 'tests' and 'bench' take names; got '$*'" >&2; exit 2; }
parallel=${TE_GPU_JOBS:-1}
[[ $parallel =~ ^[1-9][0-9]*$ ]] || { echo "ci/gpu.sh: TE_GPU_JOBS must be a positive integer; got '$parallel'" >&2; exit 2; }
workers=${TE_GPU_WORKERS:-}
xdist=()
if [ -n "$workers" ]; then
  [[ $workers =~ ^[1-9][0-9]*$ ]] || { echo "ci/gpu.sh: TE_GPU_WORKERS must be a positive integer; got '$workers'" >&2; exit 2; }
  python3 -c 'import xdist' 2>/dev/null || { echo "ci/gpu.sh: TE_GPU_WORKERS needs pytest-xdist (pip install pytest-xdist; without a network, bring its and execnet's wheels)" >&2; exit 2; }
  xdist=(-n "$workers")
fi
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

card=${TE_GPU_CARD:-}
if [ -n "$card" ] && ! nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q -- "$card"; then
  echo "ci/gpu.sh: TE_GPU_CARD=$card, and this GPU is not one: stopping before the build"; exit 3
fi

status=0
TE_CUDA_ARCHS=${TE_CUDA_ARCHS:-90a} TE_BUILD_JOBS=$(nproc) bash ci/dev_build.sh build/gpu \
  > "$out/build.log" 2>&1 || { echo "BUILD FAILED"; tail -50 "$out/build.log"; exit 1; }
echo "build: ok"

step() {  # step NAME COMMAND...: runs with the step time limit, log in $out/NAME.log
  local name=$1; shift
  timeout "$step_seconds" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$rc" > "$out/$name.rc"
  [ $rc -eq 0 ] || status=1
  echo "== $name (exit $rc)"; tail -"${TAIL:-8}" "$out/$name.log"
}

if [ "$part" = all ] || [ "$part" = bench ]; then
  # SM clock, power and temperature through the benchmarks (read-only): kernel times move 7-13%
  # with them (benchmarks/NOTES.md), so a result can be read against the clocks it ran at.
  smi_fields=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu=$smi_fields --format=csv -i 0 > /dev/null 2>&1 || smi_fields=timestamp,clocks.sm,power.draw,temperature.gpu
  nvidia-smi --query-gpu=$smi_fields --format=csv -i 0 -lms 250 > "$out/smi.csv" 2>&1 &
  smi_pid=$!
  benches=()
  if [ "$part" = bench ] && [ $# -gt 0 ]; then
    for name in "$@"; do
      if [ -f "benchmarks/$name.py" ] && [ "${name#_}" = "$name" ]; then benches+=("benchmarks/$name.py")
      else echo "ci/gpu.sh: no benchmark '$name' (benchmarks/$name.py)"; status=1; fi
    done
  else
    benches=(benchmarks/[!_]*.py)
  fi
  for bench in "${benches[@]}"; do
    name=$(basename "$bench" .py)
    TAIL=30 step "bench_$name" python3 "$bench" --json "$out/$name.json"
  done
  kill "$smi_pid" 2>/dev/null
fi

if [ "$part" = all ] || [ "$part" = tests ]; then
  files=("$@")
  [ ${#files[@]} -gt 0 ] || files=(tests/gpu/test_*.py)
  # Several jax processes on one GPU each take 75% of its memory unless told not to.
  [ "$parallel" -gt 1 ] || [ -n "$workers" ] && export XLA_PYTHON_CLIENT_PREALLOCATE=false
  present=()
  for t in "${files[@]}"; do
    if [ -f "$t" ]; then present+=("$t"); else echo "ci/gpu.sh: no test file '$t'"; status=1; fi
  done
  if [ -n "$workers" ]; then
    [ ${#present[@]} -eq 0 ] || step gpu_tests python3 -m pytest "${xdist[@]}" -ra -q "${present[@]}" -p no:cacheprovider --durations=10
  else
    for t in "${present[@]}"; do
      while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n; done
      step "$(basename "$t" .py)" python3 -m pytest -ra -q "$t" -p no:cacheprovider --durations=5 &
    done
    wait
    # Steps run in the background set status in their own shell: read their exit codes back.
    for t in "${present[@]}"; do
      rc_file="$out/$(basename "$t" .py).rc"
      [ -f "$rc_file" ] && [ "$(cat "$rc_file")" = 0 ] || status=1
    done
  fi
fi

if [ "$part" = all ] || [ "$part" = cpu ]; then
  # The CPU suite with the GPU hidden: its tests build modules on the default device and feed them
  # CPU tensors, and with a GPU visible te's modules default to CUDA (the GPU paths are tests/gpu's).
  step_seconds=$(( step_seconds > 600 ? step_seconds : 600 ))  # ~4 min there with 16 cores
  step cpu_suite env CUDA_VISIBLE_DEVICES= python3 -m pytest "${xdist[@]}" -q tests/core tests/torch tests/jax tests/cpp tests/benchmarks -p no:cacheprovider
fi
exit $status
