set -u
FILES="tests/test_docs_commands.py tests/test_check_plugin_parity.py tests/test_upstream_early.py tests/test_census.py tests/test_read_census.py tests/test_check_command.py tests/test_examples.py"
export VERL_UPSTREAM=/work/shared/upstream/verl-v0.9.0 VERL_UPSTREAM_091=/work/shared/upstream/verl-v0.9.1 CI=true PYTHONDONTWRITEBYTECODE=1
for side in base now; do
  if [ $side = base ]; then dir=/tmp/base34; py=/tmp/base34-venv/bin/python; else dir=/work/main; py=/work/main/.venv/bin/python; fi
  cache=$(mktemp -d); cd $dir
  start=$(date +%s)
  XDG_CACHE_HOME=$cache $py -m pytest -n 2 -q -p no:cacheprovider --junitxml=/tmp/targeted-$side.xml $FILES > /tmp/targeted-$side.log 2>&1
  echo "$side $(( $(date +%s) - start )) s rc=$?" >> /tmp/targeted.txt
done
