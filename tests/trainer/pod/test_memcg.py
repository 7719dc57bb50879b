"""The container's memory cgroup read from inside (``memcg.py``): found from
``/proc/self/cgroup`` and ``mountinfo`` as runtimes lay it out, read under cgroup v1 and
v2, and a real OOM kill counted in a real memory cgroup with a limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from llmtrain_trainer.pod import memcg

RUNC_V1 = ("12:memory:/kubepods/burstable/pod1/abc\n11:cpu,cpuacct:/kubepods/burstable/pod1/abc\n0::/\n",
           "100 90 0:30 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"
           "101 100 0:31 /kubepods/burstable/pod1/abc /sys/fs/cgroup/memory ro,nosuid shared:9 - cgroup cgroup rw,memory\n"
           "102 100 0:32 /kubepods/burstable/pod1/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n")
V2_NAMESPACED = ("0::/\n", "200 190 0:40 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
V2_HOST = ("0::/system.slice/x.service\n", "30 20 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
HYBRID = ("4:memory:/process_api/1d\n0::/\n",
          "55 51 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
          "61 51 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")


def test_the_cgroup_is_found_where_each_runtime_mounts_it():
    # runc under v1 mounts the container's own subtree: the path below the mount's root.
    assert memcg.locate(*RUNC_V1) == memcg.Place(Path("/sys/fs/cgroup/memory"), 1)
    # v2 in a cgroup namespace: "/" is the container's cgroup.
    assert memcg.locate(*V2_NAMESPACED) == memcg.Place(Path("/sys/fs/cgroup"), 2)
    assert memcg.locate(*V2_HOST) == memcg.Place(Path("/sys/fs/cgroup/system.slice/x.service"), 2)
    # Hybrid: the memory controller is v1's; the unified tree holds no memory.
    assert memcg.locate(*HYBRID) == memcg.Place(Path("/sys/fs/cgroup/memory/process_api/1d"), 1)
    # Nothing mounted, a path outside the mount's root, garbage: not found, no exception.
    assert memcg.locate("12:memory:/a\n", "") is None
    assert memcg.locate("12:memory:/elsewhere\n", RUNC_V1[1]) is None
    assert memcg.locate("garbage\n::\n", "1 2 3\n - \n- -\n") is None


def test_the_counts_are_read_under_v1_and_v2_and_no_limit_is_none(tmp_path):
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir(), v2.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (v1 / "memory.max_usage_in_bytes").write_text("3221225472\n")
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memcg.read(memcg.Place(v1, 1)) == memcg.Memory(2, 3 << 30, None)
    (v1 / "memory.limit_in_bytes").write_text("4294967296\n")
    assert memcg.read(memcg.Place(v1, 1)).limit_bytes == 4 << 30
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 3\noom_kill 1\noom_group_kill 0\n")
    (v2 / "memory.max").write_text("max\n")
    assert memcg.read(memcg.Place(v2, 2)) == memcg.Memory(1, None, None)  # no memory.peak before Linux 5.19
    (v2 / "memory.peak").write_text("123\n")
    (v2 / "memory.max").write_text("2147483648\n")
    assert memcg.read(memcg.Place(v2, 2)) == memcg.Memory(1, 123, 2 << 30)
    assert memcg.read(memcg.Place(tmp_path / "gone", 2)) is None


def test_a_process_grown_past_its_cgroups_limit_is_one_oom_kill_with_the_peak_and_the_limit():
    """A real v1 memory cgroup (the machine's; CI runs as root on the same VM type)."""
    own = memcg.own()
    assert own is not None and own.version == 1, f"this test needs cgroup v1's memory controller, found {own}"
    group = Path("/sys/fs/cgroup/memory") / f"llmtrain-test-oom-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(256 << 20))
        watch = memcg.Watch(memcg.Place(group, 1), 0)
        # The child joins the cgroup, then touches 32 MiB at a time until it is killed.
        grow = "import os\nopen(os.environ['G'] + '/cgroup.procs', 'w').write(str(os.getpid()))\nh = []\nwhile True:\n" \
               "    h.append(b'\\x01' * (32 << 20))\n"
        child = subprocess.run([sys.executable, "-c", grow], env={**os.environ, "G": str(group)}, timeout=120)
        assert child.returncode == -signal.SIGKILL
        kills, memory = watch.now()
        assert kills == 1 and memory.limit_bytes == 256 << 20
        assert 200 << 20 <= memory.peak_bytes <= 256 << 20, memory
    finally:
        group.rmdir()
