#!/usr/bin/env bash
# Run every tests/test_*.py alone in a fresh interpreter (the quick tests, two files at a time):
# each file must pass on its own, whatever other files would have imported first.
# Usage: scripts/test_files_alone.sh PYTHON [pytest args...]
set -uo pipefail
python=$1
shift
run_one() {
  local python=$1 file=$2
  shift 2
  local out rc
  out=$("$python" -m pytest -q -p no:cacheprovider -m "not slow" "$@" "$file" 2>&1)
  rc=$?
  # Exit 5: every test in the file is slow, so none ran here.
  if [ $rc -eq 0 ] || [ $rc -eq 5 ]; then
    echo "ok    $file (alone)"
  else
    echo "FAIL  $file (alone)"
    echo "$out" | tail -40
    return 1
  fi
}
export -f run_one
ls tests/test_*.py | xargs -P 2 -I{} bash -c 'run_one "$@"' _ "$python" {} "$@"
