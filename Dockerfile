# Two images from one Dockerfile:
#   docker build --target operator -t llmtrain-operator:0.1.0 .
#   docker build --target trainer  -t llmtrain-trainer:0.1.0 .
# The operator image has no torch; the trainer image has no kopf/kubernetes client.
# (No Docker engine runs on the project's CI machine; the kind workflow builds these.)

FROM python:3.11-slim AS base
ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY common/ common/
COPY operator/ operator/
COPY trainer_image/ trainer_image/

FROM base AS operator
RUN pip install -c constraints.txt '.[operator]'
USER 65532:65532
ENTRYPOINT ["kopf", "run", "--standalone", "-m", "llmtrain_operator.handlers"]

FROM base AS trainer
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ && rm -rf /var/lib/apt/lists/*
# torch first, then DeepSpeed against it without build isolation (it has no wheel).
RUN pip install -c constraints.txt torch && pip install -c constraints.txt '.[trainer]' \
 && DS_BUILD_OPS=0 pip install -c constraints.txt --no-build-isolation deepspeed
ENTRYPOINT ["python", "-m", "llmtrain_trainer.launcher"]
