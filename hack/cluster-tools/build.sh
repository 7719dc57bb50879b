#!/usr/bin/env bash
# Builds (or reuses) the pinned local-cluster binaries:
#   kube-apiserver kube-controller-manager kube-scheduler kubectl  (Kubernetes v1.36.3)
#   etcd (v3.6.16)   helm (v3.22.0)   minio (2026-02-12, the S3 server of the tests)
# into $LLMTRAIN_CLUSTER_TOOLS (default: .cache/cluster-tools/<versions>/bin, git-ignored).
# Each tool is a Go module wrapper under hack/cluster-tools/<tool>/ with a committed
# go.sum; `go build` downloads modules from the Go module proxy on a cold cache.
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
want=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd helm minio)
missing=()
for tool in "${want[@]}"; do [ -x "$out/$tool" ] || missing+=("$tool"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$out"
  exit 0
fi
export CGO_ENABLED=0 GOFLAGS=-mod=mod
started=$(date +%s)
build_k8s() {
  local major=${K8S_VERSION#v}; major=${major%%.*}
  local minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
  local v="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  v="$v -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  (cd "$here/kubernetes" && go build -trimpath -ldflags "-s -w $v" -o "$out/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
}
echo "cluster-tools: building ${missing[*]} into $out (a cold build takes several minutes)" >&2
case " ${missing[*]} " in *kube*) build_k8s ;; esac
case " ${missing[*]} " in *" etcd "*)
  (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3) ;; esac
case " ${missing[*]} " in *" helm "*)
  (cd "$here/helm" && go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" -o "$out/helm" helm.sh/helm/v3/cmd/helm) ;; esac
case " ${missing[*]} " in *" minio "*)
  (cd "$here/minio" && go build -trimpath -ldflags "-s -w" -o "$out/minio" github.com/minio/minio) ;; esac
echo "cluster-tools: built in $(( $(date +%s) - started ))s" >&2
echo "$out"
