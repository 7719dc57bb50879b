"""Generate the ``CustomResourceDefinition`` from the typed model.

The model is the one source of truth. ``llmtrain crd --write`` refreshes ``crds/`` and
the chart's template of it; ``tests/operator/api/test_crd.py`` fails when either drifts from this output.

pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3.0
schema. The translation below: inline every ``$ref``, turn ``X | None`` into an
optional ``X``, turn ``int | str`` quantities into ``x-kubernetes-int-or-string``,
free-form ``dict[str, Any]`` into ``x-kubernetes-preserve-unknown-fields``, numeric
exclusive bounds into the v3.0 boolean form, and drop titles. A field marked as a
Kubernetes core type (``coretypes.field``) gets upstream's schema (``coretypes.structural``).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from . import coretypes
from . import job as job_api
from .coretypes import QUANTITY_PATTERN
from .spec import LLMTrainJobSpec
from .status import LLMTrainJobStatus

CRD_FILENAME = "llmtrain.io_llmtrainjobs.yaml"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Workers", "type": "string", "jsonPath": ".status.workers", "description": "ready/desired worker pods"},
    {"name": "Step", "type": "string", "jsonPath": ".status.progress", "description": "step/maxSteps"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {
        "name": "Last Checkpoint",
        "type": "string",
        "jsonPath": ".status.lastCheckpoint.summary",
        "description": "newest committed checkpoint as step@tier",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "World", "type": "integer", "jsonPath": ".status.worldSize", "priority": 1},
    {"name": "Disruptions", "type": "integer", "jsonPath": ".status.disruptions", "priority": 1},
    {"name": "ETTR", "type": "number", "jsonPath": ".status.ettr", "priority": 1,
     "description": "effective training time ratio: preserved progress over active time"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.loss", "priority": 1},
    {"name": "Tokens/s", "type": "number", "jsonPath": ".status.tokensPerSecond", "priority": 1},
    {"name": "ETA", "type": "string", "jsonPath": ".status.eta", "priority": 1, "description": "time left to maxSteps"},
]

_DROP_KEYS = {"title", "x-llmtrain-quantity"}
OPAQUE = "x-llmtrain-opaque"
"""A field whose schema the API server does not check (``x-kubernetes-preserve-unknown-fields``):
``status.internal``, which may change shape between operator versions, so that an
operator of one version and the CRD of another never refuse each other's writes."""


def _clean_description(text: str) -> str:
    # Docstrings wrap at ~88 columns; the CRD (and `kubectl explain`) reflow anyway.
    # Docstrings use reST ``literals``; kubectl explain shows plain text, so keep one tick.
    paragraphs = [" ".join(line.strip() for line in para.splitlines()) for para in text.strip().split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p).replace("``", "`")


def _is_null(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "null"


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Translate one pydantic JSON-schema node into a structural OpenAPI v3.0 node."""
    schema = copy.deepcopy(schema)
    if schema.pop(OPAQUE, False):  # the operator's own bookkeeping: its shape is not the API's
        return {"type": "object", "description": _clean_description(schema.get("description", "")),
                "x-kubernetes-preserve-unknown-fields": True}
    core = schema.pop(coretypes.MARK, None)
    if core is not None:  # a Kubernetes type: the upstream schema, with the field's description
        typed = coretypes.structural(core)
        return {"type": typed.pop("type"), "description": _clean_description(schema["description"]), **typed}
    if "$ref" in schema:
        ref = schema.pop("$ref").split("/")[-1]
        target = copy.deepcopy(defs[ref])
        # Field-level keys (description, default, CEL rules) override the model's own,
        # except that rules from both places are kept.
        rules = target.get("x-kubernetes-validations", []) + schema.pop("x-kubernetes-validations", [])
        target.update(schema)
        if rules:
            target["x-kubernetes-validations"] = rules
        schema = target

    quantity = schema.get("x-llmtrain-quantity", False)
    keyword = schema.pop("x-llmtrain-int-or-keyword", None)
    if "anyOf" in schema and keyword is not None:
        # An integer in bounds or one keyword: int-or-string, its bounds checked in CEL
        # (a structural int-or-string node carries no type-specific keywords).
        options = [o for o in schema.pop("anyOf") if not _is_null(o)]
        number = next(o for o in options if o.get("type") == "integer")
        low, high = number.get("minimum"), number.get("maximum")
        bounds = " && ".join(b for b in (f"self >= {low}" if low is not None else "",
                                          f"self <= {high}" if high is not None else "") if b) or "true"
        schema.update({
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": schema.get("x-kubernetes-validations", []) + [{
                "rule": f"type(self) == string ? self == '{keyword}' : ({bounds})",
                "message": f"must be an integer in [{low}, {high}] or '{keyword}'",
            }],
        })
    elif "anyOf" in schema:
        options = [o for o in schema.pop("anyOf") if not _is_null(o)]
        types = sorted(o.get("type", "") for o in options)
        if quantity or types == ["integer", "string"]:
            schema.update(
                {
                    "anyOf": [{"type": "integer"}, {"type": "string"}],
                    "pattern": QUANTITY_PATTERN,
                    "x-kubernetes-int-or-string": True,
                }
            )
        elif len(options) == 1:
            inner = _structural(options[0], defs)
            outer_rules = schema.pop("x-kubernetes-validations", [])
            inner.update({k: v for k, v in schema.items()})
            if outer_rules:
                inner["x-kubernetes-validations"] = inner.get("x-kubernetes-validations", []) + outer_rules
            schema = inner
        else:  # pragma: no cover - guarded by test_crd_is_structural
            raise ValueError(f"cannot express union {options} structurally")

    if "const" in schema:
        schema["enum"] = [schema.pop("const")]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in schema and not isinstance(schema[bound], bool):
            schema[plain] = schema.pop(bound)
            schema[bound] = True
    if "description" in schema:
        schema["description"] = _clean_description(schema["description"])
    if schema.get("default") is None:
        schema.pop("default", None)

    if schema.get("type") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is not None:
            schema["properties"] = {k: _structural(v, defs) for k, v in props.items()}
            schema.pop("additionalProperties", None)
        elif extra is True or extra == {} or (isinstance(extra, dict) and not extra.get("type") and "$ref" not in extra
                                              and "anyOf" not in extra):
            schema.pop("additionalProperties", None)
            schema["x-kubernetes-preserve-unknown-fields"] = True
        elif isinstance(extra, dict):
            schema["additionalProperties"] = _structural(extra, defs)
        if schema.get("required") == []:
            schema.pop("required")
    if schema.get("type") == "array" and "items" in schema:
        schema["items"] = _structural(schema["items"], defs)

    for key in _DROP_KEYS:
        schema.pop(key, None)
    # A stable, readable key order: type and description first, children last.
    head = [k for k in ("type", "description") if k in schema]
    tail = [k for k in ("properties", "additionalProperties", "items", "required") if k in schema]
    middle = [k for k in schema if k not in head and k not in tail]
    return {k: schema[k] for k in head + middle + tail}


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(raw, defs)


def openapi_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of the single served version."""
    spec = _model_schema(LLMTrainJobSpec)
    status = _model_schema(LLMTrainJobStatus)
    return {
        "type": "object",
        "description": (
            "LLMTrainJob runs elastic LLM training (torchrun + DeepSpeed/DDP) with hang "
            "detection, automatic recovery and tiered checkpoints."
        ),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "maxLength": job_api.NAME_MAX_LENGTH,
                        "pattern": job_api.NAME_PATTERN,
                    }
                },
            },
            "spec": spec,
            "status": status,
        },
    }


def build_crd() -> dict[str, Any]:
    """The whole CRD object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{job_api.PLURAL}.{job_api.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "llmtrain-operator"},
        },
        "spec": {
            "group": job_api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": job_api.KIND,
                "listKind": f"{job_api.KIND}List",
                "plural": job_api.PLURAL,
                "singular": job_api.SINGULAR,
                "shortNames": list(job_api.SHORT_NAMES),
                "categories": ["llmtrain"],
            },
            "versions": [
                {
                    "name": job_api.VERSION,
                    "served": True,
                    "storage": True,
                    # scale: `kubectl scale ltj --replicas=N` (or an autoscaler) sets
                    # replicas.max, the nodes the job runs when it can have them; min stays
                    # the floor (a max below it is refused by the replicas rule).
                    "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas.max",
                                                             "statusReplicasPath": ".status.replicas.ready",
                                                             "labelSelectorPath": ".status.selector"}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


HEADER = (
    "# Generated by `llmtrain crd --write` from operator/llmtrain_operator/api/.\n"
    "# Do not edit by hand: tests/operator/api/test_crd.py fails when this file drifts from the model.\n"
)


def render_crd_yaml() -> str:
    return HEADER + yaml.safe_dump(build_crd(), sort_keys=False, width=100, allow_unicode=True)


CHART_CRD_TEMPLATE = f"charts/llmtrain-operator/templates/crds/{CRD_FILENAME}"
"""The chart's copy, under ``templates/crds/``: a template, not a file in the chart's
``crds/``, which Helm installs once and never upgrades (``helm upgrade`` would leave a
changed schema behind). ``crds.install`` renders it; ``crds.keep`` (the default) tells
Helm to leave it at ``helm uninstall``, since deleting a CRD deletes every job."""


def render_chart_crd_template() -> str:
    """The CRD as a Helm template: the same object as ``render_crd_yaml``, plus the
    release's labels and the keep policy, behind ``crds.install``."""
    crd = build_crd()
    body = yaml.safe_dump({"spec": crd["spec"]}, sort_keys=False, width=100, allow_unicode=True)
    if "{{" in body or "}}" in body:
        # Helm would read it as template code: the schema's text must not look like it.
        raise ValueError("the CRD's schema contains '{{' or '}}', which Helm would execute as a template")
    labels = "".join(f"    {key}: {value}\n" for key, value in crd["metadata"]["labels"].items())
    return (
        HEADER
        + "{{- if .Values.crds.install }}\n"
        + f"apiVersion: {crd['apiVersion']}\nkind: {crd['kind']}\nmetadata:\n  name: {crd['metadata']['name']}\n"
        + "  labels:\n" + labels + '    {{- include "llmtrain.labels" . | nindent 4 }}\n'
        + "  {{- if .Values.crds.keep }}\n  annotations:\n    helm.sh/resource-policy: keep\n  {{- end }}\n"
        + body
        + "{{- end }}\n"
    )
