#!/usr/bin/env bash
# The end-to-end suite on kind, for a machine with Docker (and the GitHub workflow
# .github/workflows/kind-e2e.yml). Only the bootstrap differs from the local cluster:
# the suite drives the kind cluster through hack/kindbed.py (docs/development.md, "kind").
#
#   bash hack/kind/e2e.sh [pytest args...]     # default: tests/e2e
#
# Needs docker, kind, kubectl and helm on PATH, and the project's venv (make setup).
# Builds the operator and trainer-cpu images, loads them into the cluster, runs the
# suite, and deletes the cluster (KEEP_CLUSTER=1 keeps it).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CLUSTER=${LLMTRAIN_KIND_CLUSTER:-llmtrain}
STATE=${LLMTRAIN_KIND_STATE:-$ROOT/.cache/kind}
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/llmtrain-operator/Chart.yaml)
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "hack/kind/e2e.sh: $tool is not on PATH" >&2; exit 2; }
done

echo "== images (tag $VERSION)"
docker build --target operator -t "ghcr.io/llmtrain/operator:$VERSION" .
docker build --target trainer-cpu -t "ghcr.io/llmtrain/trainer:$VERSION" .

echo "== cluster $CLUSTER (state in $STATE)"
kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
sudo rm -rf "$STATE" 2>/dev/null || rm -rf "$STATE"
CONFIG=$(PYTHONPATH=hack .venv/bin/python -m kindbed "$STATE")
kind create cluster --name "$CLUSTER" --config "$CONFIG" --kubeconfig "$STATE/kubeconfig" --wait 180s
cleanup() { [ "${KEEP_CLUSTER:-}" = 1 ] || kind delete cluster --name "$CLUSTER"; }
trap cleanup EXIT
kind load docker-image --name "$CLUSTER" "ghcr.io/llmtrain/operator:$VERSION" "ghcr.io/llmtrain/trainer:$VERSION"
export KUBECONFIG=$STATE/kubeconfig
# The shared tier's ReadWriteMany claims are served by hack/kindbed.py's provisioner:
# kind's default class (node-local, ReadWriteOnce) must not take them first.
kubectl annotate storageclass standard storageclass.kubernetes.io/is-default-class- >/dev/null
# The tests scrape pods (Prometheus) and reach their volumes from this host: route each
# node's pod range through the node.
for node in $(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'); do
  cidr=$(kubectl get node "$node" -o jsonpath='{.spec.podCIDR}')
  ip=$(docker inspect -f '{{.NetworkSettings.Networks.kind.IPAddress}}' "$node")
  sudo ip route replace "$cidr" via "$ip"
done

echo "== the suite"
# Root: the pods write their volumes as uid 65532, and some tests write into them.
sudo -E env "PATH=$PATH" LLMTRAIN_E2E_BED=kind LLMTRAIN_KIND_CLUSTER="$CLUSTER" LLMTRAIN_KIND_STATE="$STATE" \
  LLMTRAIN_KIND_BIN="$(dirname "$(command -v kubectl)")" \
  .venv/bin/pytest -p no:cacheprovider -m e2e "${@:-tests/e2e}"
