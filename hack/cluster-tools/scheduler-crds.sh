#!/usr/bin/env bash
# Fetches the CRDs of the schedulers and queues the operator integrates with, from their
# own pinned Go modules on the module proxy (verified against the pinned h1 sums):
#   Volcano v1.10.0          scheduling.volcano.sh_podgroups.yaml
#   scheduler-plugins v0.28.9 scheduling.x-k8s.io_podgroups.yaml
#   Kueue v0.14.0            kueue.x-k8s.io_{workloads,resourceflavors}.yaml
# into $LLMTRAIN_SCHEDULER_CRDS (default .cache/scheduler-crds/<versions>, git-ignored),
# for the e2e tests that install them on the local cluster. Prints the directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
declare -A sums=(
  [volcano.sh/volcano@v1.10.0]="h1:+GzQinGgeV0j58WpWpxByOXgF+YfUPW55zghM8GqjF0="
  [sigs.k8s.io/scheduler-plugins@v0.28.9]="h1:1/bXRoXuSUFr1FLqxrzScdyZMl/G1psuDJcDKYxTo+Q="
  [sigs.k8s.io/kueue@v0.14.0]="h1:lDR34L42/k17opLfkZbZ+taymLaPpryj3ZBbvKqs/N4="
)
declare -A files=(
  [volcano.sh/volcano@v1.10.0]="config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml"
  [sigs.k8s.io/scheduler-plugins@v0.28.9]="config/crd/bases/scheduling.x-k8s.io_podgroups.yaml"
  [sigs.k8s.io/kueue@v0.14.0]="config/components/crd/bases/kueue.x-k8s.io_workloads.yaml config/components/crd/bases/kueue.x-k8s.io_resourceflavors.yaml"
)
out=${LLMTRAIN_SCHEDULER_CRDS:-$root/.cache/scheduler-crds/volcano-v1.10.0_scheduler-plugins-v0.28.9_kueue-v0.14.0}
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
printf 'module llmtrain.local/schedulercrds\n\ngo 1.22\n' > "$scratch/go.mod"
for module in "${!sums[@]}"; do
  missing=0
  for f in ${files[$module]}; do [ -s "$out/$(basename "$f")" ] || missing=1; done
  [ $missing = 1 ] || continue
  info=$(cd "$scratch" && GOFLAGS=-mod=mod go mod download -json "$module")
  sum=$(printf '%s' "$info" | sed -n 's/.*"Sum": "\(.*\)".*/\1/p')
  dir=$(printf '%s' "$info" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  if [ "$sum" != "${sums[$module]}" ]; then
    echo "scheduler-crds: $module has sum '$sum', pinned ${sums[$module]}" >&2
    printf '%s\n' "$info" >&2
    exit 1
  fi
  for f in ${files[$module]}; do
    cp "$dir/$f" "$out/.$(basename "$f").tmp" && mv -f "$out/.$(basename "$f").tmp" "$out/$(basename "$f")"
  done
done
echo "$out"
