# syntax=docker/dockerfile:1
# Three images from one Dockerfile (docs/install.md, "Images"):
#   docker build --target operator     -t ghcr.io/llmtrain/operator:0.1.0 .
#   docker build --target trainer-cpu  -t ghcr.io/llmtrain/trainer:0.1.0 .
#   docker build --target trainer-cuda -t ghcr.io/llmtrain/trainer:0.1.0-cuda .
# operator: kopf and the Kubernetes client, no torch. trainer-cpu: CPU torch and gloo
# (kind, CI, the examples' default tag). trainer-cuda: a CUDA devel base with nvcc, so
# that DeepSpeed's JIT ops build on the GPU nodes. Every image runs as uid 65532.
# Dependencies are installed before the project (a wheel built in its own stage) comes
# in: a code edit rebuilds the wheel and the last layer, never the torch layer. No Docker
# engine runs on the project's CI machine: tests/test_images.py lints this file with
# hadolint and checks its structure.

# Bases pinned by digest (the tag is kept for the reader). Refresh both with
# hack/images/pin-bases.sh on a machine that can reach the registries.
ARG PYTHON_BASE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91
ARG CUDA_BASE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04@sha256:e071e85c52ad91fc9ea24158ff5330876b2d1a5c4ac83ccc6066976835873c01
# The torch wheel index per trainer variant: the CPU build for trainer-cpu (PyPI's Linux
# wheel is the CUDA build, several GB), PyPI's default (CUDA 13.0, as the base) for cuda.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

# ---------------------------------------------------------------- the project, as a wheel
# Pure Python: one wheel for every image (the CUDA base's Python is another version).
FROM ${PYTHON_BASE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY common/ common/
COPY operator/ operator/
COPY trainer_image/ trainer_image/
RUN pip wheel --no-deps --wheel-dir /wheels .

# ---------------------------------------------------------------- operator
FROM ${PYTHON_BASE} AS operator
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /src
COPY pyproject.toml constraints.txt hack/images/requirements.py ./
RUN python requirements.py operator > requirements.txt && pip install -c constraints.txt -r requirements.txt
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && rm -rf /src /wheels
WORKDIR /
USER 65532:65532
ENTRYPOINT ["kopf", "run", "--standalone", "-m", "llmtrain_operator.handlers"]

# ---------------------------------------------------------------- trainer, CPU
FROM ${PYTHON_BASE} AS trainer-cpu
ARG TORCH_CPU_INDEX
# gcc/g++ build DeepSpeed's CPU op at first use (DS_ACCELERATOR=cpu, see docs/trainer.md).
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    DS_ACCELERATOR=cpu \
    HOME=/home/llmtrain TORCH_EXTENSIONS_DIR=/home/llmtrain/.cache/torch_extensions MPLCONFIGDIR=/tmp/matplotlib
WORKDIR /src
COPY pyproject.toml constraints.txt hack/images/requirements.py hack/images/install-trainer-deps.sh ./
RUN sh install-trainer-deps.sh "${TORCH_CPU_INDEX}"
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && rm -rf /src /wheels \
 && mkdir -p /home/llmtrain/.cache && chown -R 65532:65532 /home/llmtrain
WORKDIR /home/llmtrain
USER 65532:65532
ENTRYPOINT ["python", "-m", "llmtrain_trainer.launch.launcher"]

# ---------------------------------------------------------------- trainer, CUDA
FROM ${CUDA_BASE} AS trainer-cuda
# The base's Python (3.12 on Ubuntu 24.04) in a venv: the system one is externally managed.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
 && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/home/llmtrain TORCH_EXTENSIONS_DIR=/home/llmtrain/.cache/torch_extensions MPLCONFIGDIR=/tmp/matplotlib
WORKDIR /src
COPY pyproject.toml constraints.txt hack/images/requirements.py hack/images/install-trainer-deps.sh ./
# PyPI's default torch: the CUDA 13.0 build, as the base.
RUN sh install-trainer-deps.sh
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && rm -rf /src /wheels \
 && mkdir -p /home/llmtrain/.cache && chown -R 65532:65532 /home/llmtrain
WORKDIR /home/llmtrain
USER 65532:65532
ENTRYPOINT ["python", "-m", "llmtrain_trainer.launch.launcher"]
