"""Fuzzed specs never crash the operator: each is accepted, or reported Invalid with a
message that names a field."""

from __future__ import annotations

import copy
import re
from datetime import datetime, UTC

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmtrain_operator.api import SpecInvalid, parse_job
from llmtrain_operator.api.observed import Observed
from llmtrain_operator.planner import plan
from support.specs import load_job

BASE = load_job()
BASE["metadata"].update(namespace="ml", uid="u", generation=1)
NOW = datetime(2026, 11, 21, tzinfo=UTC)


def _paths(node, prefix=()):
    """Every (path, value) in the base spec: where mutations may land."""
    yield prefix, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


PATHS = [p for p, _ in _paths(BASE) if p and p[0] in ("spec", "metadata")]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**12, max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=6)
KEYS = st.sampled_from(["min", "max", "suspend", "podTemplate", "s3", "shared", "preset", "kind", "zeroStage",
                        "intervalSteps", "deepspeedConfig", "bogus", "", "replicas", "gang", "env"])


@st.composite
def mutated_jobs(draw):
    job = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(PATHS))
        parent = job
        for key in path[:-1]:  # an earlier mutation may have replaced part of the path
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        if draw(st.booleans()):
            parent[path[-1]] = draw(VALUES)
        else:
            target = parent.get(path[-1])
            if isinstance(target, dict):
                target[draw(KEYS)] = draw(VALUES)
            else:
                parent.pop(path[-1], None)
    return job


FIELD = re.compile(r"(spec|metadata)(\.|\[|:|$)")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_jobs())
def test_fuzzed_specs_are_accepted_or_reported_with_a_field_name(raw):
    try:
        parse_job(raw)
        valid = True
    except SpecInvalid as err:
        valid = False
        assert err.errors, "an invalid spec must list its errors"
        for error in err.errors:
            assert FIELD.match(error.path) or error.path in ("kind", "apiVersion"), error.path
            assert error.message
    result = plan(raw, Observed(), NOW)  # must not raise, whatever the input
    if valid:
        assert result.status["phase"] != "Invalid"
    else:
        assert result.status["phase"] == "Invalid"
        invalid = next(c for c in result.status["conditions"] if c["type"] == "Invalid")
        assert FIELD.search(invalid["message"]), invalid["message"]
        assert result.actions == []
