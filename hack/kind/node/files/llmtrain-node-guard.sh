#!/bin/sh
# Runs in each kind node before containerd and the kubelet (llmtrain-node-guard.service).
# A kind node is a privileged container: what it writes under /proc/sys outside the
# per-network-namespace net.* tree lands in the HOST's kernel. The kubelet writes six such
# settings at start (vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
# kernel.panic_on_oops, kernel.keys.root_maxkeys/root_maxbytes: k8s.io/component-helpers
# node/util/sysctl). Each is shadowed here by a bind-mounted file that already holds the
# value the kubelet wants, so it reads it, finds nothing to change and writes nothing.
# systemd-sysctl, which would apply every /etc/sysctl.d file (fs.protected_* included),
# is masked in the image; the node's own net.* settings are applied below instead.
set -eu
dir=/run/llmtrain-sysctl
mkdir -p "$dir"
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
          kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
  key=${kv%%=*}
  file="$dir/$(echo "$key" | tr / .)"
  echo "${kv#*=}" > "$file"
  grep -q " /proc/sys/$key " /proc/self/mountinfo || mount --bind "$file" "/proc/sys/$key"
done
# Per network namespace, so the node's own (kind's /etc/sysctl.d values, and forwarding
# for the pods' routes).
sysctl -q -w net.ipv4.ip_forward=1 net.ipv4.conf.all.route_localnet=1 net.ipv4.conf.all.arp_ignore=0 \
  net.ipv4.conf.default.rp_filter=1 net.ipv4.conf.all.rp_filter=1
