"""The words for a process the kernel's OOM killer ended: the launcher's termination
message and the operator's in-place restart say the same."""

from __future__ import annotations

REASON = "OOMKilled"
"""The kubelet's reason for a container the OOM killer ended, and ours for a rank."""


def gib(value: int | None) -> str:
    """Bytes in words: ``2.9 GiB``, or ``unknown``."""
    return f"{value / (1 << 30):.1f} GiB" if value is not None else "unknown"


ADVICE = ("Raise resources.limits.memory, or lower what a rank holds (micro-batch, sequence length, dataloader workers, "
          "procsPerNode)")


def figures(peak_bytes: int | None, limit_bytes: int | None) -> str:
    """The container's memory peak against its limit, and what to change."""
    limit = f"of its limit {gib(limit_bytes)}" if limit_bytes is not None else "(it has no limit: the node ran out)"
    return f"the container's memory peak {gib(peak_bytes)} {limit}. {ADVICE}"
