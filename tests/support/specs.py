"""Load example jobs and build the invalid-spec table from tests/data/invalid_specs.yaml."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from llmtrain_operator.api.rules import table

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BASE_EXAMPLE = EXAMPLES / "01-tiny-elastic-cpu.yaml"


def load_job(path: Path = BASE_EXAMPLE) -> dict[str, Any]:
    """The LLMTrainJob document of an example file (which may hold other kinds too)."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return next(d for d in docs if d.get("kind") == "LLMTrainJob")


def apply_set(obj: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Set dotted paths (``spec.replicas.min``) in a copy; a None value deletes the key."""
    out = copy.deepcopy(obj)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return out


@dataclass(frozen=True)
class InvalidCase:
    name: str
    job: dict[str, Any]
    field: str
    server: str | None


def invalid_cases() -> list[InvalidCase]:
    """The table's rows, and one case per cross-field rule (its own example); ``server``
    is the rule's message when the API server checks it, else None."""
    rows = yaml.safe_load((ROOT / "tests" / "data" / "invalid_specs.yaml").read_text())
    base = load_job()
    cases = [InvalidCase(r["name"], apply_set(base, r["set"]), r["field"], r["server"]) for r in rows]
    for placed in table():
        rule = placed.rule
        cases.append(InvalidCase(f"rule-{rule.name}", apply_set(base, placed.example()), placed.field,
                                 rule.message if rule.cel else None))
    return cases
