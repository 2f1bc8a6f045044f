# Quick start: `make sweep` runs the main job, `make test` runs the tests. Each creates the
# virtual environment on first use. torch is pinned to 2.13.0 first: a bare `torch` requirement
# would pull a multi-GB CUDA build where a local CPU wheel of 2.13.0 exists.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

# CI's second run: the suite again with the real torch-npu wheel installed next to torch and no
# CANN, so `import torch_npu` fails as it does on any machine without the Ascend toolkit.
NPU_VENV ?= .venv-npu
NPU_PY := $(NPU_VENV)/bin/python

.PHONY: venv venv-npu sweep test test-fast lint test-npu-wheel bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# torch-npu X.Y pins torch X.Y: the check fails if pip picked a wheel for another torch or moved torch.
venv-npu: $(NPU_VENV)/.installed

$(NPU_VENV)/.installed: pyproject.toml
	python3 -m venv $(NPU_VENV)
	$(NPU_PY) -m pip install -q --upgrade pip
	$(NPU_PY) -m pip install -q torch==2.13.0
	$(NPU_PY) -m pip install -q -e '.[dev,npu]'
	$(NPU_PY) -c "from importlib.metadata import version as v; t, n = v('torch'), v('torch-npu'); \
		assert t.startswith('2.13.0') and n.split('.')[:2] == t.split('.')[:2], (t, n)"
	touch $@

sweep: venv
	$(VENV)/bin/harness sweep $(ARGS)

test: venv
	$(PY) -m pytest -q -ra $(ARGS)

# The code's own checks, configured in pyproject.toml: ruff (lint and format), mypy, the layering.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test-fast: venv
	$(PY) -m pytest -q -m "not slow" $(ARGS)

# Each test file alone in a fresh process (quick tests, two at a time), so each proves on its
# own that the device-backend guard comes before torch; then the end-to-end tests of the sweep,
# the bench and `ray job submit`, which prove it in every process Ray starts (actors, the job's
# entry point).
NPU_SLOW := tests/test_sweep.py tests/test_bench.py tests/test_job_submit.py

test-npu-wheel: venv-npu
	@$(NPU_PY) -c "from importlib.metadata import version as v; import harness.devices as d; \
		print('torch', v('torch'), '| torch-npu', v('torch-npu'), '| npu available:', *d.npu_available())"
	scripts/test_files_alone.sh $(NPU_PY) $(ARGS)
	$(NPU_PY) -m pytest -q -ra -m slow $(ARGS) $(NPU_SLOW)

bench: venv
	$(PY) -m benchmarks $(ARGS)

clean:
	rm -rf $(VENV) $(NPU_VENV) .pytest_cache
