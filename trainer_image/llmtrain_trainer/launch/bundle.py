"""What a worker pod needs of this project, copied into a folder for an image without it.

``python -m llmtrain_trainer.launch.bundle DEST``

A user's image has Python and torch, not this project. The operator gives each pod of a
``trainer.command`` job an init container, run from the operator's runtime image, that
copies the launcher, the script runner, the rendezvous store and their pure-Python
dependencies into a shared emptyDir; the pod's containers then run them from there
(``DEST/launcher.py``, ``DEST/script.py``, ``DEST/rdzv_store.py``) with the image's own
Python and torch. Nothing is installed, and the bundle's packages do not shadow the
script's own: the launcher and store processes put ``DEST/lib`` on their path, and the
script runner, once loaded (it stays in ``sys.modules``), takes it off again before the
script starts, so a script's ``import prometheus_client`` finds the image's or none.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

PACKAGES = ("llmtrain_trainer", "llmtrain_contract", "prometheus_client")
"""Everything the launcher, the script runner and the store import, apart from the
standard library and torch (the store's TCPStore): all pure Python."""
LIB = "lib"
ENTRY_POINTS = {
    "launcher.py": "from llmtrain_trainer.launch.launcher import main\nsys.exit(main())\n",
    "rdzv_store.py": "from llmtrain_trainer.rendezvous.store import main\nsys.exit(main())\n",
    # The script runs in this process: its imports must not find these packages (a user's
    # own prometheus_client, say, must win), so the path goes once the runner is loaded.
    "script.py": "from llmtrain_trainer.train import script\nsys.path.remove(_lib)\nscript.main()\n",
}
_HEADER = '''"""Written by ``python -m llmtrain_trainer.launch.bundle``: runs this project's code from ./lib."""
import os
import sys

_lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "{lib}")
sys.path.insert(0, _lib)
'''
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "shards")
"""``llmtrain_trainer/engines/shards`` holds the built-in trainer's sample shards, not needed here."""


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"llmtrain bundle: package {name} is not installed in this image")
    return Path(list(spec.submodule_search_locations)[0])


def write(dest: Path) -> list[Path]:
    """Copy the packages and write the entry points; returns the entry points."""
    lib = dest / LIB
    lib.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        shutil.copytree(package_dir(name), lib / name, ignore=_SKIP, dirs_exist_ok=True)
    written = []
    for filename, body in ENTRY_POINTS.items():
        path = dest / filename
        path.write_text(_HEADER.format(lib=LIB) + body)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m llmtrain_trainer.launch.bundle DEST", file=sys.stderr)
        return 64
    try:
        for path in write(Path(argv[0])):
            print(f"llmtrain bundle: wrote {path}")
    except OSError as err:
        print(f"llmtrain bundle: cannot write {argv[0]}: {err}", file=sys.stderr)
        return 74  # EX_IOERR
    return 0


if __name__ == "__main__":
    sys.exit(main())
