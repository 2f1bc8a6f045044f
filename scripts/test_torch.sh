#!/usr/bin/env bash
# The harness on another torch of the supported range (`make test-torch TORCH=2.6.0`): the quick
# tests of what the venv varies (the torch_npu API check against the wheel installed beside it
# among them), where the venv holds another Ray of the range (Makefile RAY_<torch>) those marked
# ray_versions and ray_recovery, then one small sweep on 2 simulated cards, whose recorded
# precision settings are printed.
# Usage: [OTHER_RAY=1] scripts/test_torch.sh VENV [all|quick|ray] [pytest args...]
#   quick  the quick tests alone: no Ray starts, so CI runs them at the lowest priority beside
#          `make test`, in the CPU its Ray tests leave idle
#   ray    the sweep; where the venv holds another Ray than the main venv's (OTHER_RAY=1: the
#          oldest of the range), first the tests marked ray_versions (a join refused for its
#          versions) and ray_recovery (lost nodes and a resumed run, a card that crashes or hangs
#          and is restarted). On the main venv's Ray, `make test` runs those.
set -euo pipefail
venv=$1 part=${2:-all}
shift $(($# < 2 ? $# : 2))
py=$venv/bin/python
case $part in all | quick | ray) ;; *) echo "usage: $0 VENV [all|quick|ray] [pytest args...]" >&2; exit 2 ;; esac
"$py" -c "from importlib.metadata import version as v; import harness, torch; \
print('torch', torch.__version__, '| torch-npu', v('torch-npu'), '| ray', v('ray'), '| fp32_precision API:', hasattr(torch.backends, 'fp32_precision'))"
if [ "$part" != ray ]; then
  # What a venv of the matrix varies is torch, torch-npu, SB3 and gymnasium, and Ray: the quick
  # tests of what reads, casts, runs and exports policies with torch, of the devices and the
  # torch_npu API, and of Ray's names the harness uses. The rest (the judge, the store, the query, the command line) runs on numpy,
  # scipy, pyarrow and DuckDB, the same in every venv: `make test` runs those once.
  torch_tests=(sb3_families sb3_zip policy_files onnx_graph export_onnx devices torch_npu_wheel mlagents mlagents_memory multi_discrete
    vecnormalize golden faults huggy_dtype finite_weights localize episodes recurrent masked
    precision_plan honest_card workloads accelerator_registry registry ray_internals actor_clients)
  "$py" -m pytest -q -p no:cacheprovider -m "not slow" $(printf -- 'tests/test_%s.py ' "${torch_tests[@]}") "$@" \
    || [ $? = 5 ] # 5: ARGS chose none here
fi
[ "$part" = quick ] && exit 0
if [ -n "${OTHER_RAY:-}" ]; then
  # Only the files that hold such tests are collected. Each test is named as it starts, unbuffered:
  # a test process that dies (Ray's driver ends with the raylet it joined) leaves its test in the log.
  marked=$(grep -l -E 'mark\.(ray_versions|ray_recovery)' tests/test_*.py)
  PYTHONUNBUFFERED=1 "$py" -m pytest -v -p no:cacheprovider -m "ray_versions or ray_recovery" $marked "$@" || [ $? = 5 ]
fi
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
"$venv/bin/harness" sweep --policy cartpole --dtypes float32,bfloat16 --batch-sizes 1,8 --episodes 1 --no-progress \
  --results "$results" --run-id "torch-$("$py" -c 'import harness, torch; print(torch.__version__)' | tr '+' '-')"
"$py" - "$results" <<'PY'
import json
import sys

import pyarrow.dataset as ds

runs = ds.dataset(f"{sys.argv[1]}/runs", format="parquet", partitioning="hive").to_table().to_pylist()
for device in json.loads(runs[0]["devices"]):
    print(f"runs.devices {device['label']} (torch {device['runtime']['torch']}): {json.dumps(device['settings'])}")
PY
