#!/usr/bin/env bash
# Re-pins the Dockerfile's registry base (CUDA_BASE) to the digest its tag points at now,
# and prints the digest-pinned Debian base to use instead of the debootstrap one where a
# registry is reachable (LLMTRAIN_IMAGE_BASE=<printed> make images).
# Needs `docker buildx` (or `crane`) and the registries; the project's CI machine has
# neither, so the pins are refreshed by hand and reviewed like any dependency bump.
set -euo pipefail
cd "$(dirname "$0")/../.."
resolve() {
  if command -v crane >/dev/null; then crane digest "$1"
  else docker buildx imagetools inspect "$1" --format '{{printf "%s" .Manifest.Digest}}'; fi
}
check() { [[ $2 =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "pin-bases: $1: no digest (got '$2')" >&2; exit 1; }; }
line=$(grep -E "^ARG CUDA_BASE=" Dockerfile) || { echo "pin-bases: no ARG CUDA_BASE in the Dockerfile" >&2; exit 1; }
ref=${line#ARG CUDA_BASE=}
tag=${ref%%@*}
digest=$(resolve "$tag"); check "$tag" "$digest"
sed -i "s|^ARG CUDA_BASE=.*|ARG CUDA_BASE=${tag}@${digest}|" Dockerfile
echo "CUDA_BASE: ${tag}@${digest}"
debian=debian:bookworm-slim
digest=$(resolve "$debian"); check "$debian" "$digest"
echo "LLMTRAIN_IMAGE_BASE=${debian}@${digest}"
