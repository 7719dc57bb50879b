"""Exact pins live in constraints.txt only: pyproject.toml's requirements are ranges, so
that `pip install 'llmtrain-operator[trainer]'` into a user's environment keeps the torch
(or kopf, kubernetes ...) already there when it is in range, while the tests, the images
and `hack/setup.sh` install the exact versions through ``-c constraints.txt``."""

from __future__ import annotations

import re
import tomllib

from support.specs import ROOT


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, str]:
    lines = (line.split("#", 1)[0].strip() for line in (ROOT / "constraints.txt").read_text().splitlines())
    return {_name(line): line for line in lines if "==" in line}


def test_no_requirement_in_pyproject_is_an_exact_pin():
    project = _project()
    requirements = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    exact = [r for r in requirements if "==" in r or "===" in r]
    assert exact == [], f"exact pins belong in constraints.txt: {exact}"


def test_the_heavy_and_the_linting_requirements_are_pinned_in_constraints():
    # torch (several GB, the numerics the tests check), the API clients whose majors
    # disagree (kubernetes 37 vs botocore), and the linters (a new rule fails a clean tree).
    pins = _pins()
    missing = [n for n in ("torch", "deepspeed", "kopf", "kubernetes", "ruff", "mypy", "types-pyyaml", "kmock") if n not in pins]
    assert missing == [], f"not pinned in constraints.txt: {missing}"
    extras = _project()["optional-dependencies"]
    named = {_name(r) for extra in extras.values() for r in extra}
    assert {"torch", "kopf", "kubernetes", "ruff", "mypy"} <= named, "each pin constrains a requirement pyproject names"
