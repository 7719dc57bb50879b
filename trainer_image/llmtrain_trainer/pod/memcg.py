"""The container's memory cgroup, read from inside: how many processes the kernel's OOM
killer ended, the memory peak and the limit.

A rank that grows past its container's limit is killed by the kernel with SIGKILL, which
from torchrun's side looks like any other signal death. Only the cgroup knows it was
memory. Under cgroup v1 (and v2 without ``memory.oom.group``) the kernel kills one
process, usually the largest rank, and torchrun restarts the group in place; with
``memory.oom.group`` (the kubelet's default on v2) the whole container goes and the
kubelet says ``OOMKilled`` itself.

Where the cgroup is: ``/proc/self/cgroup`` names this process's cgroup within each
hierarchy, ``/proc/self/mountinfo`` where (and from which root) that hierarchy is mounted.
A runtime may mount only the container's own subtree (v1 under runc: the mount's root is
the container's path) or give it a cgroup namespace (the path reads ``/``); both resolve
to the mount point joined with the path below the mount's root, as runc's own lookup does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

UNLIMITED = 1 << 62
"""cgroup v1 reports "no limit" as a page-rounded LONG_MAX; anything this large is none."""


@dataclass(frozen=True)
class Memory:
    oom_kills: int
    """The cgroup's OOM kills since it was created (the container's lifetime)."""
    peak_bytes: int | None
    """The high-water mark of its usage; None where the kernel keeps none (v2 before 5.19)."""
    limit_bytes: int | None
    """Its limit; None when unlimited."""


@dataclass(frozen=True)
class Place:
    path: Path
    version: int


def _mount_root(root: str, mount_point: str, own: str) -> Path | None:
    """Where ``own`` (a cgroup path) lies under a hierarchy mounted at ``mount_point``
    from ``root``; None when it is not below that root."""
    if root == "/":
        return Path(mount_point) / own.lstrip("/")
    if own == root or own.startswith(root.rstrip("/") + "/"):
        return Path(mount_point) / own[len(root):].lstrip("/")
    return None


def locate(cgroup_text: str, mountinfo_text: str) -> Place | None:
    """This process's memory cgroup folder from ``/proc/self/cgroup`` and
    ``/proc/self/mountinfo``; None when neither hierarchy is mounted here."""
    v1 = v2 = None
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    for line in mountinfo_text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 4:
            continue
        root, mount_point, fstype, options = fields[3], fields[4], fields[sep + 1], fields[sep + 3]
        if v1 is not None and fstype == "cgroup" and "memory" in options.split(","):
            found = _mount_root(root, mount_point, v1)
            if found is not None:
                return Place(found, 1)
        if v1 is None and v2 is not None and fstype == "cgroup2":
            found = _mount_root(root, mount_point, v2)
            if found is not None:
                return Place(found, 2)
    return None


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def read(place: Place) -> Memory | None:
    """The cgroup's counts now; None when its files cannot be read (it went away, a
    kernel without them)."""
    try:
        if place.version == 2:
            events = (place.path / "memory.events").read_text()
            peak_file = place.path / "memory.peak"
            peak = _number(peak_file.read_text()) if peak_file.exists() else None
            limit = _number((place.path / "memory.max").read_text())  # "max": None
            return Memory(_counter(events, "oom_kill"), peak, limit)
        control = (place.path / "memory.oom_control").read_text()
        peak = _number((place.path / "memory.max_usage_in_bytes").read_text())
        limit = _number((place.path / "memory.limit_in_bytes").read_text())
        return Memory(_counter(control, "oom_kill"), peak, limit if limit is not None and limit < UNLIMITED else None)
    except OSError:
        return None


def own() -> Place | None:
    """This process's memory cgroup, or None."""
    try:
        return locate(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    except OSError:
        return None


@dataclass(frozen=True)
class Watch:
    """The container's cgroup as the launcher found it at its start: OOM kills are
    counted from then (an earlier container's are not this one's)."""

    place: Place
    base: int

    @classmethod
    def start(cls) -> Watch | None:
        place = own()
        memory = read(place) if place is not None else None
        return cls(place, memory.oom_kills) if place is not None and memory is not None else None

    def now(self) -> tuple[int, Memory] | None:
        """(OOM kills since the start, the cgroup's figures), or None when unreadable."""
        memory = read(self.place)
        return (max(0, memory.oom_kills - self.base), memory) if memory is not None else None
