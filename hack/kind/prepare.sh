#!/usr/bin/env bash
# What the kind bed needs before it has a cluster, made ahead of it: the Docker engine
# (hack/images/engine.sh), the Debian base, the node image (node-image.sh, which needs
# hack/cluster-tools' Go builds) and the project's images (hack/images/build.sh), saved
# into the files the nodes import (saved-image.sh).
# hack/kind/up.sh then finds each up to date and goes straight to creating the cluster.
#
#   bash hack/kind/prepare.sh
#
# `make test` runs it in the background, after its Go tools build, while its stages run
# (the full one on the process bed): none of it touches the host's routes, firewall or bridges
# (engine.sh starts dockerd with none of those, builds use the host's network), so it may
# run beside the process bed, which `make kind-up` may not. Each step is skipped when its
# result is current, so a second run costs seconds. Needs root.
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$(date +%s)
bash hack/images/engine.sh
bash hack/kind/node-image.sh >/dev/null
bash hack/images/build.sh
# Saved into the files the nodes import (hack/kind/saved-image.sh), where the disk has room
# for them beside a node's import and 10 GB for the tests still running (else up.sh decides).
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/llmtrain-operator/Chart.yaml)
for image in "ghcr.io/llmtrain/operator:$VERSION" "ghcr.io/llmtrain/trainer:$VERSION"; do
  size=$(/usr/bin/docker image inspect -f '{{.Size}}' "$image")
  free=$(df --output=avail -B1 "$(/usr/bin/docker info -f '{{.DockerRootDir}}')" | tail -1)
  if [ "$free" -ge $(( 3 * size + 12000000000 )) ]; then
    bash hack/kind/saved-image.sh "$image" >/dev/null
  else
    echo "prepare.sh: $image not saved ahead: $(( free / 1000000000 )) GB free" >&2
  fi
done
echo "prepare.sh: the kind bed's engine and images ready in $(( $(date +%s) - started )) s" >&2
