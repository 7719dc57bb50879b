#!/bin/sh
# The node container's first program, before kind's entrypoint and systemd. A kind node is
# a privileged container, so /proc/sys/fs is the HOST's: systemd, as PID 1, raises
# fs.file-max (and fs.nr_open) at its start (Debian's build bumps them), which changed this
# host's fs.file-max from 2466252 to 2^63-1 on the first `make kind-up` of a fresh
# machine. A systemd unit runs too late for that, so each is shadowed here by a file
# bind-mounted over it, holding the host's value: systemd reads it and writes into the file,
# not the kernel. (llmtrain-node-guard.sh does the same for what the kubelet writes.)
set -eu
dir=/run/llmtrain-sysctl
mkdir -p "$dir"
for key in fs/file-max fs/nr_open; do
  file="$dir/$(echo "$key" | tr / .)"
  cat "/proc/sys/$key" > "$file"
  grep -q " /proc/sys/$key " /proc/self/mountinfo || mount --bind "$file" "/proc/sys/$key"
done
exec "$@"
