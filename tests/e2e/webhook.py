"""A tiny validating admission webhook for the e2e tests: an HTTPS server on loopback
(its own self-signed certificate) that refuses every pod the API server asks it about,
and the ValidatingWebhookConfiguration that sends it one job's pods."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import ssl
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REFUSAL = "pods of this job are refused by the e2e admission webhook"


def _certificate(folder: Path, address: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "e2e-webhook")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
            .sign(key, hashes.SHA256()))
    crt, pem = folder / "tls.crt", folder / "tls.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return crt, pem


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        self.server.seen.append(request["name"] if request.get("name") else request["object"]["metadata"].get("name"))  # type: ignore[attr-defined]
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
            "uid": request["uid"], "allowed": False, "status": {"code": 403, "message": REFUSAL}}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


class RefusingWebhook:
    """``with RefusingWebhook(bed.host_address) as hook: hook.configuration(job_name)``.
    ``address``: where the API server reaches this host (on kind it runs in the
    control-plane node's container, where 127.0.0.1 is that container)."""

    def __init__(self, address: str):
        self.address = address

    def __enter__(self) -> RefusingWebhook:
        self._folder = tempfile.TemporaryDirectory(prefix="e2e-webhook-")
        crt, key = _certificate(Path(self._folder.name), self.address)
        self.ca_bundle = base64.b64encode(crt.read_bytes()).decode()
        self.server = ThreadingHTTPServer((self.address, 0), _Handler)
        self.server.seen = []  # type: ignore[attr-defined]
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(crt, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def seen(self) -> list[str]:
        """Names of the pods the API server asked about."""
        return list(self.server.seen)  # type: ignore[attr-defined]

    def configuration(self, name: str, job: str) -> dict[str, Any]:
        """Send the creates of ``job``'s pods here, and nothing else."""
        port = self.server.server_address[1]
        return {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "refuse.e2e.llmtrain.io",
                "clientConfig": {"url": f"https://{self.address}:{port}/validate", "caBundle": self.ca_bundle},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "objectSelector": {"matchLabels": {"llmtrain.io/job": job}},
                "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
            }],
        }

    def __exit__(self, *_: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._folder.cleanup()
