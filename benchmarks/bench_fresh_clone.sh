#!/usr/bin/env bash
# The README's first command as a new user meets it, at two commits side by side: each commit
# cloned fresh and installed as the command says (a venv, `pip install -e '.[upstream]'`), then
# its audit (`.venv/bin/pytest --verl-corpus`) cold (an empty user cache and runtime folder, no
# pytest cache) and warm (the same again), the two clones alternating round by round so a drift
# of the machine's speed falls on both. Round 1's cold run is the clone's very first: Python
# compiles our modules as it imports them.
#   bash benchmarks/bench_fresh_clone.sh BASELINE_COMMIT [NOW_COMMIT [ROUNDS]]
# Prints one line per run and a table of the medians; the clones are removed at the end.
set -euo pipefail
base=$1 now=${2:-HEAD} rounds=${3:-2}
repo="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# As CI and a user's shell: bytecode is written.
unset PYTHONDONTWRITEBYTECODE VERL_UPSTREAM VERL_UPSTREAM_091

for side in base now; do
  commit=$base
  [ "$side" = now ] && commit=$now
  git clone -q "$repo" "$work/$side"
  git -C "$work/$side" checkout -q "$(git -C "$repo" rev-parse "$commit")"
  (cd "$work/$side" && python3 -m venv .venv && .venv/bin/pip install -q -e '.[upstream]') \
    > "$work/$side-install.log" 2>&1
done

audit() {  # SIDE CACHE RUNTIME: one audit run in the side's clone, its wall seconds on stdout
  local start=$EPOCHREALTIME
  (cd "$work/$1" && XDG_CACHE_HOME=$2 XDG_RUNTIME_DIR=$3 .venv/bin/pytest --verl-corpus \
    > "$work/$1-audit.log" 2>&1) || { echo "audit failed in $1:" >&2; tail -5 "$work/$1-audit.log" >&2; exit 1; }
  awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.2f", b - a}'
}

declare -A times
for round in $(seq "$rounds"); do
  for side in base now; do
    cache=$(mktemp -d) runtime=$(mktemp -d)
    rm -rf "$work/$side/.pytest_cache"
    cold=$(audit "$side" "$cache" "$runtime")
    warm=$(audit "$side" "$cache" "$runtime")
    # The warm templates the cold run may have left end with their runtime folder.
    rm -rf "$cache" "$runtime"
    echo "round $round, $side ($(git -C "$work/$side" rev-parse --short HEAD)): cold $cold s, warm $warm s"
    times[$side-cold]+="$cold "
    times[$side-warm]+="$warm "
  done
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}'; }
echo
echo "| README command 1's audit, fresh clone | baseline ($base) | now ($now) | now/baseline |"
echo "| --- | ---: | ---: | ---: |"
for run in cold warm; do
  b=$(echo "${times[base-$run]}" | median) n=$(echo "${times[now-$run]}" | median)
  awk -v r="$run" -v k="$rounds" -v b="$b" -v n="$n" \
    'BEGIN {printf "| %s (median of %s) | %.1f s | %.1f s | %.2fx |\n", r, k, b, n, n / b}'
done
