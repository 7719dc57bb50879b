"""Write what each image installs, as small files, so that a layer is rebuilt only when
what it installs changes (not when a test marker or a dev pin in pyproject.toml does):

    python requirements.py OUT_DIR

writes into OUT_DIR:
- ``torch.txt``: torch's pin alone (the trainer's multi-GB layer, first);
- ``deepspeed.txt``: DeepSpeed's pin alone (installed last, against that torch, without
  build isolation: it has no wheel, and an isolated build would pull a second torch);
- ``operator.txt`` and ``trainer.txt``: the project's base requirements plus that extra,
  torch and DeepSpeed left out;
- ``constraints.txt``: constraints.txt less the pins of packages only the ``dev`` extra
  names (pytest, linters ...).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

SEPARATE = ("torch", "deepspeed")
"""Installed by the image in their own steps (see the module docstring)."""
EXTRAS = ("operator", "trainer")


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def requirements(project: dict, extra: str) -> list[str]:
    optional = project.get("optional-dependencies", {})
    if extra not in optional:
        raise SystemExit(f"requirements.py: no extra {extra!r} in pyproject.toml (there are: {', '.join(sorted(optional))})")
    seen: set[str] = set()
    out = []
    for requirement in [*project.get("dependencies", []), *optional[extra]]:
        name = _name(requirement)
        if name in SEPARATE or name in seen:
            continue
        seen.add(name)
        out.append(requirement.split("#", 1)[0].strip())
    return out


def runtime_constraints(project: dict, constraints: str) -> list[str]:
    optional = project.get("optional-dependencies", {})
    runtime = {_name(r) for r in project.get("dependencies", [])} | {_name(r) for e in EXTRAS for r in optional.get(e, [])}
    dev_only = {_name(r) for r in optional.get("dev", [])} - runtime
    lines = [line.split("#", 1)[0].strip() for line in constraints.splitlines()]
    return [line for line in lines if line and _name(line) not in dev_only]


def pin(constraints: list[str], name: str) -> str:
    pins = [line for line in constraints if _name(line) == name]
    if len(pins) != 1:
        raise SystemExit(f"requirements.py: constraints.txt must pin {name} exactly once (found {len(pins)})")
    return pins[0]


def write(root: Path, out: Path) -> None:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    constraints = runtime_constraints(project, (root / "constraints.txt").read_text())
    out.mkdir(parents=True, exist_ok=True)
    files = {"constraints.txt": constraints, **{f"{n}.txt": [pin(constraints, n)] for n in SEPARATE},
             **{f"{e}.txt": requirements(project, e) for e in EXTRAS}}
    for name, lines in files.items():
        (out / name).write_text("\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit("usage: python requirements.py OUT_DIR")
    here = Path(__file__).resolve().parent
    root = here if (here / "pyproject.toml").exists() else here.parents[1]  # the image's /src, or the repository
    write(root, Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
