"""A private CA and the certificates the gRPC edge needs: ``strata tls init DIR`` (docs/security.md).

For a cluster without a PKI of its own, and for the tests: an ECDSA P-256 CA, one server
certificate for the given host names and addresses, and one client certificate (mutual TLS).
Private keys are written 0600. Bring your own certificates where a PKI exists; these are not
meant to replace it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class DevPki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Strata"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def init_dev_pki(directory: Path, hosts: Sequence[str] = DEFAULT_HOSTS, client_name: str = "strata-client",
                 days: int = 365) -> DevPki:
    """Write ``ca.pem``, ``server.pem``/``server.key`` (for ``hosts``) and ``client.pem``/``client.key``."""
    if not hosts:
        raise ValueError("at least one host name or address is needed for the server certificate")
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder().subject_name(_name("Strata private CA")).issuer_name(_name("Strata private CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common_name: str, usage: x509.ObjectIdentifier, san: x509.SubjectAlternativeName | None
             ) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san is not None:
            builder = builder.add_extension(san, critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)

    server_pem, server_key = leaf(hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, _san(hosts))
    client_pem, client_key = leaf(client_name, ExtendedKeyUsageOID.CLIENT_AUTH, None)
    pki = DevPki(directory / "ca.pem", directory / "server.pem", directory / "server.key",
                 directory / "client.pem", directory / "client.key")
    _write(pki.ca, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(directory / "ca.key", _key_pem(ca_key), private=True)
    _write(pki.server_cert, server_pem)
    _write(pki.server_key, server_key, private=True)
    _write(pki.client_cert, client_pem)
    _write(pki.client_key, client_key, private=True)
    return pki
