"""Freshly issued certificates for TLS and mutual-TLS tests: a CA, a server certificate for localhost and
127.0.0.1, and a client certificate, all signed by the CA."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pem:
    certificate: bytes
    key: bytes


def _issue(subject: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None, is_ca: bool,
           hosts: tuple[str, ...] = ()) -> tuple[Pem, x509.Name, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True))
    if hosts:
        names = [x509.DNSName(host) if not host[0].isdigit() else x509.IPAddress(ipaddress.ip_address(host))
                 for host in hosts]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    certificate = builder.sign(issuer_key, hashes.SHA256())
    pem = Pem(certificate.public_bytes(serialization.Encoding.PEM),
              key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()))
    return pem, name, key


@dataclass(frozen=True)
class Certificates:
    ca: Pem
    server: Pem
    client: Pem


def issue_certificates() -> Certificates:
    ca, ca_name, ca_key = _issue("test CA", None, is_ca=True)
    server, _, _ = _issue("localhost", (ca_name, ca_key), is_ca=False, hosts=("localhost", "127.0.0.1"))
    client, _, _ = _issue("test client", (ca_name, ca_key), is_ca=False)
    return Certificates(ca, server, client)


def write_certificates(directory: Path, certificates: Certificates) -> dict[str, Path]:
    """The server's certificate and key, and the CA as the server's client CA: ServerConfig's tls_* fields."""
    paths = {"tls_cert": directory / "server.pem", "tls_key": directory / "server.key",
             "tls_client_ca": directory / "ca.pem"}
    paths["tls_cert"].write_bytes(certificates.server.certificate)
    paths["tls_key"].write_bytes(certificates.server.key)
    paths["tls_client_ca"].write_bytes(certificates.ca.certificate)
    return paths
