"""One LLMTrainJob read through the API server, for the CLI (``llmtrain status``,
``llmtrain logs``): a client from the kubeconfig, then the job, or why not in words."""

from __future__ import annotations

from typing import Any

from .api.job import GROUP, PLURAL, VERSION


class Unreadable(Exception):
    """The job could not be read; the message says why. ``transient``: a retry may succeed
    (the API server busy or restarting, a dropped connection)."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


def connect() -> Any:
    """A client (``k8s.client.K8s``) from in-cluster credentials or the kubeconfig."""
    try:
        from .k8s.client import K8s  # noqa: PLC0415 - the operator extra; the base install has no kubernetes client
    except ModuleNotFoundError as err:
        raise Unreadable(f"{err.name} is not installed (pip install 'llmtrain-operator[operator]')") from None
    try:
        return K8s.from_environment()
    except Exception as err:  # noqa: BLE001 - no kubeconfig, a bad one: said in words, no traceback
        raise Unreadable(f"cannot reach the API server: {type(err).__name__}: {err}") from None


def read_job(k8s: Any, namespace: str, name: str) -> dict[str, Any]:
    """The job's object as the API server has it."""
    from .k8s.client import TransientApiError  # noqa: PLC0415 - connect() has imported it already

    try:
        served, job = k8s.read_object(f"{GROUP}/{VERSION}", PLURAL, namespace, name)
    except Exception as err:  # noqa: BLE001 - every API and network error: said by its reason
        raise Unreadable(f"cannot read LLMTrainJob {namespace}/{name}: {err}", transient=isinstance(err, TransientApiError)) from None
    if not served:
        raise Unreadable("this cluster serves no LLMTrainJob (is the CRD installed?)")
    if job is None:
        raise Unreadable(f"no LLMTrainJob {name} in namespace {namespace}")
    return job
