"""Every cross-field rule is written once (a check and its CEL, one message) and sits in
the job's one rule table; here each is checked against the model. The cluster suite
sends the same examples to a real API server (tests/cluster/test_bed.py)."""

from __future__ import annotations

import typing

import pytest
from llmtrain_contract.rules import Ruled
from llmtrain_operator.api import SpecInvalid, parse_job
from llmtrain_operator.api.crd import build_crd
from llmtrain_operator.api.rules import MODELS, table
from llmtrain_operator.api.spec import LLMTrainJobSpec
from support.specs import ROOT, apply_set, load_job

RULES = table()


@pytest.mark.parametrize("placed", RULES, ids=[p.rule.name for p in RULES])
def test_each_rule_is_enforced_by_the_model_with_its_message_at_its_field(placed):
    with pytest.raises(SpecInvalid) as info:
        parse_job(apply_set(load_job(), placed.example()))
    errors = {e.path: e.message for e in info.value.errors}
    assert placed.field in errors, errors
    assert errors[placed.field].startswith(placed.rule.message), errors[placed.field]


def test_the_base_example_keeps_every_rule():
    parse_job(load_job())


def _ruled_models(model: type, seen: set[type]) -> set[type]:
    """Every model reachable from ``model`` through its fields that has rules."""
    if model in seen:
        return set()
    seen.add(model)
    found = {model} if issubclass(model, Ruled) and model.RULES else set()
    for info in model.model_fields.values():
        for arg in [info.annotation, *typing.get_args(info.annotation)]:
            if isinstance(arg, type) and hasattr(arg, "model_fields"):
                found |= _ruled_models(arg, seen)
    return found


def test_every_model_with_rules_is_in_the_table():
    assert _ruled_models(LLMTrainJobSpec, set()) == {model for _, model in MODELS}


def test_a_rule_the_server_cannot_check_says_why_and_docs_list_every_rule():
    docs = (ROOT / "docs" / "api.md").read_text()
    for placed in RULES:
        rule = placed.rule
        assert (rule.cel is None) == bool(rule.server_cannot), rule.name
        assert f"`{rule.name}`" in docs, f"docs/api.md does not list the rule {rule.name}"


def test_the_server_side_rules_are_in_the_crd():
    text = str(build_crd())
    for placed in RULES:
        if placed.rule.cel:
            assert placed.rule.cel in text and placed.rule.message in text, placed.rule.name


def test_the_batch_rule_checks_few_offsets_and_is_as_strict_as_checking_every_node_count():
    """The CRD's batch rule walks SPAN_OFFSETS node counts, not MAX_NODES: the API server
    evaluates it at each write of a job, status writes included. No positive int64 is divisible by the lcm of that many consecutive
    node counts, so a wider elastic range fails at those offsets already."""
    from math import lcm

    from llmtrain_operator.api.spec import MAX_NODES, SPAN_OFFSETS

    assert lcm(*range(1, SPAN_OFFSETS + 1)) > 2**63 - 1
    assert lcm(*range(1, SPAN_OFFSETS)) <= 2**63 - 1, "SPAN_OFFSETS is larger than it needs to be"
    first = lcm(*range(1, SPAN_OFFSETS + 1))
    for low in range(1, MAX_NODES + 1):
        assert lcm(*range(low, low + SPAN_OFFSETS)) % first == 0
    placed = next(p for p in RULES if p.rule.name == "global-batch-fixed-across-world-sizes")
    rule = placed.rule.cel
    offsets = rule.split("[", 1)[1].split("]", 1)[0].split(",")
    assert [int(x) for x in offsets] == list(range(SPAN_OFFSETS))
