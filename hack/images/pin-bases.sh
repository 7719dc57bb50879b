#!/usr/bin/env bash
# Re-pins the Dockerfile's base images to the digests their tags point at now.
# Needs `docker buildx` (or `crane`) and the registries; the project's CI machine has
# neither, so the pins are refreshed by hand and reviewed like any dependency bump.
set -euo pipefail
cd "$(dirname "$0")/../.."
resolve() {
  if command -v crane >/dev/null; then crane digest "$1"
  else docker buildx imagetools inspect "$1" --format '{{printf "%s" .Manifest.Digest}}'; fi
}
for arg in PYTHON_BASE CUDA_BASE; do
  line=$(grep -E "^ARG ${arg}=" Dockerfile) || { echo "pin-bases: no ARG ${arg} in the Dockerfile" >&2; exit 1; }
  ref=${line#ARG ${arg}=}
  tag=${ref%%@*}
  digest=$(resolve "$tag")
  [[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "pin-bases: ${tag}: no digest (got '${digest}')" >&2; exit 1; }
  sed -i "s|^ARG ${arg}=.*|ARG ${arg}=${tag}@${digest}|" Dockerfile
  echo "${arg}: ${tag}@${digest}"
done
