"""The API rights the operator's process uses, derived from its source, for the RBAC
tests to compare with what the chart grants (both ways: nothing used is missing,
nothing granted is unused).

- The operator's process is the package modules ``llmtrain_operator.handlers`` imports,
  transitively (the CLI's modules, which run with the user's kubeconfig, are not in it).
- In those modules, every attribute named after a method of ``K8s`` (``k8s/client.py``)
  or ``LeaseClient`` (``k8s/lease.py``) counts as a use of that method.
- Each such method's rights are read from the Kubernetes client calls in its body:
  ``self.core.create_namespaced_pod`` is ``create pods``; a custom-object call names its
  group and resource only at run time, so those are declared in ``CUSTOM`` below, and the
  test fails for a custom-object call that is not declared (or a declaration no call uses).
- kopf's watches: every ``@kopf.index`` and ``@kopf.on.event`` resource is listed and
  watched; kopf also lists and watches CRDs (discovery) and, cluster-wide, namespaces.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "llmtrain_operator"

Right = tuple[str, str, str]
"""(API group, resource[/subresource], verb)."""

CLUSTER_SCOPED = {"nodes", "customresourcedefinitions", "namespaces", "resourceflavors"}

_VERBS = {"create": "create", "read": "get", "list": "list", "patch": "patch", "replace": "update", "delete": "delete"}
_TYPED = {"core": "", "networking": "networking.k8s.io", "api": "coordination.k8s.io"}
"""The client attribute a typed call is made on -> its API group (``self.api`` is the
LeaseClient's CoordinationV1Api)."""

PODGROUP_GROUPS = ("scheduling.volcano.sh", "scheduling.x-k8s.io")
CUSTOM: dict[tuple[str, str], frozenset[Right]] = {
    # K8s.create: the custom kinds the planner creates (CUSTOM_PLURALS): a gang's PodGroup, a queued job's Workload.
    ("create", "create_namespaced_custom_object"):
        frozenset({*((g, "podgroups", "create") for g in PODGROUP_GROUPS), ("kueue.x-k8s.io", "workloads", "create")}),
    # UpdateSpec: a gang's PodGroup when the job's size changes.
    ("update_spec", "patch_namespaced_custom_object"): frozenset((g, "podgroups", "patch") for g in PODGROUP_GROUPS),
    # PatchStatus: a Workload's status (the operator is the kind's Kueue integration).
    ("patch_object_status", "patch_namespaced_custom_object_status"): frozenset({("kueue.x-k8s.io", "workloads/status", "patch")}),
    ("set_suspend", "patch_namespaced_custom_object"): frozenset({("llmtrain.io", "llmtrainjobs", "patch")}),
    ("delete_object", "delete_namespaced_custom_object"): frozenset((g, "podgroups", "delete") for g in PODGROUP_GROUPS),
    ("delete_job", "delete_namespaced_custom_object"): frozenset({("llmtrain.io", "llmtrainjobs", "delete")}),
    ("patch_status", "patch_namespaced_custom_object_status"): frozenset({("llmtrain.io", "llmtrainjobs/status", "patch")}),
    # read_object: a job (its stranded sweep), a PodGroup, a Workload, and (cluster-wide) a ResourceFlavor.
    ("read_object", "get_namespaced_custom_object"):
        frozenset({("llmtrain.io", "llmtrainjobs", "get"), ("kueue.x-k8s.io", "workloads", "get"),
                   *((g, "podgroups", "get") for g in PODGROUP_GROUPS)}),
    ("read_object", "get_cluster_custom_object"): frozenset({("kueue.x-k8s.io", "resourceflavors", "get")}),
}
KOPF_ALWAYS: frozenset[Right] = frozenset({("apiextensions.k8s.io", "customresourcedefinitions", "list"),
                                           ("apiextensions.k8s.io", "customresourcedefinitions", "watch")})
KOPF_CLUSTER_WIDE: frozenset[Right] = frozenset({("", "namespaces", "list"), ("", "namespaces", "watch")})
_CONSTANTS = {"GROUP": "llmtrain.io", "VERSION": "v1alpha1", "PLURAL": "llmtrainjobs"}


def _plural(snake: str) -> str:
    word = snake.replace("_", "")
    return word[:-1] + "ies" if word.endswith("y") else word + "s"


def typed_right(attr: str, method: str) -> Right:
    """``create_namespaced_pod`` on ``core`` -> ("", "pods", "create")."""
    match = re.fullmatch(r"(create|read|list|patch|replace|delete)_(?:namespaced_)?(.+?)(_log|_status)?", method)
    if match is None:
        raise ValueError(f"not a typed Kubernetes client call: {attr}.{method}")
    verb, kind, sub = match.groups()
    return _TYPED[attr], _plural(kind) + ("/" + sub[1:] if sub else ""), _VERBS[verb]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _module_path(name: str) -> Path | None:
    rel = name.split(".")[1:]
    for candidate in (PACKAGE.joinpath(*rel).with_suffix(".py"), PACKAGE.joinpath(*rel, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def operator_modules() -> list[Path]:
    """The package's modules the operator process loads: ``handlers`` and what it imports."""
    seen: dict[str, Path] = {}
    todo = ["llmtrain_operator.handlers"]
    while todo:
        name = todo.pop()
        path = _module_path(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(max(0, node.level - 1)):
                    base = base.rpartition(".")[0]
                module = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
                if module.startswith("llmtrain_operator"):
                    todo.append(module)
                    todo += [f"{module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("llmtrain_operator")]
    return sorted(seen.values())


def _methods(path: Path, cls: str) -> dict[str, list[tuple[str, str]]]:
    """Method -> the (client attribute, API method) calls in its body."""
    out: dict[str, list[tuple[str, str]]] = {}
    for node in _tree(path).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for fn in (n for n in node.body if isinstance(n, ast.FunctionDef)):
                calls = []
                for sub in ast.walk(fn):
                    if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute)
                            and isinstance(sub.value.value, ast.Name) and sub.value.value.id == "self"
                            and sub.value.attr in (*_TYPED, "custom")):
                        calls.append((sub.value.attr, sub.attr))
                out[fn.name] = calls
    return out


def client_methods() -> dict[str, list[tuple[str, str]]]:
    return {**_methods(PACKAGE / "k8s" / "client.py", "K8s"),
            **{f"lease.{m}": c for m, c in _methods(PACKAGE / "k8s" / "lease.py", "LeaseClient").items()}}


def method_rights(method: str, calls: list[tuple[str, str]]) -> set[Right]:
    rights: set[Right] = set()
    for attr, api in calls:
        if attr == "custom":
            key = (method, api)
            if key not in CUSTOM:
                raise KeyError(f"K8s.{method} calls {api}: declare its group and resource in tests/support/rights.py CUSTOM")
            rights |= CUSTOM[key]
        else:
            rights.add(typed_right(attr, api))
    return rights


def used_methods(modules: list[Path]) -> set[str]:
    """``K8s`` methods referenced in ``modules`` (``k8s.create``, ``_K8S.exists``, a
    method passed to ``to_thread``); every ``LeaseClient`` method once the class is used."""
    methods = client_methods()
    used: set[str] = set()
    for path in modules:
        if path.parent.name == "k8s" and path.name in ("client.py", "lease.py"):
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Attribute) and node.attr in methods:
                receiver = node.value
                name = receiver.id if isinstance(receiver, ast.Name) else receiver.attr if isinstance(receiver, ast.Attribute) else ""
                if name.lower().lstrip("_") in ("k8s", "client", "api"):
                    used.add(node.attr)
            if isinstance(node, ast.Name) and node.id == "LeaseClient":
                used |= {m for m in methods if m.startswith("lease.")}
    return used


def watched() -> set[Right]:
    """list and watch of each resource a kopf index or event handler names."""
    out: set[Right] = set()
    for node in ast.walk(_tree(PACKAGE / "handlers" / "__init__.py")):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = ast.unparse(func)
        if name not in ("kopf.index", "kopf.on.event"):
            continue
        args = [a.value if isinstance(a, ast.Constant) else _CONSTANTS[a.id] for a in node.args if isinstance(a, (ast.Constant, ast.Name))]
        group, resource = ("", args[0]) if len(args) == 1 else (args[0], args[2])
        out |= {(group, resource, "list"), (group, resource, "watch")}
    return out


def needed(cluster_wide: bool) -> set[Right]:
    """Every right the operator's process uses in that watch mode. A cluster-wide
    operator reads no Secrets (``LLMTRAIN_CHECK_SECRETS`` off: the chart grants none, so
    a missing Secret is reported from the pods' wait instead)."""
    methods = client_methods()
    rights: set[Right] = set()
    for method in used_methods(operator_modules()):
        rights |= method_rights(method, methods[method])
    rights |= watched() | KOPF_ALWAYS | (KOPF_CLUSTER_WIDE if cluster_wide else set())
    if cluster_wide:
        rights.discard(("", "secrets", "get"))
    return rights


def granted(rules: list[dict]) -> set[Right]:
    """The rights a list of RBAC rules grants (resourceNames ignored: asked separately)."""
    return {(g, r, v) for rule in rules for g in rule.get("apiGroups", []) for r in rule.get("resources", [])
            for v in rule.get("verbs", [])}
