#!/usr/bin/env bash
# System packages the test suites need, from Debian: a real Prometheus server (the
# end-to-end suite scrapes the operator and the trainers with it) and iproute2
# (network namespaces for the local cluster). Idempotent; needs root (CI runs as root).
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "system-deps: need ${need[*]} but not root; install them with apt-get" >&2
  exit 1
fi
echo "system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# One apt at a time: make test's background may be installing the Docker engine (engine.sh).
flock -w 900 /tmp/llmtrain-apt.lock apt-get update -qq
flock -w 900 /tmp/llmtrain-apt.lock apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The Debian package starts a Prometheus service where an init system runs; the tests
# start their own on another port, so that one is not needed.
