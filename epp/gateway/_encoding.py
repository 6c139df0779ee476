"""Request bodies with a ``Content-Encoding``: decoded once, by the proxy, for both front ends.

EPP must read the JSON to route a request, and the model server behind it (vLLM's FastAPI server) does not decode
compressed request bodies, so the gateway decodes ``gzip`` (``x-gzip``) and ``deflate`` and forwards the decoded
body without the header. The body limit applies to the decoded size (a small compressed body cannot expand past
it). Any other coding is a 400 naming it. aiohttp's server is run with ``auto_decompress=False`` so that both front
ends hand the proxy the bytes as received.
"""

from __future__ import annotations

import zlib

from epp.errors import BadRequest, PayloadTooLarge

__all__ = ["decode_content"]

_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}  # deflate: the zlib format of RFC 9110 §8.4.1.2


def decode_content(body: bytes, coding: str | None, limit: int) -> bytes:
    """``body`` decoded from ``coding`` (the ``Content-Encoding`` value; None or ``identity`` = as is).

    Raises ``PayloadTooLarge`` when the decoded body exceeds ``limit`` bytes and ``BadRequest`` for an
    unsupported coding, a list of codings, or bytes that are not valid in the coding.
    """
    if not coding:
        return body
    name = coding.strip().lower()
    if name == "identity":
        return body
    wbits = _WBITS.get(name)
    if wbits is None:
        raise BadRequest(f"unsupported Content-Encoding {coding[:40]!r}: EPP reads gzip and deflate request bodies")
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BadRequest(f"request body is not valid {name}: {exc}") from exc
    if len(out) > limit:
        raise PayloadTooLarge(f"decoded request body exceeds the limit of {limit} bytes")
    if not decoder.eof:
        raise BadRequest(f"request body is not valid {name}: truncated")
    return out
