"""API-contract tests: the real reconcile pass and Kubernetes client against kmock."""

from __future__ import annotations

from typing import Any

import kmock as kmock_lib
import pytest
from llmtrain_operator.k8s.client import K8s

VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]
CORE = [("pods", "Pod", True), ("nodes", "Node", False), ("services", "Service", True), ("configmaps", "ConfigMap", True),
        ("events", "Event", True), ("secrets", "Secret", True), ("persistentvolumeclaims", "PersistentVolumeClaim", True),
        ("namespaces", "Namespace", False)]
JOBS = "llmtrain.io/v1alpha1/llmtrainjobs"


@pytest.fixture
def api(kmock: kmock_lib.KubernetesEmulator) -> kmock_lib.KubernetesEmulator:
    for plural, kind, namespaced in CORE:
        kmock.resources[f"v1/{plural}"] = {"namespaced": namespaced, "kind": kind, "singular": kind.lower(), "verbs": VERBS,
                                           "shortnames": [], "categories": [], "subresources": []}
    # kopf's observers wait for these two to be discoverable before any watch starts.
    kmock.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = {
        "namespaced": False, "kind": "CustomResourceDefinition", "singular": "customresourcedefinition", "verbs": VERBS,
        "shortnames": ["crd"], "categories": [], "subresources": []}
    kmock.resources[JOBS] = {"namespaced": True, "kind": "LLMTrainJob", "singular": "llmtrainjob", "verbs": VERBS,
                             "shortnames": ["ltj"], "categories": ["llmtrain"], "subresources": ["status"]}
    kmock.resources["networking.k8s.io/v1/networkpolicies"] = {
        "namespaced": True, "kind": "NetworkPolicy", "singular": "networkpolicy", "verbs": VERBS, "shortnames": ["netpol"],
        "categories": [], "subresources": []}
    return kmock


@pytest.fixture(autouse=True)
def no_remembered_refusals():
    """Refused creates are remembered per job in the handler module: none leak between tests."""
    import importlib

    remembered = importlib.import_module("llmtrain_operator.handlers.reconcile")._REFUSALS
    remembered.clear()
    yield
    remembered.clear()


@pytest.fixture
def k8s(api: Any) -> K8s:
    return K8s.for_url(str(api.url), timeout=(2, 2))
