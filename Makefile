# Set-up and entry points. Each target creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.coda-installed
SYSTEMS ?= vllm

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

## make run: the main job on the built-in workload (4 workers, 3 req/s of synthetic agent sessions)
run: $(STAMP)
	$(BIN)/coda compare --workload synth:rate=3,duration=1800,seed=0 --workers 4 --systems $(SYSTEMS)

## make test: every test (unit, property, integration)
test: $(STAMP)
	$(BIN)/python -m pytest -q

## make bench: performance benchmarks (ratios against baselines measured in the same run)
bench: $(STAMP)
	$(BIN)/python benchmarks/sim_speed.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks
