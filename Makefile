# Quick start: `make sweep` runs the main job, `make test` runs the tests. Each creates the
# virtual environment on first use. torch is pinned to 2.13.0 first: a bare `torch` requirement
# would pull a multi-GB CUDA build where a local CPU wheel of 2.13.0 exists.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: venv sweep test test-fast bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

sweep: venv
	$(VENV)/bin/harness sweep $(ARGS)

test: venv
	$(PY) -m pytest -q -ra $(ARGS)

test-fast: venv
	$(PY) -m pytest -q -m "not slow" $(ARGS)

bench: venv
	$(PY) -m benchmarks $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
