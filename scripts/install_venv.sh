#!/usr/bin/env bash
# Make a virtual environment with torch TORCH, then the harness next to it, and prove the harness
# did not replace that torch: what a host with a preinstalled torch (and torch_npu) must get.
#
# Usage: scripts/install_venv.sh VENV TORCH [TORCH_NPU] [RAY]
#   TORCH_NPU  a torch-npu version, installed with --no-deps before the harness (the x86 wheels of
#              2.6 to 2.9 name torch==X+cpu, which only PyTorch's own index has); or "extra" to
#              let pip take torch-npu from the harness's own `npu` extra.
#   RAY        a Ray version of the declared range, installed with torch and held there like it
#              (`make test-ray-2.40.0`); without it pip takes the newest.
set -euo pipefail
venv=$1 torch=$2 torch_npu=${3:-} ray=${4:-}
py=$venv/bin/python
extras=dev
rm -rf "$venv"
python3 -m venv "$venv"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q "torch==$torch" ${ray:+"ray[default]==$ray"}
if [ "$torch_npu" = extra ]; then
  extras=dev,npu
elif [ -n "$torch_npu" ]; then
  "$py" -m pip install -q --no-deps "torch-npu==$torch_npu"
fi
before=$("$py" -c "from importlib.metadata import version; print(version('torch'))")
# No constraint on torch here, on purpose: the harness's own requirements must leave it alone.
"$py" -m pip install -q -e .
"$py" -c "from importlib.metadata import version as v; import sys; t = v('torch'); \
  sys.exit(0 if t == '$before' else f'installing the harness replaced torch $before with {t}')"
# The extras (SB3 2.9 asks for torch >= 2.8) may not move torch either: it is held where it is, so
# pip takes the SB3 and sb3-contrib that run on it. The host install of docs/versions.md, line for line
# (tests/test_install.py holds the two to each other), so every CI venv runs what a host runs.
"$py" -c "from importlib.metadata import version; print('torch==' + version('torch'))" > "$venv/held.txt"
if [ -n "$ray" ]; then echo "ray==$ray" >> "$venv/held.txt"; fi
"$py" -m pip install -q -e ".[$extras]" -c "$venv/held.txt"
# onnx2torch's metadata asks for torchvision, whose newest release pins the newest torch; it runs
# on onnx, numpy and torch alone (pyproject.toml).
"$py" -m pip install -q --no-deps 'onnx2torch>=1.5,<2'
"$py" - "$before" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

before, torch = sys.argv[1], version("torch")
assert torch == before, f"installing the harness replaced torch {before} with {torch}"
try:
    npu = version("torch-npu")
except PackageNotFoundError:
    npu = None
assert npu is None or npu.split(".")[:2] == torch.split(".")[:2], f"torch {torch} with torch-npu {npu}"
try:
    version("torchvision")
except PackageNotFoundError:
    pass
else:
    raise AssertionError("torchvision was installed: something in the dependency set asks for it")
print(f"{sys.prefix}: torch {torch} (untouched), torch-npu {npu or '-'}, stable-baselines3 {version('stable-baselines3')}")
PY
