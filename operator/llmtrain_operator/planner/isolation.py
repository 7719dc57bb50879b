"""Who may reach a job's pods over the network: the per-job NetworkPolicy's inputs.

A job's rendezvous store (its TCPStore and lease ports) and its workers (rank 0's
process-group store, the collectives, the launcher's health port, the ranks' metrics)
accept any client that reaches them, and torchrun unpickles what it reads from the store:
on a shared cluster a pod of any namespace that can connect could run code in every worker.
The operator therefore gives each job a NetworkPolicy (``manifests.network_policy``) that
admits, on every port, only the job's own pods, and on the health and metrics ports only
the operator's pods and the readers named to scrape them (Prometheus: its namespace, or
its address range). It is enforced by the cluster's network plugin; a plugin that
enforces none ignores it.

Pure: the chart passes these as ``LLMTRAIN_OPERATOR_*`` settings (``settings.py``)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_KEY = re.compile(rf"^({_DNS_SUBDOMAIN}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""The label every namespace carries with its own name (Kubernetes >= 1.22): how a
policy names a namespace."""


class IsolationError(ValueError):
    """A setting that cannot make a valid policy (the message names what is wrong)."""


@dataclass(frozen=True)
class Isolation:
    """The policy's peers apart from the job's own pods."""

    operator_namespace: str
    """Where the operator's pods run (their ``POD_NAMESPACE``)."""
    operator_labels: tuple[tuple[str, str], ...]
    """Labels that select the operator's pods (the chart's selector labels)."""
    metrics_from: tuple[str, ...] = ()
    """Who else may read the health and metrics ports: namespaces (their pods; a
    Prometheus in the cluster) by name, and address ranges (CIDRs: a Prometheus outside
    it, or on a node's own network, which no namespace selects)."""

    def metrics_peers(self) -> list[dict[str, object]]:
        """``metrics_from`` as NetworkPolicy peers."""
        return [{"ipBlock": {"cidr": entry}} if "/" in entry else
                {"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: entry}}} for entry in self.metrics_from]

    @classmethod
    def parse(cls, operator_namespace: str, pod_selector: str, metrics_from: str) -> Isolation:
        """From the settings' words: ``pod_selector`` as ``key=value,key=value``,
        ``metrics_from`` comma-separated namespace names and CIDRs. IsolationError naming
        the bad part: a policy that selected the wrong peers would cut the operator off its
        jobs (or open them), so nothing is guessed."""
        if not _NAMESPACE.match(operator_namespace):
            raise IsolationError(f"the operator's namespace {operator_namespace!r} is not a namespace name")
        labels = []
        for part in (p.strip() for p in pod_selector.split(",") if p.strip()):
            key, sep, value = part.partition("=")
            if not sep or not _LABEL_KEY.match(key.strip()) or not _LABEL_VALUE.match(value.strip()):
                raise IsolationError(f"{part!r} is not a label key=value")
            labels.append((key.strip(), value.strip()))
        if not labels:
            raise IsolationError("no label selects the operator's pods: every pod of its namespace would be let in")
        readers = []
        for entry in (n.strip() for n in metrics_from.split(",") if n.strip()):
            if "/" in entry:
                try:
                    readers.append(str(ipaddress.ip_network(entry)))
                except ValueError as err:
                    raise IsolationError(f"{entry!r} is not an address range: {err}") from None
            elif _NAMESPACE.match(entry):
                readers.append(entry)
            else:
                raise IsolationError(f"{entry!r} is neither a namespace name nor an address range (CIDR)")
        return cls(operator_namespace, tuple(labels), tuple(readers))
