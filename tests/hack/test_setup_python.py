"""hack/setup.sh picks its interpreter: PYTHON= when given, else the first Python >= 3.11
on the PATH (Ubuntu 24.04 and Debian 13 have no python3.11), and says so when none is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.specs import ROOT

SETUP = ROOT / "hack" / "setup.sh"


def _find_python(path: Path) -> subprocess.CompletedProcess:
    """Runs setup.sh's own find_python, cut out of the script, with only ``path`` searched."""
    body = subprocess.run(["sed", "-n", "/^find_python()/,/^}/p", str(SETUP)], capture_output=True, text=True, check=True).stdout
    assert body.startswith("find_python()"), "setup.sh lost its find_python function"
    return subprocess.run(["/bin/bash", "-c", body + "\nfind_python"], capture_output=True, text=True,
                          env={**os.environ, "PATH": str(path)}, timeout=30)


def _fake(folder: Path, name: str, major_minor: tuple[int, int]) -> None:
    """A stand-in interpreter answering setup.sh's version probe as Python ``major_minor`` would."""
    script = folder / name
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; sys.exit({major_minor} < (3, 11))'\n")
    script.chmod(0o755)


def test_the_first_python_of_at_least_3_11_on_the_path_is_chosen(tmp_path):
    _fake(tmp_path, "python3.12", (3, 12))
    _fake(tmp_path, "python3", (3, 13))
    found = _find_python(tmp_path)
    assert (found.returncode, found.stdout.strip()) == (0, "python3.12"), found


def test_an_older_python3_alone_is_refused_with_a_message_naming_the_override(tmp_path):
    _fake(tmp_path, "python3", (3, 10))
    found = _find_python(tmp_path)
    assert found.returncode != 0 and found.stdout == ""
    assert "no Python >= 3.11 found" in found.stderr and "set PYTHON=" in found.stderr, found.stderr


def test_python_given_in_the_environment_wins_without_a_search(tmp_path):
    line = next(ln for ln in SETUP.read_text().splitlines() if ln.startswith("PY="))
    body = subprocess.run(["sed", "-n", "/^find_python()/,/^}/p", str(SETUP)], capture_output=True, text=True, check=True).stdout
    chosen = subprocess.run(["/bin/bash", "-c", f'{body}\n{line}\necho "$PY"'], capture_output=True, text=True,
                            env={**os.environ, "PATH": str(tmp_path), "PYTHON": "/opt/py/bin/python3.14"}, timeout=30)
    assert (chosen.stdout.strip(), chosen.stderr) == ("/opt/py/bin/python3.14", ""), chosen
