#!/usr/bin/env bash
# make kind-down: deletes the kind bed (hack/kind/up.sh) and what it added to the host
# (its routes, kind's Docker network, a /lib/modules it had to create), then stops the
# Docker engine if hack/images/engine.sh started it. Safe to run when nothing is up.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CLUSTER=${LLMTRAIN_KIND_CLUSTER:-llmtrain}
STATE=${LLMTRAIN_KIND_STATE:-$ROOT/.cache/kind/bed}
bin=$(ls -d .cache/cluster-tools/*/bin 2>/dev/null | head -1)
if [ -n "$bin" ] && [ -x "$bin/kind" ] && /usr/bin/docker version >/dev/null 2>&1; then
  PATH=$bin:$PATH kind delete cluster --name "$CLUSTER" >&2 || true
  /usr/bin/docker network rm kind >/dev/null 2>&1 || true
fi
if /usr/bin/docker version >/dev/null 2>&1; then bash hack/kind/saved-image.sh rm || true; fi  # a load cut short leaves them
if [ -f "$STATE/host-routes" ]; then
  while read -r cidr; do ip route del "$cidr" 2>/dev/null || true; done < "$STATE/host-routes"
  rm -f "$STATE/host-routes"
fi
if [ -f "$STATE/.created-lib-modules" ]; then rmdir /lib/modules 2>/dev/null || true; rm -f "$STATE/.created-lib-modules"; fi
[ "${LLMTRAIN_KEEP_ENGINE:-0}" = 1 ] || bash hack/images/engine.sh stop
