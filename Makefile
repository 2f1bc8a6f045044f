# Quick start: `make sweep` runs the main job, `make test` runs the tests. Each creates the
# virtual environment on first use. torch is installed first, pinned, and the harness after it
# (scripts/install_venv.sh), which proves the harness leaves it alone: a bare `torch`
# requirement would pull a multi-GB CUDA build where a local CPU wheel of 2.13.0 exists.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
INSTALL := scripts/install_venv.sh

# Ascend's torch_npu for each torch of the support matrix (docs/versions.md), and the wheels whose Python
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
# The oldest Ray of the range pyproject.toml declares; the newest is the one `make venv` installs.
# CI's torch 2.9.0 venv holds it (`make test-matrix`): its quick tests, the `ray_versions` and
# `ray_recovery` tests and its sweep run on the oldest Ray at no cost of a venv of their own.
CI_RAY := 2.40.0
RAY_2.9.0 := $(CI_RAY)
NPU_SOURCES := .cache/torch-npu

.PHONY: venv sweep test test-fast test-corpus lint docs test-torch test-matrix test-ray test-npu-api npu-sources print-matrix-venvs bench clean

venv: $(VENV)/.installed

# The venv holds the real torch-npu wheel next to torch (the harness's own `npu` extra: pip must
# pick the 2.13 wheel and leave torch be). Without CANN `import torch_npu` fails, as on any machine
# that installed `.[npu]` without the toolkit, so every test, and every process Ray starts for
# one, proves the device-backend guard comes before torch.
$(VENV)/.installed: pyproject.toml $(INSTALL)
	$(INSTALL) $(VENV) 2.13.0 extra
	touch $@

# A venv per torch of the range, with Ascend's torch-npu for it (installed without its
# dependencies: the x86 wheels of 2.6 to 2.9 name torch==X+cpu, only on PyTorch's own index).
.venv-torch-%/.installed: pyproject.toml $(INSTALL)
	@test -n "$(TORCH_NPU_$*)" || { echo "no torch-npu is paired with torch $* (Makefile: TORCH_NPU_*)"; exit 2; }
	$(INSTALL) .venv-torch-$* $* $(TORCH_NPU_$*) $(RAY_$*)
	touch $@
# Made on the way to `test-torch-%`, and kept: make would delete it as an intermediate file.
.PRECIOUS: .venv-torch-%/.installed

# A venv per Ray of the range: the main venv's torch and torch-npu, with that Ray held in place.
.venv-ray-%/.installed: pyproject.toml $(INSTALL)
	$(INSTALL) .venv-ray-$* 2.13.0 extra $*
	touch $@
.PRECIOUS: .venv-ray-%/.installed

sweep: venv
	$(VENV)/bin/harness sweep $(ARGS)

test: venv
	$(PY) -m pytest -q -ra --durations=25 $(ARGS)

# The code's own checks, configured in pyproject.toml: ruff (lint and format), mypy, the layering,
# and the documentation site built strictly.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(MAKE) docs

# The documentation site (mkdocs.yml, docs/): a broken link, a page outside the nav or a marker
# docs/hooks.py cannot fill fails the build. The option reference and the columns are generated.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q -d build/site

test-fast: venv
	$(PY) -m pytest -q -m "not slow" $(ARGS)

# The RL Zoo's whole published corpus (../shared/cases/rlzoo: 45 agents, 24 episodes each) swept
# and held to its published scores; `make test` (CI) sweeps one agent of each algorithm. One sweep
# of about five minutes on 2 cores, with its own timeout: outside CI's time (docs/ci.md).
test-corpus: venv
	HARNESS_CORPUS=1 HARNESS_REQUIRE_CASES=1 $(PY) -m pytest -q -ra --timeout=7200 tests/test_rlzoo_sweep.py $(ARGS)

# The quick tests, one small sweep and the torch_npu API check with another torch of the range:
# `make test-torch TORCH=2.6.0`.
test-torch:
	@test -n "$(TORCH)" || { echo "usage: make test-torch TORCH=2.6.0 (CI runs $(CI_TORCH))"; exit 2; }
	$(MAKE) test-torch-$(TORCH)

# Each venv's tests, all of them or a part: quick (no Ray) or ray (the sweep; on another Ray than
# the main venv's, the ray_versions and ray_recovery tests before it). CI runs the quick part beside `make test` at the lowest priority, the rest after it.
MATRIX_PART ?= all
test-torch-%: .venv-torch-%/.installed
	$(if $(RAY_$*),OTHER_RAY=1 )scripts/test_torch.sh .venv-torch-$* $(MATRIX_PART) $(ARGS)

# CI's torches two at a time (installs and tests), each one's output printed together when it ends.
test-matrix:
	$(MAKE) -j2 --output-sync=target $(addprefix test-torch-,$(CI_TORCH))

# The quick tests, and the end-to-end tests marked `ray_versions` (a join refused for its
# versions, through the GCS probe) and `ray_recovery` (a lost node, a crashing or hanging card)
# with another Ray of the range:
# `make test-ray RAY=2.40.0`. A job submitted to a cluster runs on the Ray its owners installed.
test-ray:
	@test -n "$(RAY)" || { echo "usage: make test-ray RAY=2.40.0 (CI runs $(CI_RAY))"; exit 2; }
	$(MAKE) test-ray-$(RAY)

test-ray-%: .venv-ray-%/.installed
	.venv-ray-$*/bin/python -c "import ray, sys; sys.exit(0 if ray.__version__ == '$*' else f'Ray {ray.__version__}, not $*')"
	.venv-ray-$*/bin/python -m pytest -q -p no:cacheprovider -m "not slow or ray_versions or ray_recovery" $(ARGS)

# Every torch_npu name the harness uses, against the Python sources of every supported wheel
# (downloaded once into $(NPU_SOURCES), unpacked, never imported).
test-npu-api: npu-sources
	TORCH_NPU_SOURCES="$(subst $() $(),:,$(foreach v,$(SUPPORTED_TORCH_NPU),$(NPU_SOURCES)/$(v)/torch_npu))" \
	  $(PY) -m pytest -q -p no:cacheprovider tests/test_torch_npu_wheel.py -k defined $(ARGS)

# The supported wheels, downloaded once into $(NPU_SOURCES) and unpacked.
npu-sources: venv
	@for v in $(SUPPORTED_TORCH_NPU); do \
	  test -f $(NPU_SOURCES)/$$v/torch_npu/__init__.py && continue; \
	  $(PY) -m pip download -q --no-deps -d $(NPU_SOURCES)/wheels "torch-npu==$$v" && \
	  $(PY) -m zipfile -e $(NPU_SOURCES)/wheels/torch_npu-$$v-*.whl $(NPU_SOURCES)/$$v || exit 1; \
	done

# The venvs `make test-matrix` tests in (CI builds them while `make test` runs).
print-matrix-venvs:
	@echo $(foreach t,$(CI_TORCH),.venv-torch-$(t)/.installed)

bench: venv
	$(PY) -m benchmarks $(ARGS)

clean:
	rm -rf $(VENV) .venv-torch-* .venv-ray-* $(NPU_SOURCES) .pytest_cache
