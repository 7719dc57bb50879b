"""Images on the local cluster: none is pulled or run. A container's command runs on the
host, in the Python environment its image names:

| image                                  | environment                                       |
|----------------------------------------|---------------------------------------------------|
| ``localcluster.local/python-torch:*``  | Python and torch only: *not* this project (a      |
|                                        | user's image, as issue 13's tests need it)        |
| anything else                          | the project's venv (torch, this project, its deps)|

The python-torch environment is a venv without pip whose only site directory entry is the
project venv's ``site-packages`` *as a plain path*: torch and every other distribution
import from there, but the project's editable install, which lives in a ``.pth`` hook
that Python runs only for real site directories, does not. ``import llmtrain_trainer``
fails in it, exactly as in an image without the project.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

PYTHON_TORCH = "localcluster.local/python-torch"
_lock = threading.Lock()


def bin_dir(image: str, default_bin: str, state: Path) -> str:
    """The ``bin`` folder to put first on a container's PATH for ``image``."""
    name = image.split("@", 1)[0]
    head, _, tag = name.rpartition(":")
    if head and "/" not in tag:
        name = head  # a tag, not a registry's port
    if name == PYTHON_TORCH:
        return str(python_torch(Path(default_bin), state))
    return default_bin


def python_torch(project_bin: Path, state: Path) -> Path:
    """Create (once) and return the python-torch environment's ``bin``."""
    root = state / "images" / "python-torch"
    with _lock:
        if not (root / "bin" / "python").exists():
            python = project_bin / "python"
            purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip()
            subprocess.run([str(python), "-m", "venv", "--without-pip", "--clear", str(root)], check=True)
            own = subprocess.run([str(root / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
            Path(own, "project-site-packages.pth").write_text(purelib + "\n")
        return root / "bin"
