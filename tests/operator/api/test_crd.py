"""The committed CRD is generated from the model, and is a structural schema."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from llmtrain_operator.api import crd as crd_module
from llmtrain_operator.api.crd import CHART_CRD_TEMPLATE, CRD_FILENAME, build_crd, render_chart_crd_template, render_crd_yaml
from support.specs import ROOT

COMMITTED = [ROOT / "crds" / CRD_FILENAME]

ALLOWED_KEYS = {
    "type", "description", "properties", "additionalProperties", "items", "required", "enum",
    "default", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
    "maxLength", "pattern", "minItems", "maxItems", "anyOf", "format", "nullable",
    "x-kubernetes-validations", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
}


def test_committed_crds_equal_the_generator_output():
    expected = render_crd_yaml()
    for path in COMMITTED:
        assert path.read_text() == expected, f"{path} drifted from the model: run `llmtrain crd --write`"
    chart = ROOT / CHART_CRD_TEMPLATE
    assert chart.read_text() == render_chart_crd_template(), f"{chart} drifted from the model: run `llmtrain crd --write`"
    assert not (ROOT / "charts" / "llmtrain-operator" / "crds").exists(), "Helm never upgrades crds/: the CRD is a template"


def test_the_chart_template_is_the_crd_with_its_template_lines_around_it():
    """Helm's rendering is checked in tests/cluster/test_chart.py; here, without helm: the
    template's lines that are not Go template code are the CRD, to the last field."""
    text = render_chart_crd_template()
    keep = "  {{- if .Values.crds.keep }}\n  annotations:\n    helm.sh/resource-policy: keep\n  {{- end }}\n"
    assert text.count(keep) == 1
    plain = "\n".join(line for line in text.replace(keep, "").splitlines() if "{{" not in line)
    assert yaml.safe_load(plain) == build_crd()


def test_a_schema_text_that_looks_like_template_code_is_refused(monkeypatch):
    real = crd_module.build_crd

    def tampered() -> dict[str, Any]:
        out = real()
        out["spec"]["names"]["categories"] = ["{{ .Values.x }}"]
        return out

    monkeypatch.setattr(crd_module, "build_crd", tampered)
    with pytest.raises(ValueError, match="Helm would execute"):
        crd_module.render_chart_crd_template()


def _walk(node: dict[str, Any], path: str, problems: list[str]) -> None:
    unknown = set(node) - ALLOWED_KEYS
    if unknown:
        problems.append(f"{path}: keys not allowed in a CRD schema: {sorted(unknown)}")
    exempt = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
    if "type" not in node and not exempt:
        problems.append(f"{path}: no type")
    if "anyOf" in node:
        if not node.get("x-kubernetes-int-or-string") or node["anyOf"] != [{"type": "integer"}, {"type": "string"}]:
            problems.append(f"{path}: anyOf is only allowed in the int-or-string form")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
    for name, child in (node.get("properties") or {}).items():
        _walk(child, f"{path}.{name}", problems)
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}[*]", problems)
    if "items" in node:
        _walk(node["items"], f"{path}[]", problems)
    for rule in node.get("x-kubernetes-validations", []):
        if set(rule) - {"rule", "message", "messageExpression", "reason", "fieldPath", "optionalOldSelf"}:
            problems.append(f"{path}: bad x-kubernetes-validations entry {rule}")
    if node.get("type") == "object" and node.get("x-kubernetes-preserve-unknown-fields") and path.count(".") < 1:
        problems.append(f"{path}: preserve-unknown-fields at the top level")


def test_the_crd_schema_is_structural():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    problems: list[str] = []
    _walk(schema, "", problems)
    assert not problems, "\n".join(problems)


def test_metadata_only_restricts_the_name():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert set(schema["properties"]["metadata"]["properties"]) == {"name"}


def test_preserve_unknown_fields_is_only_on_passthroughs():
    text = render_crd_yaml()
    doc = yaml.safe_load(text)
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if node.get("x-kubernetes-preserve-unknown-fields"):
                found.append(path)
            for key, value in node.items():
                walk(value, f"{path}.{key}")

    walk(doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")
    leaves = sorted(p.replace(".properties", "") for p in found)
    # podTemplate.spec, scheduling.affinity and env[].valueFrom are typed by the upstream
    # schemas (coretypes.py), whose one free-form field is managedFields' fieldsV1. The
    # status's internal bookkeeping is the operator's own (its shape may change between
    # versions, and an operator must never have its writes refused by the other's CRD).
    assert leaves == [
        ".spec.podTemplate.spec.volumes.items.ephemeral.volumeClaimTemplate.metadata.managedFields.items.fieldsV1",
        ".spec.trainer.builtin.strategy.deepspeedConfig",
        ".status.internal",
    ]


def test_contract_names_columns_and_subresources():
    crd = build_crd()
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("LLMTrainJob", "llmtrainjobs", ["ltj"])
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {"specReplicasPath": ".spec.replicas.max", "statusReplicasPath": ".status.replicas.ready",
                                                "labelSelectorPath": ".status.selector"}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Phase", "Workers", "Step", "Restarts", "Last Checkpoint", "Age"]



def test_conditions_are_a_map_by_type_and_every_time_is_a_date_time():
    status = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    conditions = status["conditions"]
    assert (conditions["x-kubernetes-list-type"], conditions["x-kubernetes-list-map-keys"]) == ("map", ["type"])
    assert "type" in conditions["items"]["required"], "a map key must be required"
    assert conditions["items"]["properties"]["lastTransitionTime"]["format"] == "date-time"
    for field in ("startTime", "completionTime", "lastProgressTime", "nextRestartTime", "lastReconcileTime"):
        assert status[field] == {**status[field], "type": "string", "format": "date-time"}, field
    assert status["quarantinedNodes"]["items"]["properties"]["until"]["format"] == "date-time"
    assert status["lastFailure"]["properties"]["time"]["format"] == "date-time"
    assert status["internal"] == {**status["internal"], "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert "properties" not in status["internal"]

def _rules(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [r["rule"] for r in node.get("x-kubernetes-validations", [])]
        return own + [r for value in node.values() for r in _rules(value)]
    if isinstance(node, list):
        return [r for value in node for r in _rules(value)]
    return []


def test_immutable_fields_carry_their_transition_rule():
    # The cross-field rules come from the rule table (tests/contract/test_rules.py checks each is
    # in the CRD); immutability needs the old object, so only the server's CEL has it.
    rules = _rules(yaml.safe_load(render_crd_yaml()))
    assert rules.count("self == oldSelf") == 2


def test_every_spec_field_has_a_description():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        for name, child in (node.get("properties") or {}).items():
            if not child.get("description") and path.count(".") < 6:
                missing.append(f"{path}.{name}")
            walk(child, f"{path}.{name}")
        if "items" in node:
            walk(node["items"], path + "[]")

    walk(schema, "spec")
    # Toleration fields mirror core/v1, and the core types' fields (coretypes.py) are
    # core/v1's: both are documented there (`kubectl explain pod.spec`).
    core = ("spec.podTemplate.spec.", "spec.scheduling.affinity.", "spec.env[].valueFrom.")
    missing = [m for m in missing if ".tolerations[]." not in m and not m.startswith(core)]
    assert not missing, f"fields without a docstring: {missing}"
