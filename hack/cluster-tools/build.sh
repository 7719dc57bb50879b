#!/usr/bin/env bash
# Builds (or reuses) the pinned local-cluster binaries:
#   kube-apiserver kube-controller-manager kube-scheduler kubectl  (Kubernetes v1.36.3)
#   etcd (v3.6.16)   helm (v3.22.0)   minio (2026-02-12, the S3 server of the tests)
# and, only when named: kwok (v0.8.0, fake nodes) and training-operator (Kubeflow v1.8.1,
# the peer controller) for bench/operator_scale.py; kubelet, kubeadm and kube-proxy (the
# same Kubernetes), kind (v0.33.0), coredns (v1.15.0), crictl (v1.37.0) and kube-router
# (v2.1.0, its NetworkPolicy controller alone) for the kind bed (hack/kind/node-image.sh,
# hack/kind/up.sh)
# into $LLMTRAIN_CLUSTER_TOOLS (default: .cache/cluster-tools/<versions>/bin, git-ignored).
# Each tool is a Go module wrapper under hack/cluster-tools/<tool>/ with a committed
# go.sum; `go build` downloads modules from the Go module proxy on a cold cache.
#
# Usage: build.sh [tool...]   (default: all but the benchmark-only kwok and training-operator). Prints the bin directory as its last line.
# Concurrent runs are safe: each group of tools (minio, etcd, helm, the Kubernetes
# binaries) is built under its own lock, so a caller that needs only minio waits only for
# minio while another run builds the rest (the test suite starts one early, at low
# priority; see tests/support/prebuild.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
HELM_VERSION=v3.22.0
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
stamp="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}_minio-${MINIO_VERSION##*-}"
out=${LLMTRAIN_CLUSTER_TOOLS:-$root/.cache/cluster-tools/$stamp/bin}
mkdir -p "$out"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

k8s_version_flags() {
  local major=${K8S_VERSION#v}; major=${major%%.*}
  local minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
  local v="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  echo "$v -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$minor"
}
build_k8s() {
  (cd "$here/kubernetes" && go build -trimpath -ldflags "-s -w $(k8s_version_flags)" -o "$1/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
}
build_node() {
  (cd "$here/kubernetes" && go build -trimpath -ldflags "-s -w $(k8s_version_flags)" -o "$1/" \
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kube-proxy)
}
KIND_VERSION=v0.33.0
COREDNS_VERSION=v1.15.0
build_kind() { (cd "$here/kind" && go build -trimpath -ldflags "-s -w" -o "$1/kind" sigs.k8s.io/kind); }
build_crictl() {
  (cd "$here/crictl" && go build -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v1.37.0" \
      -o "$1/crictl" sigs.k8s.io/cri-tools/cmd/crictl)
}
build_kube-router() {
  (cd "$here/kube-router" && go build -trimpath -ldflags "-s -w" -o "$1/kube-router" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router)
}
build_coredns() { (cd "$here/coredns" && go build -trimpath -ldflags "-s -w" -o "$1/coredns" github.com/coredns/coredns); }
build_etcd() { (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$1/etcd" go.etcd.io/etcd/server/v3); }
build_helm() {
  # As helm's own Makefile does: the Kubernetes version that `helm template` and `helm lint`
  # assume without --kube-version is the client-go it is built with (v0.37 -> 1.37). Without
  # these flags it is v1.20, and every chart with a kubeVersion above it fails to render.
  (cd "$here/helm" && local client minor flags
   client=$(awk '$1 == "k8s.io/client-go" {print $2}' go.mod)  # pinned there (go.sum checks it)
   [ -n "$client" ] || { echo "cluster-tools: helm/go.mod names no k8s.io/client-go" >&2; exit 1; }
   minor=${client#v0.}; minor=${minor%%.*}
   flags="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
   flags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
   go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION $flags" \
      -o "$1/helm" helm.sh/helm/v3/cmd/helm)
}
build_kwok() { (cd "$here/kwok" && go build -trimpath -ldflags "-s -w" -o "$1/kwok" sigs.k8s.io/kwok/cmd/kwok); }
build_training-operator() {
  (cd "$here/training-operator" && go build -trimpath -ldflags "-s -w" -o "$1/training-operator" \
      github.com/kubeflow/training-operator/cmd/training-operator.v1)
}
build_minio() { (cd "$here/minio" && go build -trimpath -ldflags "-s -w" -o "$1/minio" github.com/minio/minio); }

# group -> its binaries. minio first: the S3 tests run before the cluster tests.
groups=(minio etcd helm k8s node kind coredns crictl kube-router kwok training-operator)
declare -A bins=([minio]="minio" [etcd]="etcd" [helm]="helm"
                 [k8s]="kube-apiserver kube-controller-manager kube-scheduler kubectl"
                 [node]="kubelet kubeadm kube-proxy" [kind]="kind" [coredns]="coredns" [crictl]="crictl"
                 [kube-router]="kube-router"
                 [kwok]="kwok" [training-operator]="training-operator")
all=" ${bins[*]} "
default="minio etcd helm kube-apiserver kube-controller-manager kube-scheduler kubectl"
wanted=" ${*:-$default} "
for tool in $wanted; do
  case "$all" in *" $tool "*) ;; *) echo "cluster-tools: no tool named $tool (known:$all)" >&2; exit 64 ;; esac
done

# The pins of these groups are in $stamp (a new version is a new folder); the others'
# are their wrapper's go.mod and go.sum and their build function (its flags), recorded
# beside their binaries (.GROUP.pin): a changed pin rebuilds the group in place.
stamped=" minio etcd k8s node "
pin_of() { { cat "$here/$1/go.mod" "$here/$1/go.sum" 2>/dev/null; declare -f "build_$1"; } | sha256sum | cut -c1-16; }

ensure() {  # ensure GROUP: build the group's missing (or outdated) binaries, under the group's lock
  local group=$1 tool missing=() started tmp pin=""
  exec 9>"$out/.$group.lock"
  flock 9  # waits while another run builds this group
  case "$stamped" in *" $group "*) ;; *) pin=$(pin_of "$group") ;; esac
  if [ -n "$pin" ] && [ "$(cat "$out/.$group.pin" 2>/dev/null)" != "$pin" ]; then
    read -r -a missing <<< "${bins[$group]}"
  else
    for tool in ${bins[$group]}; do [ -x "$out/$tool" ] || missing+=("$tool"); done
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    echo "cluster-tools: building ${missing[*]} into $out (a cold build takes several minutes)" >&2
    started=$(date +%s)
    # Into a scratch directory first and then renamed: a binary is never seen half-written.
    # (What a killed run left of this group is stale: only the lock holder builds it.)
    rm -rf "$out/.build-$group".*
    tmp=$(mktemp -d "$out/.build-$group.XXXXXX")
    "build_$group" "$tmp" 9>&-  # the lock stays with this script, not with go's children
    for tool in ${bins[$group]}; do mv -f "$tmp/$tool" "$out/$tool"; done
    rmdir "$tmp"
    [ -z "$pin" ] || echo "$pin" > "$out/.$group.pin"
    echo "cluster-tools: built ${missing[*]} in $(( $(date +%s) - started ))s" >&2
  fi
  exec 9>&-
}

for group in "${groups[@]}"; do
  for tool in ${bins[$group]}; do
    case "$wanted" in *" $tool "*) ensure "$group"; break ;; esac
  done
done
echo "$out"
