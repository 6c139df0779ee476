"""TLS material for the ext_proc port: a given certificate and key, or a self-signed pair made at start-up.

The reference EPP serves TLS with a self-signed certificate unless one is given; Envoy's ext_proc cluster then
uses TLS without verifying it (``epp envoy-config`` writes that). The generated key is an ECDSA P-256 key
(milliseconds to make, unlike RSA-4096), valid for ten years, for ``localhost``, the host name and the given
addresses.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import socket
import ssl
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

log = logging.getLogger(__name__)

__all__ = ["TlsFiles", "KeyPair", "self_signed", "load_key_pair", "load_pair_into", "check_key_pair", "CertWatcher"]


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


def load_pair_into(ctx: ssl.SSLContext, key_pair: KeyPair) -> None:
    """Load ``key_pair`` into ``ctx`` (later handshakes use it); ``ssl.SSLError`` if the key does not match."""
    with tempfile.TemporaryDirectory() as tmp:  # the ssl module loads keys from files only
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        with open(cert, "wb") as f:
            f.write(key_pair.cert_pem)
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(key_pair.key_pem)
        ctx.load_cert_chain(cert, key)


def check_key_pair(key_pair: KeyPair) -> None:
    """``ssl.SSLError`` unless ``key_pair`` is a PEM certificate (chain) and its matching private key."""
    load_pair_into(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), key_pair)


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


class CertWatcher:
    """Polls a certificate and key for changes (``--enable-cert-reload``) and hands each new pair to ``apply``.

    A change is a new modification time or size of either file (Kubernetes updates a mounted Secret by swapping a
    symlink, which this sees). A pair that cannot be read or that ``apply`` refuses (a key that does not match,
    files caught half-written) is logged and retried at the next poll; the old pair stays in use meanwhile.
    """

    def __init__(self, files: TlsFiles, apply: Callable[[KeyPair], None], interval: float = 1.0) -> None:
        self.files, self.apply, self.interval = files, apply, interval
        self.reloads = 0
        self._seen = self._stamp()
        self._failed: tuple[tuple[int, int], ...] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tls-cert-watcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _stamp(self) -> tuple[tuple[int, int], ...] | None:
        try:
            return tuple((st.st_mtime_ns, st.st_size) for st in (os.stat(self.files.cert), os.stat(self.files.key)))
        except OSError:
            return None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            stamp = self._stamp()
            if stamp is None or stamp == self._seen:
                continue
            if stamp == self._failed:
                continue
            try:
                self.apply(load_key_pair(self.files))
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                log.warning("TLS certificate %s changed but cannot be used yet: %s", self.files.cert, exc)
                self._failed = stamp
                continue
            self._seen = stamp
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.files.cert)
