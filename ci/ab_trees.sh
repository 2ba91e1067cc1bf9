#!/usr/bin/env bash
# A/B of two source trees of te (e.g. main and a branch's worktree carried along): builds each
# tree's te-core in place when its build is missing (ci/dev_build.sh into TREE/build/ab), then
# runs BENCHMARK from each tree in alternating processes, ROUNDS times, each with its own
# packages on PYTHONPATH, so host-time drift hits both trees alike. Output lines are prefixed
# with the tree's label (A or B).
#
#   ci/ab_trees.sh TREE_A TREE_B ROUNDS BENCHMARK [ARGS...]
#   e.g. ci/ab_trees.sh . .scratch/ride 3 benchmarks/linear_host_time.py --rounds 9
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: ci/ab_trees.sh TREE_A TREE_B ROUNDS BENCHMARK [ARGS...]" >&2; exit 2; }
a=$1 b=$2 rounds=$3 bench=$4
shift 4
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "ci/ab_trees.sh: ROUNDS must be a positive integer; got '$rounds'" >&2; exit 2; }
for tree in "$a" "$b"; do
  [ -f "$tree/ci/dev_build.sh" ] || { echo "ci/ab_trees.sh: '$tree' is not a te source tree (no ci/dev_build.sh)" >&2; exit 2; }
  [ -f "$tree/$bench" ] || { echo "ci/ab_trees.sh: no '$bench' in '$tree'" >&2; exit 2; }
done
[ -x /usr/bin/g++ ] && export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++  # as ci/gpu.sh
status=0
for tree in "$a" "$b"; do
  if ! compgen -G "$tree/packages/te-core/src/te_core/_C*.so" > /dev/null; then
    echo "== building te-core in $tree"
    bash "$tree/ci/dev_build.sh" "$(cd "$tree" && pwd)/build/ab" > "$tree/build-ab.log" 2>&1 \
      || { echo "BUILD FAILED in $tree"; tail -30 "$tree/build-ab.log"; exit 1; }
  fi
done
for round in $(seq "$rounds"); do
  for label in A B; do
    tree=$a
    [ $label = B ] && tree=$b
    root=$(cd "$tree" && pwd)
    echo "== round $round, $label ($tree)"
    (cd "$root" && PYTHONPATH="$root/packages/te-core/src:$root/packages/te-torch/src:$root/packages/te-jax/src" \
      python3 "$bench" "$@") 2>&1 | sed "s/^/$label /" || status=1
  done
done
exit $status
