#!/usr/bin/env bash
# make kind-up: a kind cluster with real kubelets, containerd and runc, built here with no
# registry (docs/development.md, "Real nodes"): one control plane and hack/kindbed.py's
# four workers (a system node, three "GPU" nodes advertising nvidia.com/gpu), the
# project's images loaded into the nodes, and the host routes that let this machine reach
# the pods (the suite scrapes them). Prints the kubeconfig's path last.
#
#   bash hack/kind/up.sh        # make kind-down (hack/kind/down.sh) removes all of it
#   bash hack/kind/up.sh load   # rebuild the project's images, load them into the nodes
#
# Needs root. Refuses while the process-based local cluster runs (they share no ports, but
# each changes routing the other relies on). Fails, naming them, if creating the nodes
# changed any of the host's kernel settings that a node could reach (/proc/sys outside
# net.*): the node image shields what the kubelet writes (hack/kind/node/files).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CLUSTER=${LLMTRAIN_KIND_CLUSTER:-llmtrain}
STATE=${LLMTRAIN_KIND_STATE:-$ROOT/.cache/kind/bed}
started=$(date +%s)
log() { echo "kind-up: [+$(( $(date +%s) - started ))s] $*" >&2; }  # stamped: where the minutes go

if ip link show lcbr0 >/dev/null 2>&1; then
  log "the process-based local cluster is up (bridge lcbr0): make cluster-down first"; exit 1
fi
bash hack/images/engine.sh
bin=$(bash hack/cluster-tools/build.sh kind kubectl helm | tail -1)
export PATH=$bin:$PATH
node=$(bash hack/kind/node-image.sh | tail -1)
images_log=$ROOT/.cache/kind/images-build.log
mkdir -p "$(dirname "$images_log")"
if [ "${1:-}" = load ]; then
  bash hack/images/build.sh
else
  # The project's images build while kind creates the cluster, which is mostly kubeadm
  # waiting (the base image exists: node-image.sh made it, so the two never both make it).
  # A session of its own, so that its docker builds go with it when this script ends
  # early (the cluster's creation failed).
  setsid bash hack/images/build.sh > "$images_log" 2>&1 &
  images_pid=$!
  trap '[ -z "${images_pid:-}" ] || kill -- "-$images_pid" 2>/dev/null || true' EXIT
fi
images_built() {  # the background build's end, its output shown either way
  [ -n "${images_pid:-}" ] || return 0
  local pid=$images_pid
  images_pid=""
  if wait "$pid"; then cat "$images_log" >&2 || true; return 0; fi
  cat "$images_log" >&2 || true; log "the project's images did not build"; return 1
}
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/llmtrain-operator/Chart.yaml)

# The operator image into every worker, the trainer's (5.9 GB) only into the GPU pool's,
# where jobs run. Not `kind load`, which keeps two copies in each node and a tar on the
# host; here one saved file (or a save streamed) is imported in each node (import_into),
# containerd's layer blobs are dropped once unpacked ("prune references" then a synchronous
# GC, as the CRI's discard_unpacked_layers does for pulls), and the layers a node unpacked are then linked
# to an earlier node's copy (hack/kind/layerlinks.py): the GPU pool holds the trainer once.
SNAPSHOTS=/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots
layer_dirs() {  # NODE IMAGE: the host paths of IMAGE's layer snapshots in NODE, top first
  local n=$1 chain="" d vol
  for d in $(docker image inspect -f '{{range .RootFS.Layers}}{{.}} {{end}}' "$2"); do
    if [ -z "$chain" ]; then chain=$d; else chain=sha256:$(printf '%s %s' "$chain" "$d" | sha256sum | cut -d' ' -f1); fi
  done
  vol=$(docker inspect -f '{{range .Mounts}}{{if eq .Destination "/var"}}{{.Source}}{{end}}{{end}}' "$n")
  [ -n "$vol" ] || { log "$n has no /var volume"; return 1; }
  # A read-only view of the image's top layer: its mounts name every layer's folder.
  docker exec "$n" sh -c 'ctr -n k8s.io snapshots rm llmtrain-layers 2>/dev/null
    ctr -n k8s.io snapshots view llmtrain-layers "$1" >/dev/null && ctr -n k8s.io snapshots mounts /x llmtrain-layers
    rc=$?; ctr -n k8s.io snapshots rm llmtrain-layers; exit $rc' _ "$chain" \
    | { grep -o "$SNAPSHOTS/[0-9]*/fs" || true; } | sed "s|^/var|$vol|"
}
link_layers() {  # IMAGE FROM TO: TO's copy of IMAGE's layers made links to FROM's (a saving, never needed)
  local from to
  from=$(layer_dirs "$2" "$1") && to=$(layer_dirs "$3" "$1") || { log "cannot list the layers of $1 in $2 or $3: not linked"; return 1; }
  [ -n "$from" ] && [ "$(wc -l <<< "$from")" = "$(wc -l <<< "$to")" ] \
    || { log "$2 and $3 name different layers for $1: not linked"; return 1; }
  log "linking $3's layers of $1 to $2's"
  # shellcheck disable=SC2046
  .venv/bin/python hack/kind/layerlinks.py $(paste -d' ' <(echo "$from") <(echo "$to")) >&2
}
room() {  # IMAGE: fail, naming the numbers, unless a node can import IMAGE (blobs + unpacked)
  local size free need dir file
  size=$(docker image inspect -f '{{.Size}}' "$1")
  dir=$(docker info -f '{{.DockerRootDir}}')
  free=$(df --output=avail -B1 "$dir" | tail -1)
  # IMAGE's saved file counts as room: saved_if_room drops it when the import needs that
  file=$(bash hack/kind/saved-image.sh --path "$1")
  [ ! -s "$file" ] || free=$(( free + $(stat -c %s "$file") ))
  need=$(( 2 * size + 2000000000 ))
  [ "$free" -ge "$need" ] && return 0
  log "$(( free / 1000000000 )) GB free on $dir's filesystem; importing $1 into a node needs $(( need / 1000000000 )) GB (its layers twice while they unpack, and 2 GB): free some, or skip the kind stage (LLMTRAIN_KIND_SMOKE=0)"
  return 1
}
saved_if_room() {  # IMAGE: the path of IMAGE's saved file (made here if need be), when the
  # disk holds it beside a node's import (room below) with 2 GB to spare for the tests
  # that run beside the kind stage; else nothing, and no such file kept (CI's disk is
  # tight: it once ran out loading the trainer into the third node)
  local size free need file
  size=$(docker image inspect -f '{{.Size}}' "$1")
  free=$(df --output=avail -B1 "$(docker info -f '{{.DockerRootDir}}')" | tail -1)
  [[ $free =~ ^[0-9]+$ ]] || { log "the Docker root's free space unknown: $1 streamed"; free=0; }
  need=$(( 2 * size + 4000000000 ))
  file=$(bash hack/kind/saved-image.sh --path "$1")
  if [ -s "$file" ]; then
    [ "$free" -lt "$need" ] || { echo "$file"; return 0; }
    rm -f "$file"; log "$1's saved file removed: the imports need the room"; return 0
  fi
  [ "$free" -lt $(( need + size )) ] || bash hack/kind/saved-image.sh "$1" || log "saving $1 failed: streamed instead"
}
import_into() {  # NODE IMAGE: IMAGE into NODE's containerd, unpacked
  # From its saved file (hack/kind/saved-image.sh, made once) hard-linked into the node's
  # /var volume where the disk has room for the file, not `docker save | docker exec -i
  # ctr import -`: that makes a save per node and streamed at 24 MB/s in a full run here
  # (the trainer's 5.9 GB: 242-266 s a node; from the file 114-166 s, `kind-up` alone).
  local n=$1 vol file rc=0
  vol=$(docker inspect -f '{{range .Mounts}}{{if eq .Destination "/var"}}{{.Source}}{{end}}{{end}}' "$n")
  [ -n "$vol" ] || { log "$n has no /var volume"; return 1; }
  file=$(saved_if_room "$2")
  rm -f "$vol/llmtrain-import.tar"
  if [ -z "$file" ] || ! ln "$file" "$vol/llmtrain-import.tar" 2>/dev/null; then
    [ -z "$file" ] || log "$2's saved file cannot be linked into $n's volume: streamed"
    docker save "$2" | docker exec -i "$n" ctr --namespace=k8s.io images import --all-platforms --digests --snapshotter=overlayfs - >/dev/null
    return
  fi
  docker exec "$n" ctr --namespace=k8s.io images import --all-platforms --digests --snapshotter=overlayfs \
    /var/llmtrain-import.tar >/dev/null || rc=$?
  rm -f "$vol/llmtrain-import.tar"
  [ "$rc" = 0 ] || log "importing $2 into $n failed (exit $rc)"
  return "$rc"
}
load() {  # load IMAGE NODE...: into each node that lacks this build of it
  local image=$1 want old new n have="" need=(); shift
  want=$(docker image inspect -f '{{.Id}}' "$image")
  for n in "$@"; do
    old=$(docker exec "$n" crictl inspecti -o go-template --template '{{.status.id}}' "$image" 2>/dev/null || true)
    if [ "$old" = "$want" ]; then have=${have:-$n}; else need+=("$n"); fi
  done
  for n in ${need[@]+"${need[@]}"}; do
    room "$image"
    log "loading $image into $n"
    # the image this tag named before, removed once the tag moves (else it stays, by id)
    old=$(docker exec "$n" crictl inspecti -o go-template --template '{{.status.id}}' "$image" 2>/dev/null || true)
    import_into "$n" "$image"
    docker exec "$n" sh -c 'ctr -n k8s.io content prune references >/dev/null
      stale=$(ctr -n k8s.io images ls -q | grep "^import-" || true)
      [ -z "$stale" ] || ctr -n k8s.io images rm --sync $stale >/dev/null'
    new=$(docker exec "$n" crictl inspecti -o go-template --template '{{.status.id}}' "$image")
    log "$image is in $n"
    if [ -n "$old" ] && [ "$old" != "$new" ]; then docker exec "$n" crictl rmi "$old" >/dev/null || true; fi
    if [ -n "$have" ]; then link_layers "$image" "$have" "$n" || true; else have=$n; fi
  done
  rm -f "$(bash hack/kind/saved-image.sh --path "$image")"  # its nodes have it: the room back
}
load_project_images() {
  local workers gpu
  workers=$(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{.items[*].metadata.name}')
  gpu=$(kubectl get nodes -l llmtrain.io/pool=gpu -o jsonpath='{.items[*].metadata.name}')
  # shellcheck disable=SC2086
  load "ghcr.io/llmtrain/operator:$VERSION" $workers
  # shellcheck disable=SC2086
  load "ghcr.io/llmtrain/trainer:$VERSION" $gpu
  # A user's image (Python and torch, no project: the Dockerfile's python-torch) for the
  # suite's script jobs, only when asked (hack/kind/e2e.sh asks when the run includes
  # tests/e2e/test_scripts.py): its layers are the trainer's but one, yet the import
  # streams them all into each node, minutes that CI's smoke does not need.
  if [ "${LLMTRAIN_KIND_USER_IMAGE:-}" = 1 ]; then
    bash hack/images/build.sh python-torch
    # shellcheck disable=SC2086
    load "localcluster.local/python-torch:1" $gpu
  fi
  bash hack/kind/saved-image.sh rm  # (any other build's, a run cut short's)
}
if [ "${1:-}" = load ]; then
  export KUBECONFIG=$STATE/kubeconfig
  load_project_images
  exit 0
fi

snapshot() {  # the host's kernel settings a privileged node could write (not per netns)
  find /proc/sys/kernel /proc/sys/vm /proc/sys/fs -type f -perm -u+w 2>/dev/null \
    | grep -vE '/(random|ns_last_pid|inode-state|inode-nr|file-nr|dentry-state|aio-nr|stat_interval|dirty_)' \
    | sort | while read -r f; do printf '%s=%s\n' "$f" "$(tr '\n\t' '  ' 2>/dev/null < "$f")"; done
}
kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
rm -rf "$STATE"; mkdir -p "$STATE"
[ -e /lib/modules ] || { mkdir -p /lib/modules; touch "$STATE/.created-lib-modules"; }  # kind mounts it
snapshot > "$STATE/host-sysctl.before"
config=$(PYTHONPATH=hack .venv/bin/python -m kindbed "$STATE")
log "creating $CLUSTER from $node"
kind create cluster --name "$CLUSTER" --image "$node" --config "$config" --kubeconfig "$STATE/kubeconfig" --wait 240s >&2
log "$CLUSTER created"
export KUBECONFIG=$STATE/kubeconfig
images_built
load_project_images
# This machine reaches each node's pods through the node (the suite scrapes and reads them).
: > "$STATE/host-routes"
for n in $(kubectl get nodes -o jsonpath='{.items[*].metadata.name}'); do
  cidr=$(kubectl get node "$n" -o jsonpath='{.spec.podCIDR}')
  ip=$(docker inspect -f '{{.NetworkSettings.Networks.kind.IPAddress}}' "$n")
  ip route replace "$cidr" via "$ip"
  echo "$cidr" >> "$STATE/host-routes"
done
snapshot > "$STATE/host-sysctl.after"
if ! diff -u "$STATE/host-sysctl.before" "$STATE/host-sysctl.after" > "$STATE/host-sysctl.diff"; then
  log "the host's kernel settings changed while the nodes started:"; cat "$STATE/host-sysctl.diff" >&2; exit 1
fi
log "up in $(( $(date +%s) - started )) s: KUBECONFIG=$STATE/kubeconfig"
echo "$STATE/kubeconfig"
