# Three images from one Dockerfile (docs/install.md, "Images"):
#   bash hack/images/build.sh            # make images: operator and trainer-cpu, here
#   docker build --target trainer-cuda -t ghcr.io/llmtrain/trainer:0.1.0-cuda .
# operator: kopf and the Kubernetes client, no torch. trainer-cpu: torch and gloo (kind,
# CI, the examples' default tag). trainer-cuda: the same base, PyPI's CUDA torch, no op
# compiled anywhere. Every image runs as uid 65532. A fourth target, python-torch, is a
# user's image for the end-to-end suite on kind (at the end), never published.
# Dependencies are installed before the project (a wheel built in its own stage) comes
# in: a code edit rebuilds the wheel and the last layer, never the torch layer.
# No `# syntax=` line: that would pull the Dockerfile frontend from a registry, and the
# machines this project builds on may have none; the engine's built-in frontend is used.
#
# BASE: Debian bookworm. hack/images/base.sh makes `llmtrain/debian:bookworm` with
# debootstrap from Debian's own packages (no registry needed); where a registry is
# reachable, pass a digest-pinned one instead (`--build-arg BASE=debian:bookworm-slim@sha256:...`,
# resolved by hack/images/pin-bases.sh). Python is Debian's python3 (3.11) in a venv.
ARG BASE=llmtrain/debian:bookworm
# The torch wheel index for trainer-cpu: empty means PyPI (on Linux its torch is the CUDA
# build, several GB, and it runs on CPU); PyTorch's CPU index is far smaller where it is
# reachable (`--build-arg TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu`).
ARG TORCH_CPU_INDEX=""

# ---------------------------------------------------------------- Python on the base
# pip reaches PyPI through whatever TLS interception the build machine has only through
# the build secret `ca` (a CA bundle, `--secret id=ca,src=...`): a secret is mounted for one
# RUN and never stored in a layer. Without it, the image's own CA list is used.
FROM ${BASE} AS python
# The images' user, uid/gid 65532, named: kopf's peering and Python's getpass ask the
# password database who runs them, and a uid with no entry there raises KeyError (found
# when the operator first ran on a real kubelet).
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv \
 && groupadd --gid 65532 llmtrain && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /home/llmtrain \
      --shell /usr/sbin/nologin llmtrain
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN --mount=type=secret,id=ca,target=/run/secrets/ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip install pip==26.3 setuptools==84.2.1 wheel==0.48.0

# ---------------------------------------------------------------- what each layer installs
# Small pinned files (hack/images/requirements.py): a layer is rebuilt only when what it
# installs changes, never for a test marker or a dev pin in pyproject.toml.
FROM python AS requirements
COPY pyproject.toml constraints.txt hack/images/requirements.py /src/
RUN python /src/requirements.py /req

# ---------------------------------------------------------------- the project, as a wheel
# Pure Python: one wheel for every image.
FROM python AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY common/ common/
COPY operator/ operator/
COPY trainer_image/ trainer_image/
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .

# ---------------------------------------------------------------- operator
FROM python AS operator
COPY --from=requirements /req/constraints.txt /req/operator.txt /req/
RUN --mount=type=secret,id=ca,target=/run/secrets/ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip install -c /req/constraints.txt -r /req/operator.txt
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && rm -rf /wheels /req
USER 65532:65532
ENTRYPOINT ["kopf", "run", "--standalone", "-m", "llmtrain_operator.handlers"]

# ---------------------------------------------------------------- trainer, CPU
FROM python AS trainer-cpu
ARG TORCH_CPU_INDEX
# gcc/g++ build DeepSpeed's CPU op at first use (DS_ACCELERATOR=cpu, see docs/trainer.md).
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ python3-dev && rm -rf /var/lib/apt/lists/*
ENV DS_ACCELERATOR=cpu \
    HOME=/home/llmtrain TORCH_EXTENSIONS_DIR=/home/llmtrain/.cache/torch_extensions MPLCONFIGDIR=/tmp/matplotlib
# torch first and alone (several GB): built once, kept while only code or other pins change.
COPY --from=requirements /req/torch.txt /req/
RUN --mount=type=secret,id=ca,target=/run/secrets/ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip install ${TORCH_CPU_INDEX:+--index-url "$TORCH_CPU_INDEX"} -r /req/torch.txt
COPY --from=requirements /req/constraints.txt /req/trainer.txt /req/deepspeed.txt /req/
RUN --mount=type=secret,id=ca,target=/run/secrets/ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip install -c /req/constraints.txt -r /req/trainer.txt \
 && DS_BUILD_OPS=0 pip install -c /req/constraints.txt --no-build-isolation -r /req/deepspeed.txt
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && rm -rf /wheels /req \
 && mkdir -p /home/llmtrain/.cache && chown -R 65532:65532 /home/llmtrain
WORKDIR /home/llmtrain
USER 65532:65532
ENTRYPOINT ["python", "-m", "llmtrain_trainer.launch.launcher"]

# ---------------------------------------------------------------- trainer, CUDA
# The same Debian base: PyPI's torch carries its CUDA runtime (the nvidia-* wheels), and
# the node's driver comes in through the NVIDIA container toolkit. No nvcc and no CUDA
# base image: the trainer compiles no op (torch's fused AdamW, also under DeepSpeed;
# bench/gpu.py checks that a fresh process builds nothing), and no registry is needed.
# PyPI's torch 2.13 is the CUDA 13.0 build: it needs an R580 or newer driver. For older
# drivers, build from a CUDA 12 index of PyTorch's where it is reachable
# (`--build-arg TORCH_CUDA_INDEX=https://download.pytorch.org/whl/cu128`: CUDA 12 runs on R525
# and newer through minor-version compatibility; docs/install.md, "Images").
FROM python AS trainer-cuda
ARG TORCH_CUDA_INDEX=""
ENV HOME=/home/llmtrain MPLCONFIGDIR=/tmp/matplotlib
COPY --from=requirements /req/torch.txt /req/
RUN --mount=type=secret,id=ca,target=/run/secrets/ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip install ${TORCH_CUDA_INDEX:+--index-url "$TORCH_CUDA_INDEX"} -r /req/torch.txt
COPY --from=requirements /req/constraints.txt /req/trainer.txt /req/deepspeed.txt /req/
RUN --mount=type=secret,id=ca,target=/run/secrets/ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip install -c /req/constraints.txt -r /req/trainer.txt \
 && DS_BUILD_OPS=0 pip install -c /req/constraints.txt --no-build-isolation -r /req/deepspeed.txt
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && rm -rf /wheels /req \
 && mkdir -p /home/llmtrain/.cache && chown -R 65532:65532 /home/llmtrain
WORKDIR /home/llmtrain
USER 65532:65532
ENTRYPOINT ["python", "-m", "llmtrain_trainer.launch.launcher"]

# ---------------------------------------------------------------- a user's image (tests)
# Python and torch with no copy of this project, as a user's own image would be: the
# end-to-end suite's script jobs on kind run in it (tests/e2e/test_scripts.py; the process
# bed makes its own, hack/localcluster/images.py). The trainer-cpu image with the project
# uninstalled: its layers are the trainer's, so a node that holds the trainer adds one
# small layer. Not published.
FROM trainer-cpu AS python-torch
USER root
RUN pip uninstall -y llmtrain-operator && ! python -c "import llmtrain_trainer" 2>/dev/null
USER 65532:65532
ENTRYPOINT ["python"]
