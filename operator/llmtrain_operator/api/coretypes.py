"""Kubernetes core types inside the spec (``podTemplate.spec``, ``scheduling.affinity``,
``env[].valueFrom``), checked by the upstream schemas instead of passed through.

``k8s/core-v1.json`` holds the API server's own OpenAPI v3 definitions of the types the
spec embeds (``PodSpec``, ``Affinity``, ``EnvVarSource`` and what they reference),
descriptions dropped, as the pinned kube-apiserver serves them
(``hack/k8s_openapi.py`` writes it; ``tests/cluster/test_core_schemas.py`` fails when it
drifts from the test bed's API server). Two uses, one translation:

- ``structural(name)``: the type as a structural CRD schema, inlined into the CRD (crd.py),
  so the API server refuses a misspelt ``volumeMount:`` (with ``fieldValidation=Strict``,
  kubectl's default) or drops it with a warning, instead of keeping it in silence;
- ``problems(value, name)``: the same schema checked here, so ``llmtrain validate`` (and
  the model, wherever it parses a job) names the field offline.

What is checked: field names, types, enums, quantity and int-or-string forms. Not
``required`` (the template is a *partial* pod, merged over the generated one: a field a
template omits is the operator's to fill, and the API server checks the whole pod at
create) and not defaults (the server would write them into the job's spec).
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SCHEMAS = Path(__file__).with_name("k8s") / "core-v1.json"
POD_SPEC = "io.k8s.api.core.v1.PodSpec"
AFFINITY = "io.k8s.api.core.v1.Affinity"
ENV_VAR_SOURCE = "io.k8s.api.core.v1.EnvVarSource"
ROOTS = (POD_SPEC, AFFINITY, ENV_VAR_SOURCE)
"""The types the spec embeds; the file holds these and everything they reference."""

MARK = "x-llmtrain-core-type"
"""The JSON-schema key that marks a model field as a core type (``field``): crd.py puts
the structural schema there."""


def field(name: str) -> dict[str, Any]:
    """A field's ``json_schema_extra``: this field is the core type ``name``."""
    return {MARK: name}

QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A resource.Quantity's text form, here and for the spec's own quantities."""

MAX_REPORTED = 10
"""Problems named in one error; a hostile template with thousands gets a count."""

_KEPT = ("type", "format", "enum", "properties", "additionalProperties", "items")
"""What a structural node keeps of an upstream one: required, defaults, list and map
types (a map list needs its keys required or defaulted), patch strategies and unions
are dropped (see the module docstring)."""


# --- the committed file ------------------------------------------------------------------

def _refs(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                out.add(value.rsplit("/", 1)[-1])
            else:
                _refs(value, out)
    elif isinstance(node, list):
        for value in node:
            _refs(value, out)


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_without_descriptions(v) for v in node]
    return node


def trim(openapi: dict[str, Any]) -> dict[str, Any]:
    """The part of an API server's ``/openapi/v3/api/v1`` document the spec needs: the
    closure of ``ROOTS`` under ``$ref``, without descriptions, keys sorted."""
    schemas = openapi["components"]["schemas"]
    seen: set[str] = set()
    stack = list(ROOTS)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        if name not in schemas:
            raise KeyError(f"the API server's schema has no {name}")
        seen.add(name)
        found: set[str] = set()
        _refs(schemas[name], found)
        stack.extend(found)
    return {name: _without_descriptions(schemas[name]) for name in sorted(seen)}


@cache
def definitions() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMAS.read_text())
    return loaded


# --- the structural form -------------------------------------------------------------------

def _node(schema: dict[str, Any], defs: dict[str, Any], trail: tuple[str, ...]) -> dict[str, Any]:
    if "allOf" in schema:  # kube-openapi wraps a field's $ref as allOf: [{$ref}]
        [only] = schema["allOf"]
        return _node({**{k: v for k, v in schema.items() if k != "allOf"}, **only}, defs, trail)
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name == QUANTITY:
            return {"anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": QUANTITY_PATTERN, "x-kubernetes-int-or-string": True}
        if name == INT_OR_STRING:
            return {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
        if name in trail:  # no core type the spec embeds is recursive; refuse rather than loop
            raise ValueError(f"recursive type {name}")
        return _node(defs[name], defs, (*trail, name))
    if "type" not in schema:
        raise ValueError(f"no type in {sorted(schema)} under {'/'.join(trail)}")
    out = {key: copy.deepcopy(schema[key]) for key in _KEPT if key in schema}
    if "properties" in out:
        out["properties"] = {key: _node(value, defs, trail) for key, value in sorted(out["properties"].items())}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _node(out["additionalProperties"], defs, trail)
    if "items" in out:
        out["items"] = _node(out["items"], defs, trail)
    if out["type"] == "object" and "properties" not in out and "additionalProperties" not in out:
        # Free-form upstream (FieldsV1): a structural object without fields would be pruned empty.
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


@cache
def _structural(name: str) -> dict[str, Any]:
    return _node({"$ref": name}, definitions(), ())


def structural(name: str) -> dict[str, Any]:
    """``name`` (a key of ``ROOTS``) as a structural CRD schema, every reference inlined."""
    return copy.deepcopy(_structural(name))


# --- checking a value -------------------------------------------------------------------

_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,), "integer": (int,),
                                       "number": (int, float), "boolean": (bool,)}


def _type_ok(value: Any, type_: str) -> bool:
    if isinstance(value, bool) and type_ in ("integer", "number"):
        return False
    return isinstance(value, _TYPES[type_])


def _where(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _check(value: Any, schema: dict[str, Any], path: str, out: list[str]) -> None:
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            out.append(f"{path or 'value'}: must be an integer or a string, got {type(value).__name__}")
        elif "pattern" in schema and isinstance(value, str) and not re.fullmatch(schema["pattern"], value):
            out.append(f"{path or 'value'}: {value!r} is not a quantity (like 500m, 8Gi or 2)")
        return
    type_ = schema["type"]
    if value is None:
        return  # null: the field unset, as the API server reads it
    if not _type_ok(value, type_):
        out.append(f"{path or 'value'}: must be {'an' if type_[0] in 'aeiou' else 'a'} {type_}, got {type(value).__name__}")
        return
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path or 'value'}: {value!r} is not one of {', '.join(map(str, schema['enum']))}")
    if type_ == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, child in value.items():
            if props is not None and key in props:
                _check(child, props[key], _where(path, key), out)
            elif isinstance(extra, dict):
                _check(child, extra, _where(path, key), out)
            elif props is not None:
                close = difflib.get_close_matches(str(key), list(props), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                out.append(f"{_where(path, str(key))}: unknown field{hint}")
    elif type_ == "array" and "items" in schema:
        for index, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{index}]", out)


def problems(value: Any, name: str) -> list[str]:
    """What is wrong with ``value`` as the core type ``name``, each naming its field
    (relative to the value); empty when nothing is."""
    out: list[str] = []
    _check(value, _structural(name), "", out)
    return out


def checked(value: T, name: str) -> T:
    """``value`` when it is a valid (partial) ``name``; ValueError listing every problem
    otherwise (pydantic prefixes the field's own path)."""
    if value is None:
        return value
    found = problems(value, name)
    if found:
        short = name.rsplit(".", 1)[-1]
        shown = "; ".join(found[:MAX_REPORTED])
        more = f"; and {len(found) - MAX_REPORTED} more" if len(found) > MAX_REPORTED else ""
        raise ValueError(f"not a valid Kubernetes {short}: {shown}{more}")
    return value
