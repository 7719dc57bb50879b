# Two commands do all the setup on a fresh machine (see README "Quickstart"):
#   make demo   - the main job: a local elastic torchrun run with an injected failure
#   make test   - installs everything and runs the whole test suite (what CI runs)
SHELL := /bin/bash
VENV  := .venv
BIN   := $(VENV)/bin

.PHONY: setup system-deps cluster-tools demo test test-fast fault-matrix lint crds cluster-up cluster-down bench clean images test-images kind-up kind-down test-kind

setup:
	@bash hack/setup.sh

# Debian packages for the end-to-end suite (Prometheus) and the local cluster (iproute2).
system-deps:
	@bash hack/system-deps.sh

# Pinned kube-apiserver, controller-manager, scheduler, kubectl, etcd and helm built from
# Go modules into .cache/cluster-tools (reused when present).
cluster-tools:
	@bash hack/cluster-tools/build.sh >/dev/null

cluster-up: setup cluster-tools
	PYTHONPATH=hack $(BIN)/python -m localcluster up

cluster-down: setup
	PYTHONPATH=hack $(BIN)/python -m localcluster down

# The main job: example 01 elastic on 2 local "nodes" (torchrun, CPU, gloo). A rank is
# SIGKILLed at step 15 (torchrun restarts it in place) and node 1 loses every process at
# step 35 (the planner replaces it); training resumes from checkpoints both times.
demo: setup
	$(BIN)/llmtrain validate examples/*.yaml
	$(BIN)/llmtrain run examples/01-tiny-elastic-cpu.yaml --fresh \
		--inject "crash@step=15,rank=1" --kill-node 1@35 --timeout 900

# What CI runs (.ci/run): a fast stage (lint, unit and API-contract tests) that ends the run
# when it fails, then everything else; the Go-built tools build meanwhile (hack/test-stages.sh).
test:
	@bash hack/test-stages.sh

# Unit and API-contract tests only (no torchrun runs, no cluster, no built tools).
test-fast: setup
	$(BIN)/pytest -m "not slow and not cluster and not e2e and not tools and not images and not kind"

# The fault-matrix scenarios (22), ROUNDS pytest sessions in a row, each with a fresh
# local cluster (about 17 min a round of all 22 here); a table per scenario (docs/development.md).
ROUNDS ?= 5
fault-matrix: setup system-deps cluster-tools
	$(BIN)/python hack/fault_matrix.py --rounds $(ROUNDS)

# Import contracts, ruff and mypy (the whole tree, then the strict packages under
# --strict); every check runs, and any finding fails it (hack/lint.py, docs/development.md).
lint: setup
	$(BIN)/python hack/lint.py

crds: setup
	$(BIN)/llmtrain crd --write

# Every benchmark, full size (see docs/benchmarks.md); BENCH_ARGS=--quick for a smoke run.
bench: setup cluster-tools
	$(BIN)/python bench/trainer_overhead.py $(BENCH_ARGS)
	$(BIN)/python bench/operator_scale.py $(BENCH_ARGS)
	$(BIN)/python bench/recovery.py $(BENCH_ARGS)
	$(BIN)/python bench/checkpoint.py $(BENCH_ARGS)
	$(BIN)/python bench/goodput.py $(BENCH_ARGS)

# The operator and trainer-cpu images, built here (Debian's dockerd started when none runs,
# a debootstrap base, pip through the host's CA as a build secret): hack/images/build.sh.
images:
	@bash hack/images/build.sh

# The built images run by a real runtime: uid 65532, read-only root, a job trains in one.
test-images: setup
	$(BIN)/pytest -m images tests/images

# The kind bed: real kubelets, containerd and runc in Docker containers, every image built
# here (hack/kind/up.sh; docs/development.md, "Real nodes"). kind-down removes all of it.
kind-up: setup
	@bash hack/kind/up.sh

kind-down:
	@bash hack/kind/down.sh

# The end-to-end suite on the kind bed (up, the suite, down): hack/kind/e2e.sh.
test-kind: setup
	@bash hack/kind/e2e.sh

clean:
	rm -rf $(VENV) .cache .pytest_cache
