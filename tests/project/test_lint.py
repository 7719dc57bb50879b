"""ruff and both mypy configurations are clean (``make lint``, ``hack/lint.py``): a
missing method on a protocol's stand-in is a test failure, not a crash at step 1.

Unmarked, so part of the fast suite. With a warm mypy cache (``make lint`` ran, or an
earlier session) the three take about a second; a cold cache costs about 20 s of CPU.
The import contracts are ``tests/project/test_layering.py``'s."""

from __future__ import annotations

import subprocess

import pytest
from lint import ROOT, checks, strict_packages


@pytest.mark.parametrize("name", ["ruff", "mypy", "mypy --strict"])
def test_the_tree_is_clean(name: str) -> None:
    command = checks()[name]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"`{name}` found:\n{result.stdout[-8000:]}{result.stderr[-2000:]}"


def test_the_strict_packages_are_read_from_the_mypy_override() -> None:
    assert {"llmtrain_operator.api", "llmtrain_operator.planner", "llmtrain_contract", "llmtrain_store"} <= set(strict_packages())
