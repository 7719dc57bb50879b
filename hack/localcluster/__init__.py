"""The local cluster test bed: a real Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler built from pinned Go modules) plus a *process
node agent* that plays kubelet and container runtime, running pods as local processes
in their own network, mount and UTS namespaces.

Test infrastructure only; nothing in the product imports it. See docs/local-cluster.md.
"""
