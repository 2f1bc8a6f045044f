#!/usr/bin/env bash
# The harness on another torch of the supported range (`make test-torch TORCH=2.6.0`): the quick
# tests (the torch_npu API check against the wheel installed beside it among them) and those marked
# ray_versions (the venv may hold another Ray of the range: Makefile RAY_<torch>), then one small
# sweep on 2 simulated cards, whose recorded precision settings are printed. Where the venv holds
# another Ray than the main venv's (OTHER_RAY=1: the oldest of the range), also the tests marked
# ray_recovery: a lost node and a resumed run, a card that crashes or hangs and is restarted.
# Usage: [OTHER_RAY=1] scripts/test_torch.sh VENV [pytest args...]
set -euo pipefail
venv=$1
shift
py=$venv/bin/python
"$py" -c "from importlib.metadata import version as v; import harness, torch; \
print('torch', torch.__version__, '| torch-npu', v('torch-npu'), '| ray', v('ray'), '| fp32_precision API:', hasattr(torch.backends, 'fp32_precision'))"
"$py" -m pytest -q -p no:cacheprovider -m "not slow or ray_versions${OTHER_RAY:+ or ray_recovery}" "$@"
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
