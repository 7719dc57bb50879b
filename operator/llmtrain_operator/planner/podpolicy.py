"""What a job's ``podTemplate`` may ask of its pods, by the cluster admin's choice.

``podTemplate`` is merged into every worker pod (and its ``securityContext`` into the
store pod): without a check, creating an LLMTrainJob is creating any pod, privileged,
on the host's namespaces, with a node's files or another service account's token.
The operator's settings decide (``LLMTRAIN_OPERATOR_ALLOW_PRIVILEGED_PODS``,
``..._ALLOWED_SERVICE_ACCOUNTS``; the chart's ``jobPods`` values); a template that asks
for more is refused, each field named, and the job is ``Invalid`` until it changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALLOWED_CAPABILITIES = frozenset({"SYS_PTRACE", "IPC_LOCK"})
"""Capabilities a template may add without privilege: py-spy's on older runtimes
(docs/install.md, "Pod Security of the jobs' pods") and RDMA's (pinned memory for
InfiniBand and RoCE)."""
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")


@dataclass(frozen=True)
class PodPolicy:
    allow_privileged: bool = False
    """Accept privileged containers, host namespaces, hostPath volumes and added
    capabilities beyond ``ALLOWED_CAPABILITIES``."""
    service_accounts: frozenset[str] = frozenset()
    """Service accounts a template may name; ``*`` for any."""

    @classmethod
    def from_settings(cls, allow_privileged: bool, service_accounts: str) -> PodPolicy:
        return cls(allow_privileged, frozenset(s.strip() for s in service_accounts.split(",") if s.strip()))


STRICT = PodPolicy()
"""The operator's default: nothing privileged, no service account."""
ANYTHING = PodPolicy(allow_privileged=True, service_accounts=frozenset({"*"}))
"""The local runner's: its "pods" are processes, the template does not apply."""


def refusals(template: dict[str, Any] | None, policy: PodPolicy) -> list[str]:
    """Every field of ``template`` (``spec.podTemplate`` as written) that ``policy`` does
    not allow, as ``path: why``."""
    spec = (template or {}).get("spec")
    if not isinstance(spec, dict):
        return []
    out: list[str] = []
    where = "spec.podTemplate.spec"
    account = spec.get("serviceAccountName") or spec.get("serviceAccount")
    if account and account != "default" and "*" not in policy.service_accounts and account not in policy.service_accounts:
        key = "serviceAccountName" if spec.get("serviceAccountName") else "serviceAccount"
        out.append(f"{where}.{key}: service account {account!r} would give the job's pods its API rights; the operator "
                   "allows the service accounts in LLMTRAIN_OPERATOR_ALLOWED_SERVICE_ACCOUNTS (chart: "
                   "jobPods.allowedServiceAccounts)")
    if policy.allow_privileged:
        return out
    why = "refused (the chart's jobPods.allowPrivileged allows it)"
    for key in HOST_NAMESPACES:
        if spec.get(key) is True:
            out.append(f"{where}.{key}: the host's namespace: {why}")
    raw_context = spec.get("securityContext")
    pod_context: dict[str, Any] = raw_context if isinstance(raw_context, dict) else {}
    if (pod_context.get("windowsOptions") or {}).get("hostProcess") is True:
        out.append(f"{where}.securityContext.windowsOptions.hostProcess: {why}")
    for i, volume in enumerate(spec.get("volumes") or []):
        if isinstance(volume, dict) and "hostPath" in volume:
            out.append(f"{where}.volumes[{i}].hostPath: a node's files ({volume.get('name', '?')}): {why}; a node-local "
                       "checkpoint tier is spec.checkpoint.local.hostPath")
    containers = [("containers", c) for c in spec.get("containers") or []] + \
                 [("initContainers", c) for c in spec.get("initContainers") or []]
    for i, (kind, container) in enumerate(containers):
        if not isinstance(container, dict):
            continue
        index = i if kind == "containers" else i - len(spec.get("containers") or [])
        path = f"{where}.{kind}[{index}].securityContext"
        context = container.get("securityContext") or {}
        if not isinstance(context, dict):
            context = {}
        if context.get("privileged") is True:
            out.append(f"{path}.privileged: {why}")
        if context.get("procMount") not in (None, "Default"):
            out.append(f"{path}.procMount: {context.get('procMount')}: {why}")
        if (context.get("windowsOptions") or {}).get("hostProcess") is True:
            out.append(f"{path}.windowsOptions.hostProcess: {why}")
        for j, port in enumerate(container.get("ports") or []):
            if isinstance(port, dict) and port.get("hostPort"):
                out.append(f"{where}.{kind}[{index}].ports[{j}].hostPort: a node's port: {why}")
        added = ((context.get("capabilities") or {}).get("add") or []) if isinstance(context.get("capabilities"), dict) else []
        extra = sorted(str(c) for c in added if str(c).upper().removeprefix("CAP_") not in ALLOWED_CAPABILITIES)
        if extra:
            out.append(f"{path}.capabilities.add: {', '.join(extra)}: {why}")
    return out
