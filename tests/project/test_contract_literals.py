"""No label, annotation or Event reason literal outside the contract (issue: structure):
the names live in ``llmtrain_contract.names`` and ``api/observed.py`` / ``api/job.py``, the
reasons in ``api/vocabulary.py``; the code names them from there."""

from __future__ import annotations

import ast
from pathlib import Path

from support.specs import ROOT

SOURCES = [ROOT / "operator" / "llmtrain_operator", ROOT / "trainer_image" / "llmtrain_trainer"]
NAMES_HOME = {ROOT / "common" / "llmtrain_contract" / "names.py",
              ROOT / "operator" / "llmtrain_operator" / "api" / "observed.py",
              ROOT / "operator" / "llmtrain_operator" / "api" / "job.py"}


def _files() -> list[Path]:
    return [p for root in SOURCES for p in sorted(root.rglob("*.py")) if p not in NAMES_HOME]


def test_no_llmtrain_label_or_annotation_is_spelled_outside_the_contract():
    found = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("llmtrain.io/"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert not found, found


def test_no_event_reason_is_a_bare_string():
    """``Event(type, reason, ...)`` and ``ctx.event(reason, ...)``: the reason comes from the vocabulary."""
    found = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id == "Event" and len(node.args) >= 2:
                reason = node.args[1]
            elif isinstance(func, ast.Attribute) and func.attr == "event" and isinstance(func.value, ast.Name) and node.args:
                # ctx.event(reason, ...); not kopf.on.event("pods"), a resource
                reason = node.args[0]
            else:
                continue
            if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {reason.value}")
    assert not found, found
