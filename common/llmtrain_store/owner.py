"""Whose checkpoint steps a tier's clean-up may touch.

A tier root can hold steps of more than one run: a job deleted and created again under
the same name (same default subPath or S3 prefix) finds its predecessor's steps, and
two jobs given the same explicit prefix share one (the operator refuses the second
while the first lives). Every manifest records its ``owner`` (the job's uid) and
``lineage``: the owners whose history the step continues, its own last. A run that
resumes from a step adopts that step's lineage; a run that starts over (nothing
loadable, ``allowFreshStart``) has only itself.

Retention, room-making and the sweeping of unfinished writes act only on steps whose
owner is in the run's lineage (``Scope.mine``): a re-created job that starts over never
deletes its own new low steps because its predecessor's sort higher, and never deletes
the predecessor's, which stay for a human to prune (``llmtrain checkpoints prune``).
Unfinished writes are keyed by owner (``token``), so two writers of one step number
never merge parts. Steps written before owners were recorded are everyone's (the
behaviour they were written under).

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

LINEAGE_MAX = 32
"""Owners kept in a lineage, newest last: a job re-created every day for a month still
counts its whole month; older owners' steps are then left alone like any stranger's."""
OWNER_MAX_CHARS = 128
"""Longer than any Kubernetes uid or local run id: a longer value is not an owner."""


def token(owner: str) -> str:
    """A short, path-safe name for ``owner`` (staging folders, S3 part keys): hex only,
    so it never holds the ``-`` or ``.`` that the names around it are split on."""
    return hashlib.sha256(owner.encode()).hexdigest()[:12]


def owner_of(manifest: dict[str, Any]) -> str | None:
    """The owner a manifest records; None when it records none (written before owners
    were recorded) or something that is no owner."""
    value = manifest.get("owner")
    return value if isinstance(value, str) and 0 < len(value) <= OWNER_MAX_CHARS else None


def lineage_of(manifest: dict[str, Any]) -> list[str]:
    """The lineage a manifest records, its owner last; the owner alone when it records
    no valid lineage; empty for a step without an owner. A manifest is written by
    whoever can write the tier: anything but a list of owners is ignored, not trusted."""
    owner = owner_of(manifest)
    if owner is None:
        return []
    value = manifest.get("lineage")
    earlier = [o for o in value if isinstance(o, str) and 0 < len(o) <= OWNER_MAX_CHARS] if isinstance(value, list) else []
    return adopted(owner, earlier)


def adopted(owner: str, lineage: Iterable[str]) -> list[str]:
    """``owner``'s lineage after resuming from a step of ``lineage``: each owner once,
    ``owner`` last, the newest ``LINEAGE_MAX``."""
    out = [o for o in dict.fromkeys(lineage) if o != owner]
    return [*out, owner][-LINEAGE_MAX:]


@dataclass(frozen=True)
class Scope:
    """The run writing a tier: its owner and lineage."""

    owner: str
    lineage: frozenset[str]

    @classmethod
    def of(cls, owner: str, lineage: Iterable[str] = ()) -> Scope:
        return cls(owner, frozenset(adopted(owner, lineage)))

    @property
    def token(self) -> str:
        return token(self.owner)

    def mine(self, manifest: dict[str, Any]) -> bool:
        """A step this run may prune: its owner is in the lineage, or it records none."""
        owner = owner_of(manifest)
        return owner is None or owner in self.lineage

    def my_token(self, name: str | None) -> bool:
        """An unfinished write keyed ``name`` is this lineage's (None: written before
        writes were keyed, so anybody's)."""
        return name is None or name in {token(o) for o in self.lineage}


def mine(scope: Scope | None, manifest: dict[str, Any]) -> bool:
    """``scope.mine``, where no scope (a tool acting on a tier by hand) owns every step."""
    return scope is None or scope.mine(manifest)


def my_token(scope: Scope | None, name: str | None) -> bool:
    return scope is None or scope.my_token(name)
