"""Pod volumes as host directories, and container environments.

| volume                 | backed by                                                    |
|------------------------|--------------------------------------------------------------|
| emptyDir               | ``<state>/pods/<uid>/volumes/<name>`` (removed with the pod) |
| hostPath               | ``<state>/nodes/<node>/hostpath/<path>``: per simulated node |
| configMap / secret     | files written from the API object, refreshed while it runs   |
| projected              | service-account token (TokenRequest), configMaps, downward API |
| downwardAPI            | files from field references                                  |
| persistentVolumeClaim  | the bound PV's hostPath (see provisioner.py), shared by nodes |
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException


class ConfigError(Exception):
    """A referenced ConfigMap/Secret/PVC/key is missing (CreateContainerConfigError)."""


def field_ref(pod: dict[str, Any], path: str) -> str:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"), "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"), "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"), "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ConfigError(f"unsupported fieldRef {path}")


def _read_key(core: client.CoreV1Api, kind: str, ns: str, name: str, key: str | None, optional: bool) -> dict[str, str] | str | None:
    try:
        if kind == "secret":
            obj = core.read_namespaced_secret(name, ns)
            data = {k: base64.b64decode(v).decode() for k, v in (obj.data or {}).items()}
        else:
            obj = core.read_namespaced_config_map(name, ns)
            data = dict(obj.data or {})
    except ApiException as err:
        if err.status == 404 and optional:
            return None
        raise ConfigError(f"{kind} {ns}/{name} not found") from None
    if key is None:
        return data
    if key not in data:
        if optional:
            return None
        raise ConfigError(f"key {key} not found in {kind} {ns}/{name}")
    return data[key]


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion; $$(VAR) escapes, unknown names stay as written."""
    def repl(match: re.Match[str]) -> str:
        if match.group(0).startswith("$$"):
            return match.group(0)[1:]
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$?\(([A-Za-z_][A-Za-z0-9_]*)\)", repl, value)


def container_env(core: client.CoreV1Api, pod: dict[str, Any], container: dict[str, Any], base: dict[str, str]) -> dict[str, str]:
    ns = pod["metadata"]["namespace"]
    env = dict(base)
    for source in container.get("envFrom") or []:
        for kind, ref in (("configmap", source.get("configMapRef")), ("secret", source.get("secretRef"))):
            if ref:
                data = _read_key(core, kind, ns, ref["name"], None, ref.get("optional", False)) or {}
                env.update({(source.get("prefix") or "") + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = _expand(var.get("value") or "", env)
            continue
        src = var.get("valueFrom") or {}
        if "fieldRef" in src:
            env[var["name"]] = field_ref(pod, src["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in src or "configMapKeyRef" in src:
            kind = "secret" if "secretKeyRef" in src else "configmap"
            ref = src.get("secretKeyRef") or src.get("configMapKeyRef")
            value = _read_key(core, kind, ns, ref["name"], ref["key"], ref.get("optional", False))
            if value is not None:
                env[var["name"]] = value
        elif "resourceFieldRef" in src:
            resource = src["resourceFieldRef"]["resource"]
            kind, _, name = resource.partition(".")
            env[var["name"]] = str(((container.get("resources") or {}).get(kind) or {}).get(name, "0"))
        else:
            env[var["name"]] = ""
    return env


def expand_command(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    return [_expand(a, env) for a in argv]


def _write_files(folder: Path, data: dict[str, str], items: list[dict[str, Any]] | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if items:
        for item in items:
            if item["key"] in data:
                target = folder / item.get("path", item["key"])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(data[item["key"]])
    else:
        for key, value in data.items():
            (folder / key).write_text(value)


def prepare_volume(core: client.CoreV1Api, pod: dict[str, Any], volume: dict[str, Any], pod_dir: Path,
                   node_dir: Path, pv_root: Path) -> Path:
    """Materialise one volume; returns the host directory that backs it."""
    ns = pod["metadata"]["namespace"]
    name = volume["name"]
    folder = pod_dir / "volumes" / name
    if "emptyDir" in volume:
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    if "hostPath" in volume:
        path = node_dir / "hostpath" / volume["hostPath"]["path"].lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        return path
    if "configMap" in volume or "secret" in volume:
        kind = "configmap" if "configMap" in volume else "secret"
        ref = volume.get("configMap") or volume.get("secret")
        data = _read_key(core, kind, ns, ref.get("name") or ref.get("secretName"), None, ref.get("optional", False)) or {}
        _write_files(folder, data, ref.get("items"))
        return folder
    if "downwardAPI" in volume:
        data = {i["path"]: field_ref(pod, i["fieldRef"]["fieldPath"]) for i in volume["downwardAPI"].get("items", []) if "fieldRef" in i}
        _write_files(folder, data, None)
        return folder
    if "projected" in volume:
        folder.mkdir(parents=True, exist_ok=True)
        for source in volume["projected"].get("sources", []):
            if "serviceAccountToken" in source:
                token = _token(core, pod, source["serviceAccountToken"])
                (folder / source["serviceAccountToken"].get("path", "token")).write_text(token)
            elif "configMap" in source or "secret" in source:
                kind = "configmap" if "configMap" in source else "secret"
                ref = source.get("configMap") or source.get("secret")
                data = _read_key(core, kind, ns, ref["name"], None, ref.get("optional", False)) or {}
                _write_files(folder, data, ref.get("items"))
            elif "downwardAPI" in source:
                data = {i["path"]: field_ref(pod, i["fieldRef"]["fieldPath"])
                        for i in source["downwardAPI"].get("items", []) if "fieldRef" in i}
                _write_files(folder, data, None)
        return folder
    if "persistentVolumeClaim" in volume:
        claim = volume["persistentVolumeClaim"]["claimName"]
        try:
            pvc = core.read_namespaced_persistent_volume_claim(claim, ns)
        except ApiException:
            raise ConfigError(f"persistentvolumeclaim {ns}/{claim} not found") from None
        if not pvc.spec.volume_name:
            raise ConfigError(f"persistentvolumeclaim {ns}/{claim} is not bound")
        pv = core.read_persistent_volume(pvc.spec.volume_name)
        path = Path(pv.spec.host_path.path) if pv.spec.host_path else pv_root / pvc.spec.volume_name
        path.mkdir(parents=True, exist_ok=True)
        return path
    raise ConfigError(f"volume {name}: unsupported type {sorted(set(volume) - {'name'})}")


def refresh_config_volumes(core: client.CoreV1Api, pod: dict[str, Any], mounted: dict[str, Path]) -> None:
    """Rewrite the files of mounted ConfigMap and Secret volumes whose objects changed,
    each replaced atomically, as the kubelet does for volumes not mounted by subPath."""
    ns = pod["metadata"]["namespace"]
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if ("configMap" not in volume and "secret" not in volume) or volume["name"] not in mounted:
            continue
        kind = "configmap" if "configMap" in volume else "secret"
        ref = volume.get("configMap") or volume.get("secret")
        try:
            data = _read_key(core, kind, ns, ref.get("name") or ref.get("secretName"), None, True) or {}
        except (ConfigError, ApiException):
            continue  # gone or unreadable for now: keep what the pod has, as the kubelet does
        folder = mounted[volume["name"]]
        wanted = {item.get("path", item["key"]): data[item["key"]] for item in ref.get("items") or [] if item["key"] in data} \
            if ref.get("items") else data
        for name, value in wanted.items():
            target = folder / name
            try:
                if target.exists() and target.read_text() == value:
                    continue
                tmp = target.with_name(f".{target.name}.tmp")
                tmp.write_text(value)
                tmp.replace(target)
            except OSError:
                continue


def _token(core: client.CoreV1Api, pod: dict[str, Any], source: dict[str, Any]) -> str:
    sa = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": [source["audience"]] if source.get("audience") else None,
                     "expirationSeconds": max(3600, int(source.get("expirationSeconds") or 3607)),
                     "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}}}
    result = core.create_namespaced_service_account_token(sa, pod["metadata"]["namespace"], body)
    return result.status.token


def mounts_for(container: dict[str, Any], volumes: dict[str, Path]) -> list[dict[str, Any]]:
    out = []
    for mount in container.get("volumeMounts") or []:
        source = volumes[mount["name"]]
        if mount.get("subPath"):
            source = source / mount["subPath"]
            source.mkdir(parents=True, exist_ok=True)
        out.append({"source": str(source), "target": mount["mountPath"], "readOnly": bool(mount.get("readOnly"))})
    return out
