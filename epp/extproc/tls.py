"""TLS material for the ext_proc port: a given certificate and key, or a self-signed pair made at start-up.

The reference EPP serves TLS with a self-signed certificate unless one is given; Envoy's ext_proc cluster then
uses TLS without verifying it (``epp envoy-config`` writes that). The generated key is an ECDSA P-256 key
(milliseconds to make, unlike RSA-4096), valid for ten years, for ``localhost``, the host name and the given
addresses.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["TlsFiles", "KeyPair", "self_signed", "load_key_pair"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Paths of a PEM certificate (chain) and its PEM private key."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class KeyPair:
    """PEM bytes of a private key and its certificate."""

    key_pem: bytes
    cert_pem: bytes


def load_key_pair(files: TlsFiles) -> KeyPair:
    """Read a certificate and key from disk (``OSError`` if unreadable)."""
    return KeyPair(key_pem=Path(files.key).read_bytes(), cert_pem=Path(files.cert).read_bytes())


def self_signed(hosts: Iterable[str] = ()) -> KeyPair:
    """A fresh self-signed certificate for ``localhost``, this host's name, 127.0.0.1, ::1 and ``hosts``."""
    key = ec.generate_private_key(ec.SECP256R1())
    names = {"localhost", socket.gethostname(), "127.0.0.1", "::1", *hosts}
    alt: list[x509.GeneralName] = []
    for name in sorted(n for n in names if n and n not in ("0.0.0.0", "::")):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "epp"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "EPP self-signed")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return KeyPair(key_pem=key_pem, cert_pem=cert.public_bytes(serialization.Encoding.PEM))
