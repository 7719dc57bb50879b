#!/usr/bin/env bash
# Prints the digest-pinned Debian base to use instead of the debootstrap one where a
# registry is reachable (LLMTRAIN_IMAGE_BASE=<printed> make images). Every image, the
# CUDA trainer included, builds on that one base.
# Needs `docker buildx` (or `crane`) and the registry; the project's CI machine has
# neither, so the pin is refreshed by hand and reviewed like any dependency bump.
set -euo pipefail
resolve() {
  if command -v crane >/dev/null; then crane digest "$1"
  else docker buildx imagetools inspect "$1" --format '{{printf "%s" .Manifest.Digest}}'; fi
}
check() { [[ $2 =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "pin-bases: $1: no digest (got '$2')" >&2; exit 1; }; }
debian=debian:bookworm-slim
digest=$(resolve "$debian"); check "$debian" "$digest"
echo "LLMTRAIN_IMAGE_BASE=${debian}@${digest}"
