"""The core types the spec embeds, checked by the upstream schemas (api/coretypes.py)."""

from __future__ import annotations

import pytest
from llmtrain_operator.api import coretypes
from llmtrain_operator.api.job import LLMTrainJob
from pydantic import ValidationError
from support.specs import load_job

POD = coretypes.POD_SPEC


def test_a_partial_pod_spec_with_every_kind_of_field_passes():
    partial = {
        "containers": [{"name": "trainer", "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
                        "resources": {"limits": {"cpu": "500m", "memory": "8Gi", "nvidia.com/gpu": 8}},
                        "ports": [{"containerPort": 8080}], "livenessProbe": {"httpGet": {"port": "http", "path": "/"}}}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}],
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {"runAsUser": 1000, "fsGroup": 1000},
        "terminationGracePeriodSeconds": None,
    }
    assert coretypes.problems(partial, POD) == []
    assert coretypes.problems({}, POD) == [], "a partial pod: nothing is required of it"


@pytest.mark.parametrize(("value", "expected"), [
    ({"containers": [{"name": "t", "volumeMount": []}]}, "containers[0].volumeMount: unknown field (did you mean volumeMounts?)"),
    ({"hostNetwork": "true"}, "hostNetwork: must be a boolean, got str"),
    ({"restartPolicy": "Sometimes"}, "restartPolicy: 'Sometimes' is not one of Always, Never, OnFailure"),
    ({"containers": {"name": "t"}}, "containers: must be an array, got dict"),
    ({"containers": [{"resources": {"limits": {"cpu": "fast"}}}]}, "containers[0].resources.limits.cpu: 'fast' is not a quantity"),
    ({"containers": [{"resources": {"limits": {"cpu": 0.5}}}]}, "containers[0].resources.limits.cpu: must be an integer or a string"),
    ({"containers": [{"ports": [{"containerPort": True}]}]}, "containers[0].ports[0].containerPort: must be an integer, got bool"),
    ({"nodeSelector": {"pool": 3}}, "nodeSelector.pool: must be a string, got int"),
    ({"zzz": 1}, "zzz: unknown field"),
])
def test_each_kind_of_mistake_is_named_by_its_field(value, expected):
    found = coretypes.problems(value, POD)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_hostile_values_are_reported_not_raised():
    for value in ([], "pod", 3, {"containers": [None, 1, "x", [], {"name": {"deep": [1]}}]}, {1: 2}):
        found = coretypes.problems(value, POD)
        assert found and all(isinstance(p, str) for p in found), value


def test_an_error_names_the_first_problems_and_counts_the_rest():
    with pytest.raises(ValueError) as caught:
        coretypes.checked({f"field{i}": 1 for i in range(25)}, POD)
    message = str(caught.value)
    assert message.count("unknown field") == coretypes.MAX_REPORTED and message.endswith("; and 15 more")


def test_the_model_refuses_a_typo_with_the_fields_path():
    job = load_job()
    job["spec"]["podTemplate"] = {"spec": {"containers": [{"name": "trainer", "volumeMount": []}]}}
    with pytest.raises(ValidationError) as caught:
        LLMTrainJob.model_validate(job)
    [error] = caught.value.errors()
    assert error["loc"] == ("spec", "podTemplate", "spec")
    assert "containers[0].volumeMount: unknown field (did you mean volumeMounts?)" in error["msg"]


def test_the_crd_schema_is_the_upstream_one_translated():
    schema = coretypes.structural(POD)
    container = schema["properties"]["containers"]["items"]
    assert "volumeMounts" in container["properties"] and "required" not in container, "no required: a partial pod"
    limits = container["properties"]["resources"]["properties"]["limits"]["additionalProperties"]
    assert limits["x-kubernetes-int-or-string"] and limits["pattern"] == coretypes.QUANTITY_PATTERN
    port = container["properties"]["ports"]["items"]["properties"]["protocol"]
    assert "default" not in port and port["enum"] == ["SCTP", "TCP", "UDP"], "no defaults written into the job"


def test_trim_keeps_the_closure_of_the_roots_without_descriptions():
    openapi = {"components": {"schemas": {
        coretypes.POD_SPEC: {"type": "object", "description": "d", "properties": {"a": {"allOf": [{"$ref": "#/components/schemas/X"}]}}},
        coretypes.AFFINITY: {"type": "object"}, coretypes.ENV_VAR_SOURCE: {"type": "object"},
        "X": {"type": "string", "description": "x"}, "Unused": {"type": "string"},
    }}}
    trimmed = coretypes.trim(openapi)
    assert sorted(trimmed) == sorted([coretypes.POD_SPEC, coretypes.AFFINITY, coretypes.ENV_VAR_SOURCE, "X"])
    assert "description" not in trimmed[coretypes.POD_SPEC] and trimmed["X"] == {"type": "string"}
    del openapi["components"]["schemas"]["X"]
    with pytest.raises(KeyError, match="has no X"):
        coretypes.trim(openapi)


@pytest.mark.parametrize(("metadata", "field"), [({"label": {"a": "b"}}, "label"), ({"namespace": "elsewhere"}, "namespace"),
                                                 ({"finalizers": ["x/keep"]}, "finalizers"), ({"labels": {"a": 1}}, "labels.a")])
def test_a_pod_templates_metadata_takes_labels_and_annotations_only(metadata, field):
    """Another namespace would put the pods elsewhere, a finalizer would keep them from
    ever being deleted (the job could never replace one)."""
    job = load_job()
    job["spec"]["podTemplate"] = {"metadata": metadata}
    with pytest.raises(ValidationError) as caught:
        LLMTrainJob.model_validate(job)
    locs = [".".join(map(str, e["loc"])) for e in caught.value.errors()]
    assert any(loc.startswith(f"spec.podTemplate.metadata.{field}") for loc in locs), locs
    job["spec"]["podTemplate"] = {"metadata": {"labels": {"team": "nlp"}, "annotations": {"note": "x"}}}
    LLMTrainJob.model_validate(job)
