"""hack/kind/layerlinks.py: a node's unpacked layer made links to another node's copy,
file by file, only where the two copies agree."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack" / "kind"))
import layerlinks

STAMP = 1_700_000_000_000_000_000


def _unpack(root: Path, files: dict[str, bytes], mtime_ns: int = STAMP) -> Path:
    """A layer as containerd unpacks one: the same tar gives the same bytes, modes and
    times in every node."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o644)
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return root


LAYER = {"usr/lib/libbig.so": b"\x7fELF" + b"x" * 4096, "opt/venv/site.py": b"import os\n", "empty": b""}


def test_identical_files_become_one_inode_and_read_the_same(tmp_path):
    a = _unpack(tmp_path / "a", LAYER)
    b = _unpack(tmp_path / "b", LAYER)
    done = layerlinks.link_layer(a, b)
    assert (done.files, done.differing) == (3, 0)
    assert done.bytes == sum(len(v) for v in LAYER.values())
    for rel, data in LAYER.items():
        assert os.stat(a / rel).st_ino == os.stat(b / rel).st_ino
        assert (b / rel).read_bytes() == data
    assert not list(b.rglob("*.llmtrain-link"))
    # a second pass finds nothing left to link
    assert layerlinks.link_layer(a, b).files == 0


def test_a_file_that_differs_in_any_attribute_or_is_missing_is_left_as_it_was(tmp_path):
    a = _unpack(tmp_path / "a", LAYER)
    b = _unpack(tmp_path / "b", LAYER)
    os.utime(b / "empty", ns=(STAMP + 1, STAMP + 1))
    (b / "opt/venv/site.py").chmod(0o755)
    _unpack(b, {"only-here": b"mine"})
    done = layerlinks.link_layer(a, b)
    assert (done.files, done.differing) == (1, 3)
    assert os.stat(a / "usr/lib/libbig.so").st_ino == os.stat(b / "usr/lib/libbig.so").st_ino
    for rel in ("empty", "opt/venv/site.py", "only-here"):
        assert os.stat(b / rel).st_nlink == 1, rel
    assert (b / "only-here").read_bytes() == b"mine"


def test_links_and_whiteouts_are_not_touched(tmp_path):
    """A symlink (and a whiteout, a character device) is not a regular file: never linked."""
    a = _unpack(tmp_path / "a", LAYER)
    b = _unpack(tmp_path / "b", LAYER)
    for root in (a, b):
        (root / "lib").symlink_to("usr/lib")
    if os.geteuid() == 0:
        for root in (a, b):
            os.mknod(root / "gone", 0o600 | 0o020000, os.makedev(0, 0))
    layerlinks.link_layer(a, b)
    assert os.lstat(a / "lib").st_ino != os.lstat(b / "lib").st_ino
    assert os.readlink(b / "lib") == "usr/lib"
    if os.geteuid() == 0:
        assert os.lstat(a / "gone").st_ino != os.lstat(b / "gone").st_ino


def test_layers_on_two_filesystems_are_refused_by_name(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.fail("this test needs /dev/shm on a filesystem of its own (a tmpfs)")
    a = _unpack(tmp_path / "a", LAYER)
    other = shm / f"layerlinks-{os.getpid()}"
    try:
        b = _unpack(other, LAYER)
        with pytest.raises(ValueError, match="different filesystems"):
            layerlinks.link_layer(a, b)
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_the_command_takes_pairs_and_says_what_it_freed(tmp_path, capsys):
    a = _unpack(tmp_path / "a", LAYER)
    b = _unpack(tmp_path / "b", LAYER)
    assert layerlinks.main([str(a)]) == 64
    assert layerlinks.main([str(a), str(b)]) == 0
    assert "3 files linked" in capsys.readouterr().out
