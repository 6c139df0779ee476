"""HTTP semantics on HTTP/2 (RFC 9113 §8.2-8.3): what makes a request's header list malformed.

:func:`check_request` reads a decoded header list once: pseudo-headers first, each at most once, ``:method``,
``:scheme`` and a non-empty ``:path`` present, no response or unknown pseudo-header, lower-case names, no
connection-specific header, ``te`` only as ``trailers``, at most one numeric ``content-length``. It returns the
announced content length (-1: none) or raises ``ValueError`` naming the fault, which the connection turns into a
stream error (PROTOCOL_ERROR).
"""

from __future__ import annotations

__all__ = ["check_request"]

_CONNECTION_HEADERS = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                 b"upgrade"))
_PSEUDO_BITS = {b":method": 1, b":scheme": 2, b":path": 4, b":authority": 8}
_PLAIN_NAMES: set[bytes] = set()  # regular request header names found valid (a bounded cache: the same few recur)


def check_request(headers: list[tuple[bytes, bytes]]) -> int:
    """The request's content-length (-1: none); ``ValueError`` naming why the header list is malformed."""
    seen = 0
    regular = False
    length = -1
    for name, value in headers:
        if name in _PLAIN_NAMES:  # the common case: a regular name validated before
            regular = True
            continue
        bit = _PSEUDO_BITS.get(name)
        if bit:
            if regular:
                raise ValueError("pseudo-header after a regular header")
            if seen & bit:
                raise ValueError(f"duplicated {name!r}")
            seen |= bit
            if bit == 4 and not value:
                raise ValueError("empty :path")
            continue
        if name[:1] == b":":
            raise ValueError(f"pseudo-header {name!r} not allowed in a request")
        regular = True
        if name == b"te":
            if value != b"trailers":
                raise ValueError("te other than trailers")
        elif name == b"content-length":
            if not value.isdigit() or length >= 0:
                raise ValueError("bad content-length")
            length = int(value)
        elif name in _CONNECTION_HEADERS:
            raise ValueError(f"connection-specific header {name!r}")
        elif name != name.lower():
            raise ValueError("uppercase header name")
        elif len(_PLAIN_NAMES) < 1024:
            _PLAIN_NAMES.add(name)
    if seen & 7 != 7:
        raise ValueError("missing :method, :scheme or :path")
    return length
