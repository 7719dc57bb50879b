#!/usr/bin/env bash
# The kind bed's node image, built here with no registry (docs/development.md, "Real
# nodes"): llmtrain/kind-node:<Kubernetes version>, holding in its containerd every image
# kubeadm and the bed start (the control plane, etcd, CoreDNS, kube-proxy, pause, the
# bed's CNI agent, its NetworkPolicy controller), all made from hack/cluster-tools' Go builds and Debian's packages.
#
#   bash hack/kind/node-image.sh      # prints the image's tag last
#
# Rebuilt only when an input changed (the image carries a hash of them as a label).
# Needs root; starts the engine (hack/images/engine.sh) and makes the base (base.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
DOCKER=/usr/bin/docker
export DOCKER_HOST=unix:///var/run/docker.sock DOCKER_BUILDKIT=1
ETCD_TAG=3.6.16-0        # the etcd hack/cluster-tools builds (v3.6.16)
COREDNS_TAG=v1.15.0      # the CoreDNS it builds
PAUSE_TAG=3.10.2         # Kubernetes' build/pause at the pinned version
NET_IMAGE=llmtrain/kind-net:v1
NETPOL_IMAGE=llmtrain/kind-netpol:v1
CTX=$ROOT/.cache/kind/node-context
log() { echo "node-image: $*" >&2; }

bash hack/images/engine.sh
bash hack/images/base.sh
bin=$(bash hack/cluster-tools/build.sh etcd kube-apiserver kube-controller-manager kube-scheduler kubectl \
      kubelet kubeadm kube-proxy coredns crictl kube-router | tail -1)
K8S=$("$bin/kubelet" --version | sed 's/^Kubernetes //')
TAG=llmtrain/kind-node:$K8S
moddir() { (cd "hack/cluster-tools/$1" && GOFLAGS=-mod=mod go mod download -json "$2" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'); }
KIND_FILES=$(moddir kind sigs.k8s.io/kind)/images/base/files
PAUSE_C=$(moddir kubernetes k8s.io/kubernetes)/build/pause/linux/pause.c

rm -rf "$CTX"; mkdir -p "$CTX/bin" "$CTX/llmtrain"
cp -r "$KIND_FILES" "$CTX/kind"; chmod -R u+w "$CTX/kind"
cp hack/kind/node/Dockerfile "$CTX/"
cp hack/kind/node/files/* "$CTX/llmtrain/"
cp -r hack/kind/node/manifests "$CTX/manifests"
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kubeadm kube-proxy coredns crictl kube-router; do
  cp "$bin/$b" "$CTX/bin/"
done
gcc -Os -Wall -static -DVERSION="v$PAUSE_TAG" -o "$CTX/bin/pause" "$PAUSE_C"

inputs=$( (cd "$CTX" && find . -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16)
if [ "$("$DOCKER" image inspect -f '{{index .Config.Labels "llmtrain.inputs"}}' "$TAG" 2>/dev/null)" = "$inputs" ]; then
  log "$TAG is up to date"; echo "$TAG"; exit 0
fi
started=$(date +%s)

# The images the node's containerd holds.
images=()
static_image() {  # static_image BINARY TAG: the binary alone on an empty base
  local dir; dir=$(mktemp -d)
  mkdir -p "$dir/usr/local/bin" "$dir/tmp" "$dir/etc"
  cp "$CTX/bin/$1" "$dir/usr/local/bin/"
  echo "nobody:x:65534:65534:nobody:/:/sbin/nologin" > "$dir/etc/passwd"
  tar -C "$dir" -c . | "$DOCKER" import --change 'ENV PATH=/usr/local/bin' \
    --change "ENTRYPOINT [\"/usr/local/bin/$1\"]" - "$2" >/dev/null
  rm -rf "$dir"; images+=("$2")
}
for c in kube-apiserver kube-controller-manager kube-scheduler; do static_image "$c" "registry.k8s.io/$c:$K8S"; done
static_image etcd "registry.k8s.io/etcd:$ETCD_TAG"
static_image coredns "registry.k8s.io/coredns/coredns:$COREDNS_TAG"
dir=$(mktemp -d); cp "$CTX/bin/pause" "$dir/"
tar -C "$dir" -c . | "$DOCKER" import --change 'USER 65535:65535' --change 'ENTRYPOINT ["/pause"]' - "registry.k8s.io/pause:$PAUSE_TAG" >/dev/null
rm -rf "$dir"; images+=("registry.k8s.io/pause:$PAUSE_TAG")
build() {  # build TARGET TAG
  "$DOCKER" build --network host --progress plain --target "$1" -t "$2" "$CTX" > "$ROOT/.cache/kind/build-$1.log" 2>&1 \
    || { tail -30 "$ROOT/.cache/kind/build-$1.log" >&2; log "$1 failed"; exit 1; }
}
build kube-proxy "registry.k8s.io/kube-proxy:$K8S"; images+=("registry.k8s.io/kube-proxy:$K8S")
build net "$NET_IMAGE"; images+=("$NET_IMAGE")
build netpol "$NETPOL_IMAGE"; images+=("$NETPOL_IMAGE")
build node "$TAG-bare"

# Into the node's containerd, as `kind build node-image` does: containerd started by
# hand in a node container (tini as PID 1 reaps it when it stops), the images imported unpacked later (no snapshot on an overlay
# upper), then the container committed.
name=llmtrain-node-build
"$DOCKER" rm -f "$name" >/dev/null 2>&1 || true
"$DOCKER" run -d --init --name "$name" --privileged --entrypoint sleep "$TAG-bare" infinity >/dev/null
trap '"$DOCKER" rm -f "$name" >/dev/null 2>&1 || true' EXIT
"$DOCKER" exec "$name" sh -c 'nohup containerd > /var/log/containerd-build.log 2>&1 &'
for _ in $(seq 60); do "$DOCKER" exec "$name" ctr version >/dev/null 2>&1 && break; sleep 0.5; done
"$DOCKER" save "${images[@]}" | "$DOCKER" exec -i "$name" ctr --namespace=k8s.io images import \
  --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests - >/dev/null
"$DOCKER" exec "$name" ctr --namespace=k8s.io images list -q | grep -v '^sha256:' | sort >&2
"$DOCKER" exec "$name" sh -c 'pkill containerd; while pgrep containerd >/dev/null; do sleep 0.2; done; rm -f /var/log/containerd-build.log'
"$DOCKER" commit --change 'ENTRYPOINT ["/usr/local/bin/llmtrain-node-entry.sh", "/usr/local/bin/entrypoint", "/sbin/init"]' --change 'CMD []' \
  --change "LABEL llmtrain.inputs=$inputs" "$name" "$TAG" >/dev/null
"$DOCKER" rm -f "$name" >/dev/null
"$DOCKER" rmi "$TAG-bare" >/dev/null
log "$TAG built in $(( $(date +%s) - started )) s, $(( $("$DOCKER" image inspect -f '{{.Size}}' "$TAG") / 1000000 )) MB"
echo "$TAG"
