"""A throwaway PKI for the bed: one CA, the API server's serving cert, client certs
(admin, controller-manager, scheduler, node agent) and the service-account key."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def ensure(folder: Path, server_ips: list[str], server_names: list[str]) -> dict[str, Path]:
    """Create the PKI in ``folder`` once; later calls reuse it."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {name: folder / name for name in (
        "ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub",
        "admin.crt", "admin.key", "controller-manager.crt", "controller-manager.key",
        "scheduler.crt", "scheduler.key", "agent.crt", "agent.key")}
    if all(p.exists() for p in files.values()):
        return files
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=365))
    ca_key = _key()
    ca = (x509.CertificateBuilder().subject_name(_name("llmtrain-localcluster-ca")).issuer_name(_name("llmtrain-localcluster-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(valid[0]).not_valid_after(valid[1])
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    _write_key(files["ca.key"], ca_key)
    _write_cert(files["ca.crt"], ca)

    def issue(stem: str, cn: str, org: str | None, server: bool) -> None:
        key = _key()
        builder = (x509.CertificateBuilder().subject_name(_name(cn, org)).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(valid[0]).not_valid_after(valid[1])
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                                  critical=False))
        if server:
            sans = [x509.DNSName(n) for n in server_names] + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        _write_key(files[f"{stem}.key"], key)
        _write_cert(files[f"{stem}.crt"], builder.sign(ca_key, hashes.SHA256()))

    issue("apiserver", "kube-apiserver", None, server=True)
    issue("admin", "localcluster-admin", "system:masters", server=False)
    issue("controller-manager", "system:kube-controller-manager", None, server=False)
    issue("scheduler", "system:kube-scheduler", None, server=False)
    # The agent acts for every node it simulates, so it is an admin rather than one
    # system:node identity (the Node authorizer is therefore not enabled).
    issue("agent", "localcluster-node-agent", "system:masters", server=False)
    sa = _key()
    _write_key(files["sa.key"], sa)
    files["sa.pub"].write_bytes(sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return files
