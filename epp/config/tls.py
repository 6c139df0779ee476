"""``--tls-min-version`` and ``--tls-cipher-suites``: the reference's Go ``crypto/tls`` names on Python's ``ssl``.

The reference (llm-d-router ``pkg/epp/server/options.go``) takes ``VersionTLS10`` .. ``VersionTLS13`` and the cipher
suite names Go's ``tls.CipherSuites()`` and ``tls.InsecureCipherSuites()`` list (the IANA names, e.g.
``TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256``), comma-separated, blanks skipped; anything else is an error naming the
value. As in Go, the suites only restrict TLS 1.2 and below: TLS 1.3's suites are accepted and change nothing.

Python's ``ssl`` (OpenSSL) knows the same suites under OpenSSL names; they are matched by their IANA code. A suite
Go knows that this OpenSSL build cannot offer (RC4, 3DES, ...) is an error too, rather than silently dropped, and so
is a list of which none is usable here.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping

__all__ = ["TlsPolicy", "parse_tls_version", "parse_cipher_suites", "TLS_VERSIONS", "GO_CIPHER_SUITES"]

TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = MappingProxyType({
    "VersionTLS10": ssl.TLSVersion.TLSv1,
    "VersionTLS11": ssl.TLSVersion.TLSv1_1,
    "VersionTLS12": ssl.TLSVersion.TLSv1_2,
    "VersionTLS13": ssl.TLSVersion.TLSv1_3,
})
"""Go's ``tls.VersionTLS1x`` names, as the reference's flag spells them."""

GO_CIPHER_SUITES: Mapping[str, int] = MappingProxyType({
    # tls.CipherSuites(): TLS 1.3 (not configurable), then TLS 1.0-1.2.
    "TLS_AES_128_GCM_SHA256": 0x1301, "TLS_AES_256_GCM_SHA384": 0x1302, "TLS_CHACHA20_POLY1305_SHA256": 0x1303,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": 0xC009, "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": 0xC00A,
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": 0xC013, "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": 0xC014,
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": 0xC02B, "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": 0xC02C,
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": 0xC02F, "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": 0xC030,
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": 0xCCA8, "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": 0xCCA9,
    # tls.InsecureCipherSuites().
    "TLS_RSA_WITH_RC4_128_SHA": 0x0005, "TLS_RSA_WITH_3DES_EDE_CBC_SHA": 0x000A,
    "TLS_RSA_WITH_AES_128_CBC_SHA": 0x002F, "TLS_RSA_WITH_AES_256_CBC_SHA": 0x0035,
    "TLS_RSA_WITH_AES_128_CBC_SHA256": 0x003C, "TLS_RSA_WITH_AES_128_GCM_SHA256": 0x009C,
    "TLS_RSA_WITH_AES_256_GCM_SHA384": 0x009D, "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": 0xC007,
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": 0xC011, "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": 0xC012,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": 0xC023, "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": 0xC027,
})
"""Every cipher suite name Go's ``crypto/tls`` lists, with its IANA code."""

_TLS13 = frozenset({0x1301, 0x1302, 0x1303})


@dataclass(frozen=True, slots=True)
class TlsPolicy:
    """What the flags ask of a TLS server: a minimum version (None: the ssl default, TLS 1.2 on this OpenSSL) and
    the OpenSSL cipher string for TLS 1.2 and below (None: the ssl default)."""

    min_version: ssl.TLSVersion | None = None
    ciphers: str | None = None

    def apply(self, ctx: ssl.SSLContext) -> None:
        """Set ``ctx``'s minimum version and TLS <= 1.2 ciphers (``ssl.SSLError`` if OpenSSL refuses them)."""
        if self.min_version is not None:
            ctx.minimum_version = self.min_version
        if self.ciphers is not None:
            ctx.set_ciphers(self.ciphers)

    @property
    def is_default(self) -> bool:
        return self.min_version is None and self.ciphers is None


def parse_tls_version(text: str) -> ssl.TLSVersion:
    """The version a ``--tls-min-version`` value names (``ValueError`` with the reference's wording)."""
    try:
        return TLS_VERSIONS[text]
    except KeyError:
        raise ValueError(f"invalid tls-min-version {text!r}: unknown TLS version {text!r}; supported values: "
                         f"{', '.join(TLS_VERSIONS)}") from None


def parse_cipher_suites(names: Iterable[str]) -> str | None:
    """The OpenSSL cipher string for Go suite ``names`` (blank entries skipped); None when only TLS 1.3 suites
    (or none) are named, since those are not configurable. ``ValueError`` naming an unknown or unavailable suite."""
    openssl = _openssl_names()
    chosen: list[str] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        code = GO_CIPHER_SUITES.get(name)
        if code is None:
            raise ValueError(f"invalid tls-cipher-suites: unknown cipher suite {name!r}")
        if code in _TLS13:
            continue
        if code not in openssl:
            raise ValueError(f"invalid tls-cipher-suites: {name} is not available in this build's OpenSSL "
                             f"({ssl.OPENSSL_VERSION})")
        chosen.append(openssl[code])
    return ":".join(chosen) if chosen else None


def _openssl_names() -> dict[int, str]:
    """IANA code -> OpenSSL name of every TLS <= 1.2 suite this OpenSSL can offer at any security level."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.set_ciphers("ALL:@SECLEVEL=0")
    return {c["id"] & 0xFFFF: c["name"] for c in ctx.get_ciphers() if c["protocol"] != "TLSv1.3"}
