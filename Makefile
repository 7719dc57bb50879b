# Two commands do all the setup on a fresh machine (see README "Quickstart"):
#   make demo   - the main job: a local elastic torchrun run with an injected failure
#   make test   - installs everything and runs the whole test suite (what CI runs)
SHELL := /bin/bash
VENV  := .venv
BIN   := $(VENV)/bin

.PHONY: setup demo test test-fast lint crds cluster-tools clean

setup:
	@bash hack/setup.sh

# The main job: example 01 elastic on 2 local "nodes" (torchrun, CPU, gloo). A rank is
# SIGKILLed at step 15 (torchrun restarts it in place) and node 1 loses every process at
# step 35 (the planner replaces it); training resumes from checkpoints both times.
demo: setup
	$(BIN)/llmtrain validate examples/*.yaml
	$(BIN)/llmtrain run examples/01-tiny-elastic-cpu.yaml --fresh \
		--inject "crash@step=15,rank=1" --kill-node 1@35 --timeout 900

test: setup
	$(BIN)/pytest

# Unit and API-contract tests only (no torchrun runs, no cluster).
test-fast: setup
	$(BIN)/pytest -m "not slow and not cluster and not e2e"

lint: setup
	$(BIN)/lint-imports

crds: setup
	$(BIN)/llmtrain crd --write

clean:
	rm -rf $(VENV) .cache .pytest_cache
