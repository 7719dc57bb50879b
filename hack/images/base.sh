#!/usr/bin/env bash
# The images' base, made here from Debian's packages with no container registry
# (docs/install.md, "Images"): `debootstrap --variant=minbase bookworm` from the host's
# own Debian mirror, imported as llmtrain/debian:bookworm. Skipped when that image exists
# (LLMTRAIN_REBUILD_BASE=1 makes it again). Needs root and the engine (engine.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
DOCKER=/usr/bin/docker
TAG=${LLMTRAIN_BASE_TAG:-llmtrain/debian:bookworm}
if [ "${LLMTRAIN_REBUILD_BASE:-0}" != 1 ] && "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
  exit 0
fi
# The host's mirror (deb822 sources or a classic sources.list); Debian's CDN otherwise.
mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)\/*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
[ -n "$mirror" ] || mirror=$(sed -n 's/^deb \(\[[^]]*\] \)\{0,1\}\(http[^ ]*debian\)\/* bookworm .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -1)
mirror=${mirror:-http://deb.debian.org/debian}
root=$(mktemp -d "${TMPDIR:-/var/tmp}/llmtrain-base.XXXXXX")
trap 'rm -rf "$root"' EXIT
echo "base.sh: debootstrap bookworm from $mirror" >&2
debootstrap --variant=minbase bookworm "$root" "$mirror" > "$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# What a container base leaves out: apt's lists and caches, logs, the machine id.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/var/log/* "$root"/etc/machine-id
# apt inside a build must not try to fetch translations (a minbase has no locales).
echo 'Acquire::Languages "none";' > "$root/etc/apt/apt.conf.d/99llmtrain-no-translations"
tar -C "$root" --numeric-owner -c . | "$DOCKER" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$TAG" >/dev/null
echo "base.sh: $TAG ($("$DOCKER" image inspect -f '{{.Size}}' "$TAG") bytes)" >&2
