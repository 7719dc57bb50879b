"""A dynamic provisioner for PersistentVolumeClaims: each pending claim gets a hostPath
PersistentVolume under ``<state>/pvs/`` that every simulated node can see (the shared
checkpoint tier is a ReadWriteMany claim). The real PV controller then binds them. Once a
claim is deleted, its volume (Released, or Failed: no deleter exists for hostPath) and its
folder are deleted here, as a real provisioner's deleter does; otherwise a claim made again
under the same namespace and name would never get a volume (the name is taken)."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("localcluster.provisioner")


def provision_once(core: client.CoreV1Api, root: Path, in_node: Path | None = None) -> int:
    """A PV for each pending claim, in a folder under ``root``; ``in_node``: where the
    nodes see ``root`` (kind mounts it into its node containers elsewhere), and the
    folder is then open to every uid (the pods there run as a non-root user)."""
    created = 0
    for pvc in core.list_persistent_volume_claim_for_all_namespaces().items:
        if pvc.status.phase != "Pending" or pvc.spec.volume_name:
            continue
        name = f"pv-{pvc.metadata.namespace}-{pvc.metadata.name}"[:63]
        path = root / name
        path.mkdir(parents=True, exist_ok=True)
        if in_node is not None:
            path.chmod(0o777)
        size = (pvc.spec.resources.requests or {}).get("storage", "1Gi")
        body = {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "labels": {"localcluster.io/provisioned": "true"}},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": pvc.spec.access_modes or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": pvc.spec.storage_class_name or "",
                "hostPath": {"path": str((in_node or root) / name), "type": "DirectoryOrCreate"},
                "claimRef": {"namespace": pvc.metadata.namespace, "name": pvc.metadata.name, "uid": pvc.metadata.uid},
            },
        }
        try:
            core.create_persistent_volume(body)
            created += 1
        except ApiException as err:
            if err.status != 409:
                log.warning("provisioning %s: %s", name, err.reason)
    return created


def reclaim_once(core: client.CoreV1Api, root: Path) -> int:
    """Deletes the volumes this provisioner made whose claim is gone, and their folders."""
    deleted = 0
    for pv in core.list_persistent_volume(label_selector="localcluster.io/provisioned=true").items:
        if pv.status.phase not in ("Released", "Failed"):
            continue
        try:
            core.delete_persistent_volume(pv.metadata.name)
        except ApiException as err:
            if err.status != 404:
                log.warning("reclaiming %s: %s", pv.metadata.name, err.reason)
                continue
        shutil.rmtree(root / pv.metadata.name, ignore_errors=True)
        deleted += 1
    return deleted


def loop(core: client.CoreV1Api, root: Path, stop: threading.Event, in_node: Path | None = None) -> None:
    while not stop.wait(1.0):
        try:
            reclaim_once(core, root)
            provision_once(core, root, in_node)
        except Exception as err:  # noqa: BLE001 - the API server may be restarting
            log.debug("provisioner: %s", err)
            time.sleep(1)
