"""The first process of a "container": run as
``ip netns exec <pod-netns> unshare --mount --uts --propagation private python container_init.py SPEC``.

Inside the pod's private mount and UTS namespaces (the agent put it in the container's
cgroup already) it sets the pod hostname, bind-mounts the volumes at their mount paths,
shows the container its memory cgroup (read-only, as a runtime does), makes the root
read-only if the container's securityContext asks, and execs the command,
so the command's PID is what the agent signals (like PID 1 of a real container).

Mount points that do not exist on the host are created as empty directories (or files)
there: only the bind mounts are private, directories are not.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def main(spec_path: str) -> None:
    with open(spec_path) as fh:
        spec = json.load(fh)
    if spec.get("hostname"):
        socket.sethostname(spec["hostname"])
    for mount in spec.get("mounts", []):
        src, dst = mount["source"], mount["target"]
        if os.path.isdir(src):
            os.makedirs(dst, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if not os.path.exists(dst):
                open(dst, "a").close()
        subprocess.run(["mount", "--bind", src, dst], check=True)
        if mount.get("readOnly"):
            subprocess.run(["mount", "-o", "remount,bind,ro", dst], check=True)
    if spec.get("memoryCgroup"):
        _show_memory_cgroup()
    if spec.get("readOnlyRoot"):
        # securityContext.readOnlyRootFilesystem: the host's root, which stands in for the
        # image's, read-only in this mount namespace alone; the volumes (mounts of their
        # own) stay as they are.
        subprocess.run(["mount", "-o", "remount,bind,ro", "/"], check=True)
    os.chdir(spec.get("workingDir") or "/")
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as err:
        # Like a runtime's "executable file not found": exit 127 with the reason.
        print(f"localcluster: cannot exec {argv[0]!r}: {err.strerror}", file=sys.stderr, flush=True)
        os._exit(127)


def _show_memory_cgroup() -> None:
    """Mount the memory cgroup hierarchy read-only at ``/sys/fs/cgroup/memory``, as a
    runtime shows a container its cgroup: ``ip netns exec`` remounted ``/sys`` for the
    pod's network namespace, which hid the host's. The container's launcher reads its OOM
    kills, peak and limit there (its own folder, by ``/proc/self/cgroup``)."""
    os.makedirs("/sys/fs/cgroup", exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "cgroup", "/sys/fs/cgroup"], check=True)
    os.makedirs("/sys/fs/cgroup/memory")
    subprocess.run(["mount", "-t", "cgroup", "-o", "ro,memory", "cgroup", "/sys/fs/cgroup/memory"], check=True)


if __name__ == "__main__":
    main(sys.argv[1])
