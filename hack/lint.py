"""``make lint``: the import contracts, ruff, and mypy in its two configurations.

- ``mypy``: every package under pyproject.toml's ``[tool.mypy]`` (``check_untyped_defs``
  everywhere, every strict flag for the packages of the strict override);
- ``mypy --strict``: the strict override's packages again, under mypy's own ``--strict``,
  which catches a strict flag that the override's list lacks (a newer mypy adds some).
  Its cache is a folder of its own: the two runs' options differ, and one shared cache
  would be rebuilt by each run in turn.

The strict packages are read from pyproject.toml (the override that sets
``disallow_untyped_defs``), so they are named in one place. ``tests/project/test_lint.py`` runs
the same commands (``CHECKS``). Every check runs even after one fails; the exit status is
1 when any failed.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
"""The venv's scripts: ruff, mypy and lint-imports are installed beside its python."""


def strict_packages(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The packages of the strict mypy override, e.g. ``llmtrain_operator.api``."""
    overrides = tomllib.loads(pyproject.read_text())["tool"]["mypy"]["overrides"]
    strict = [o for o in overrides if o.get("disallow_untyped_defs")]
    if len(strict) != 1:
        raise SystemExit(f"{pyproject}: expected one [[tool.mypy.overrides]] with disallow_untyped_defs, found {len(strict)}")
    modules = strict[0]["module"]
    return [m.removesuffix(".*") for m in ([modules] if isinstance(modules, str) else modules)]


def checks() -> dict[str, list[str]]:
    """Name -> command line, run in the repository root."""
    packages = [arg for name in strict_packages() for arg in ("-p", name)]
    return {
        "lint-imports": [str(BIN / "lint-imports")],
        "ruff": [str(BIN / "ruff"), "check", "--no-fix", "."],
        "mypy": [str(BIN / "mypy")],
        "mypy --strict": [str(BIN / "mypy"), "--strict", "--no-warn-unused-configs", "--cache-dir", ".mypy_cache/strict",
                          *packages],
    }


def main() -> int:
    failed = []
    for name, command in checks().items():
        started = time.monotonic()
        result = subprocess.run(command, cwd=ROOT, check=False)
        print(f"lint: {name}: {'ok' if result.returncode == 0 else f'FAILED (exit {result.returncode})'} "
              f"in {time.monotonic() - started:.1f}s", flush=True)
        if result.returncode != 0:
            failed.append(name)
    if failed:
        print(f"lint: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
