#!/usr/bin/env bash
# make images: the operator and trainer-cpu images, built here (docs/install.md,
# "Images"). Starts the engine when none runs (engine.sh), makes the Debian base once
# (base.sh), then builds each target with BuildKit, tagged as the chart and the
# examples name them (ghcr.io/llmtrain/{operator,trainer}:<chart appVersion>).
#
#   bash hack/images/build.sh [operator|trainer-cpu|python-torch ...]    # default: the first two
#
# The host's CA bundle reaches pip as the build secret `ca` (never a layer):
# LLMTRAIN_BUILD_CA, else $PIP_CERT, else Debian's bundle. LLMTRAIN_IMAGE_BASE picks
# another base (a registry's, pinned by digest).
set -euo pipefail
cd "$(dirname "$0")/../.."
DOCKER=/usr/bin/docker
export DOCKER_HOST=unix:///var/run/docker.sock DOCKER_BUILDKIT=1
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/llmtrain-operator/Chart.yaml)
# python-torch: a user's image for the end-to-end suite on kind (Dockerfile), not built by default.
declare -A TAGS=([operator]="ghcr.io/llmtrain/operator:$VERSION" [trainer-cpu]="ghcr.io/llmtrain/trainer:$VERSION" [python-torch]="localcluster.local/python-torch:1")
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(operator trainer-cpu)
for t in "${targets[@]}"; do
  [ -n "${TAGS[$t]:-}" ] || { echo "build.sh: unknown target '$t' (operator, trainer-cpu, python-torch)" >&2; exit 2; }
done

bash hack/images/engine.sh
mkdir -p .cache/docker  # the build logs (an engine that already ran made no state folder here)
base=${LLMTRAIN_IMAGE_BASE:-llmtrain/debian:bookworm}
[ "$base" != llmtrain/debian:bookworm ] || bash hack/images/base.sh

ca=${LLMTRAIN_BUILD_CA:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}
secret=()
[ -s "$ca" ] && secret=(--secret "id=ca,src=$ca")

for t in "${targets[@]}"; do
  start=$(date +%s)
  echo "build.sh: $t -> ${TAGS[$t]}" >&2
  old=$("$DOCKER" image inspect -f '{{.Id}}' "${TAGS[$t]}" 2>/dev/null || true)
  "$DOCKER" build --network host --progress plain "${secret[@]}" \
    --build-arg "BASE=$base" --target "$t" -t "${TAGS[$t]}" . > ".cache/docker/build-$t.log" 2>&1 \
    || { tail -30 ".cache/docker/build-$t.log" >&2; echo "build.sh: $t failed (log .cache/docker/build-$t.log)" >&2; exit 1; }
  size=$("$DOCKER" image inspect -f '{{.Size}}' "${TAGS[$t]}")
  # The build this tag named before, untagged now: removed, so that rebuilds do not pile
  # up on the disk (kept while a container or another tag still uses it).
  new=$("$DOCKER" image inspect -f '{{.Id}}' "${TAGS[$t]}")
  [ -z "$old" ] || [ "$old" = "$new" ] || "$DOCKER" rmi "$old" >/dev/null 2>&1 || true
  echo "build.sh: ${TAGS[$t]} built in $(( $(date +%s) - start )) s, $(( size / 1000000 )) MB" >&2
done
