"""HTTP/1.1 pieces the gateway's front ends and upstream client share: :func:`header_block`, the header
serialization both EPP's server and its upstream client write, and, re-exported from :mod:`epp.http1.request`
(where EPP's server parses requests on llhttp), the ``Transfer-Encoding`` rule and the unsupported-version
message that aiohttp's front end applies too, so both answer alike.
"""

from __future__ import annotations

from collections.abc import Mapping

from epp.http1.request import UNSUPPORTED_VERSION, check_transfer_encoding

__all__ = ["UNSUPPORTED_VERSION", "check_transfer_encoding", "header_block"]


def header_block(headers: Mapping[str, str]) -> str:
    """``name: value\\r\\n`` for each header; a header whose name or value holds CR or LF is dropped, so it never
    smuggles another line into the message (checked once over the block, line by line only when that fails)."""
    text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if text.count("\n") != len(headers) or text.count("\r") != len(headers):
        text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()
                        if "\n" not in name + value and "\r" not in name + value])
    return text
