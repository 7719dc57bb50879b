#!/usr/bin/env bash
# `docker save` of a project image into a file on the Docker root's filesystem, made once
# per build of the image (the file is named by its id). hack/kind/up.sh hard-links it into
# each node's /var volume, on the same filesystem, and imports it there, where the disk
# has room for it (else it streams a save into each node): a save per node cost a minute
# of both cores for the trainer's 5.9 GB each time.
#
#   bash hack/kind/saved-image.sh IMAGE          # saved unless it is; prints the file's path
#   bash hack/kind/saved-image.sh --path IMAGE   # prints where it is or would be
#   bash hack/kind/saved-image.sh rm             # every such file removed
set -euo pipefail
dir=$(/usr/bin/docker info -f '{{.DockerRootDir}}')/llmtrain-saved
if [ "$1" = rm ]; then rm -rf "$dir"; exit 0; fi
only_path=0
if [ "$1" = --path ]; then only_path=1; shift; fi
id=$(/usr/bin/docker image inspect -f '{{.Id}}' "$1")
id=${id#sha256:}
name=$(printf '%s' "$1" | tr -c 'A-Za-z0-9._-' '_')
file=$dir/$name.${id:0:16}.tar
if [ "$only_path" = 0 ] && [ ! -s "$file" ]; then
  mkdir -p "$dir"
  rm -f "$dir/$name".????????????????.tar "$dir/$name".????????????????.tar.partial  # an earlier build's
  /usr/bin/docker save -o "$file.partial" "$1" || { rm -f "$file.partial"; exit 1; }
  mv "$file.partial" "$file"
fi
echo "$file"
