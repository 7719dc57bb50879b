"""Hard-links one kind node's copy of an image's layers to another node's copy.

Every kind node is a container with its own containerd, so each unpacks its own copy of
the trainer image (5.9 GB, nearly all of it CUDA torch): three GPU nodes held three
copies, and CI ran out of disk loading the third. A committed layer snapshot is the
unpacked form of one layer's tar, named by that tar's digest (the chain ID), and
containerd never writes into it again: two nodes' snapshots of one chain ID hold the
same files, so the second node's regular files can be links to the first's. Each node's
/var is a Docker volume on one filesystem, so the links are made from the host.

Only regular files are linked, each only where the two copies agree on size, mode,
owner and modification time (a whiteout, a symlink, a directory and its overlay xattrs
stay as unpacked); a file is swapped by a link under a temporary name and a rename, so
a reader never finds it missing. Active snapshots (a container's writable layer) are
never given to this: a write there would show in the other node.

    python hack/kind/layerlinks.py SRC_LAYER_DIR DST_LAYER_DIR [SRC DST ...]
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Linked:
    files: int = 0
    bytes: int = 0
    differing: int = 0  # same path, different metadata: left as it was


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_size, a.st_mode, a.st_uid, a.st_gid, a.st_mtime_ns) == (
        b.st_size, b.st_mode, b.st_uid, b.st_gid, b.st_mtime_ns)


def link_layer(src: Path, dst: Path, done: Linked | None = None) -> Linked:
    """Make every regular file under ``dst`` a link to the file at its path under ``src``
    where the two agree (``_same``); returns what was linked and what differed."""
    done = done or Linked()
    if os.stat(src).st_dev != os.stat(dst).st_dev:
        raise ValueError(f"{src} and {dst} are on different filesystems: no hard links between them")
    for root, _dirs, files in os.walk(dst):
        rel = os.path.relpath(root, dst)
        for name in files:
            there, here = os.path.join(src, rel, name), os.path.join(root, name)
            try:
                theirs, ours = os.lstat(there), os.lstat(here)
            except FileNotFoundError:
                done.differing += 1
                continue
            if not stat.S_ISREG(ours.st_mode) or (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
                continue
            if not _same(theirs, ours):
                done.differing += 1
                continue
            tmp = here + ".llmtrain-link"
            if os.path.lexists(tmp):
                os.unlink(tmp)  # left by an interrupted run
            os.link(there, tmp)
            os.replace(tmp, here)
            done.files += 1
            done.bytes += ours.st_size
    return done


def main(argv: list[str]) -> int:
    if not argv or len(argv) % 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 64
    done = Linked()
    for src, dst in zip(argv[::2], argv[1::2]):
        link_layer(Path(src), Path(dst), done)
    print(f"layerlinks: {done.files} files linked ({done.bytes / 1e9:.2f} GB freed), {done.differing} differing left as they were")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
