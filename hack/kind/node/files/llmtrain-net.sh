#!/bin/sh
# The kind bed's pod network (kindnetd, kind's own, is not on the Go module proxy): a
# DaemonSet on every node's host network (hack/kind/node/manifests/default-cni.yaml).
# It writes this node's CNI config (ptp veths, host-local addresses from the node's
# podCIDR) and keeps a route to every other node's podCIDR through that node's address,
# as kindnetd does. All nodes share one Docker bridge, so a route is all a pod needs.
set -eu
: "${NODE_NAME:?}"
conf=/host/etc/cni/net.d/10-llmtrain.conflist
while :; do
  nodes=$(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}') || { sleep 2; continue; }
  echo "$nodes" | while read -r name cidr address; do
    [ -n "$cidr" ] && [ -n "$address" ] || continue
    if [ "$name" = "$NODE_NAME" ]; then
      want=$(cat <<JSON
{
  "cniVersion": "0.4.0",
  "name": "llmtrain",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "mtu": 1500,
     "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state", "ranges": [[{"subnet": "$cidr"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
)
      if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
        printf '%s\n' "$want" > "$conf.tmp" && mv "$conf.tmp" "$conf"
        echo "llmtrain-net: $conf for $cidr"
      fi
    else
      ip route replace "$cidr" via "$address"
    fi
  done
  sleep 5
done
