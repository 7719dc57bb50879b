#!/usr/bin/env bash
# A Docker engine for the images and the kind bed, started here when none runs
# (docs/development.md, "Real nodes"). Debian's docker.io (dockerd 20.10, its own
# containerd and runc) and debootstrap are installed when missing (root, apt).
#
#   bash hack/images/engine.sh          # start (a no-op when an engine answers)
#   bash hack/images/engine.sh stop     # stop the engine this script started
#
# dockerd runs with --iptables=false --ip6tables=false --ip-forward=false --bridge=none:
# it changes nothing in the host's firewall or sysctls (a FORWARD policy of DROP left by
# dockerd would cut the process-based local cluster's bridged traffic afterwards). Builds
# use `--network host`; kind's node network is a plain bridge between the nodes.
#
# This VM's root lacks CAP_SYS_RESOURCE in its bounding set, and runc fails any container
# that asks for a capability the caller cannot grant (a --privileged kind node asks for
# all): the engine's default runtime is hack/images/runc-caps, which drops from the OCI
# spec the capabilities this machine cannot give, then runs the real runc.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
STATE=${LLMTRAIN_DOCKER_STATE:-$ROOT/.cache/docker}
SOCK=/var/run/docker.sock
export DOCKER_HOST=unix://$SOCK
DOCKER=/usr/bin/docker   # Debian's CLI: it drives BuildKit itself (no buildx plugin needed)

answers() { "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if [ "${1:-start}" = stop ]; then
  if [ -f "$STATE/dockerd.pid" ] && kill -0 "$(cat "$STATE/dockerd.pid")" 2>/dev/null; then
    pid=$(cat "$STATE/dockerd.pid")
    kill "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { echo "engine.sh: dockerd $pid did not stop" >&2; exit 1; }
    echo "engine.sh: dockerd stopped"
  fi
  rm -f "$STATE/dockerd.pid"
  exit 0
fi

need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
# An engine that already answers (a CI runner's, a developer's) is used as it is.
answers || { [ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker ]; } || need+=(docker.io)
if [ ${#need[@]} -gt 0 ]; then
  echo "engine.sh: installing ${need[*]} (Debian)" >&2
  export DEBIAN_FRONTEND=noninteractive
  # One apt at a time: make test runs hack/system-deps.sh meanwhile.
  flock -w 900 /tmp/llmtrain-apt.lock apt-get update -qq >&2
  # --no-install-recommends: no needrestart and friends; the engine is started below,
  # never by systemd (there is none on a CI runner like this one).
  flock -w 900 /tmp/llmtrain-apt.lock apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

if answers; then exit 0; fi
mkdir -p "$STATE"
install -m 0755 hack/images/runc-caps "$STATE/runc-caps"
# the wrapper runs the real runc by this path
ln -sf "$(command -v runc)" "$STATE/runc.real"
nohup /usr/sbin/dockerd \
  --data-root "${LLMTRAIN_DOCKER_ROOT:-/var/lib/docker}" \
  --pidfile "$STATE/dockerd.pid" \
  --iptables=false --ip6tables=false --ip-forward=false --bridge=none \
  --add-runtime "llmtrain-runc=$STATE/runc-caps" --default-runtime llmtrain-runc \
  > "$STATE/dockerd.log" 2>&1 &
for _ in $(seq 120); do
  answers && { echo "engine.sh: dockerd up (log $STATE/dockerd.log)" >&2; exit 0; }
  sleep 0.5
done
echo "engine.sh: dockerd did not answer in 60 s; its log's end:" >&2
tail -20 "$STATE/dockerd.log" >&2
exit 1
