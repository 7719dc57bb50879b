#!/usr/bin/env bash
# make test-kind: the end-to-end suite on the kind bed (docs/development.md, "Real
# nodes"). Brings the bed up (hack/kind/up.sh: images, node image and cluster built here,
# no registry), runs the same tests as the process bed with LLMTRAIN_E2E_BED=kind (the
# suite drives the nodes through hack/kindbed.py), and takes the bed down again
# (hack/kind/down.sh; KEEP_CLUSTER=1 keeps it).
#
#   bash hack/kind/e2e.sh [pytest args...]     # default: tests/e2e
#
# Needs root (the engine, the host routes to the pods) and the project's venv (make setup).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CLUSTER=${LLMTRAIN_KIND_CLUSTER:-llmtrain}
STATE=${LLMTRAIN_KIND_STATE:-$ROOT/.cache/kind/bed}
[ "$(id -u)" = 0 ] || { echo "hack/kind/e2e.sh: needs root (run it with sudo -E)" >&2; exit 2; }
bash hack/system-deps.sh >/dev/null  # Prometheus: the suite scrapes with a real one
# Down whatever happens, a bed that failed half-way up included: nothing is left running.
cleanup() { [ "${KEEP_CLUSTER:-}" = 1 ] || bash hack/kind/down.sh; }
trap cleanup EXIT
# The script jobs run in a user's image without the project: loaded only for a run that has them.
case " ${*:-tests/e2e} " in
  *test_scripts*|*" tests/e2e "*|*" tests/e2e/ "*) export LLMTRAIN_KIND_USER_IMAGE=1 ;;
esac
bash hack/kind/up.sh >/dev/null
bin=$(bash hack/cluster-tools/build.sh kind kubectl helm | tail -1)
LLMTRAIN_E2E_BED=kind LLMTRAIN_KIND_CLUSTER="$CLUSTER" LLMTRAIN_KIND_STATE="$STATE" LLMTRAIN_KIND_BIN="$bin" \
  PATH="$bin:$PATH" .venv/bin/pytest -p no:cacheprovider -m "e2e or kind" "${@:-tests/e2e}"
