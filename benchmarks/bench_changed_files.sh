#!/usr/bin/env bash
# Some test files of this checkout and of a baseline checkout, side by side, as CI runs them
# (python -m pytest -n 2, CI=true, a fresh user cache each): for a change that touches a few
# files, where bench_suite.py's two whole suites would take an hour on a slow machine.
#   bash benchmarks/bench_changed_files.sh BASELINE_DIR BASELINE_PYTHON tests/test_a.py ...
# Writes /tmp/targeted-{base,now}.xml and prints each side's wall seconds.
set -u
base_dir=$1 base_py=$2; shift 2
repo="$(cd "$(dirname "$0")/.." && pwd)"
export VERL_UPSTREAM="${VERL_UPSTREAM:-$repo/../shared/upstream/verl-v0.9.0}"
export VERL_UPSTREAM_091="${VERL_UPSTREAM_091:-$repo/../shared/upstream/verl-v0.9.1}"
export CI=true PYTHONDONTWRITEBYTECODE=1
for side in base now; do
  if [ "$side" = base ]; then dir=$base_dir py=$base_py; else dir=$repo py=$repo/.venv/bin/python; fi
  cache=$(mktemp -d)
  start=$(date +%s)
  (cd "$dir" && XDG_CACHE_HOME=$cache "$py" -m pytest -n 2 -q -p no:cacheprovider \
      --junitxml="/tmp/targeted-$side.xml" "$@" > "/tmp/targeted-$side.log" 2>&1)
  echo "$side: $(( $(date +%s) - start )) s, exit $?"
done
