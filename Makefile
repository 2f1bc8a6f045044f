# Quick start: `make sweep` runs the main job, `make test` runs the tests. Each creates the
# virtual environment on first use. torch is installed first, pinned, and the harness after it
# (scripts/install_venv.sh), which proves the harness leaves it alone: a bare `torch`
# requirement would pull a multi-GB CUDA build where a local CPU wheel of 2.13.0 exists.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
INSTALL := scripts/install_venv.sh

# CI's second run: the suite again with the real torch-npu wheel installed next to torch and no
# CANN, so `import torch_npu` fails as it does on any machine without the Ascend toolkit.
NPU_VENV ?= .venv-npu
NPU_PY := $(NPU_VENV)/bin/python

# Ascend's torch_npu for each torch of the support matrix (README), and the wheels whose Python
# sources `make test-npu-api` checks every name the harness uses against.
TORCH_NPU_2.6.0 := 2.6.0.post5
TORCH_NPU_2.7.1 := 2.7.1.post2
TORCH_NPU_2.8.0 := 2.8.0.post2
TORCH_NPU_2.9.0 := 2.9.0
TORCH_NPU_2.13.0 := 2.13.0
SUPPORTED_TORCH_NPU := 2.6.0.post5 2.7.1.post2 2.8.0.post2 2.9.0 2.13.0
# The ends of CANN 8.5's range, each tested by CI in its own venv (`make test-torch TORCH=...`).
CI_TORCH := 2.6.0 2.9.0
TORCH ?=
NPU_SOURCES := .cache/torch-npu

.PHONY: venv venv-npu sweep test test-fast lint test-npu-wheel test-torch test-npu-api bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(INSTALL)
	$(INSTALL) $(VENV) 2.13.0
	touch $@

# torch-npu from the harness's own `npu` extra: pip must pick the 2.13 wheel and leave torch be.
venv-npu: $(NPU_VENV)/.installed

$(NPU_VENV)/.installed: pyproject.toml $(INSTALL)
	$(INSTALL) $(NPU_VENV) 2.13.0 extra
	touch $@

# A venv per torch of the range, with Ascend's torch-npu for it (installed without its
# dependencies: the x86 wheels of 2.6 to 2.9 name torch==X+cpu, only on PyTorch's own index).
.venv-torch-%/.installed: pyproject.toml $(INSTALL)
	@test -n "$(TORCH_NPU_$*)" || { echo "no torch-npu is paired with torch $* (Makefile: TORCH_NPU_*)"; exit 2; }
	$(INSTALL) .venv-torch-$* $* $(TORCH_NPU_$*)
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
		print('torch', v('torch'), '| torch-npu', v('torch-npu'), '| npu available:', *d.accelerator('npu').detect())"
	scripts/test_files_alone.sh $(NPU_PY) $(ARGS)
	$(NPU_PY) -m pytest -q -ra -m slow $(ARGS) $(NPU_SLOW)

# The quick tests, one small sweep and the torch_npu API check with another torch of the range:
# `make test-torch TORCH=2.6.0`.
test-torch:
	@test -n "$(TORCH)" || { echo "usage: make test-torch TORCH=2.6.0 (CI runs $(CI_TORCH))"; exit 2; }
	$(MAKE) .venv-torch-$(TORCH)/.installed
	scripts/test_torch.sh .venv-torch-$(TORCH) $(ARGS)

# Every torch_npu name the harness uses, against the Python sources of every supported wheel
# (downloaded once into $(NPU_SOURCES), unpacked, never imported).
test-npu-api: venv
	@for v in $(SUPPORTED_TORCH_NPU); do \
	  test -f $(NPU_SOURCES)/$$v/torch_npu/__init__.py && continue; \
	  $(PY) -m pip download -q --no-deps -d $(NPU_SOURCES)/wheels "torch-npu==$$v" && \
	  $(PY) -m zipfile -e $(NPU_SOURCES)/wheels/torch_npu-$$v-*.whl $(NPU_SOURCES)/$$v || exit 1; \
	done
	TORCH_NPU_SOURCES="$(subst $() $(),:,$(foreach v,$(SUPPORTED_TORCH_NPU),$(NPU_SOURCES)/$(v)/torch_npu))" \
	  $(PY) -m pytest -q -p no:cacheprovider tests/test_torch_npu_wheel.py -k defined $(ARGS)

bench: venv
	$(PY) -m benchmarks $(ARGS)

clean:
	rm -rf $(VENV) $(NPU_VENV) .venv-torch-* $(NPU_SOURCES) .pytest_cache
