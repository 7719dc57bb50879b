"""Print the requirements of the project's base install and the given extras, one per
line, for an image to install before it copies the sources: a code edit then rebuilds
only the last layer, never the dependency layers (torch alone is several GB).

torch and DeepSpeed are left out: the image installs torch first (from the index its
variant needs) and DeepSpeed last, against that torch, without build isolation.

    python requirements.py trainer > /tmp/requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

SEPARATE = {"torch", "deepspeed"}
"""Installed by the image in their own steps (see the module docstring)."""


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"requirements.py: no such extra in {pyproject}: {', '.join(unknown)} "
                         f"(there are: {', '.join(sorted(optional))})")
    wanted = list(project.get("dependencies", []))
    for extra in extras:
        wanted += optional[extra]
    seen: set[str] = set()
    out = []
    for requirement in wanted:
        name = _name(requirement)
        if name in SEPARATE or name in seen:
            continue
        seen.add(name)
        out.append(requirement.split("#", 1)[0].strip())
    return out


def main(argv: list[str]) -> int:
    pyproject = Path(__file__).resolve().parent / "pyproject.toml"
    if not pyproject.exists():  # run from the repository rather than the image's /src
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    print("\n".join(requirements(pyproject, argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
