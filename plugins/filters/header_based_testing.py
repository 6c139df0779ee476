"""``header-based-testing-filter`` (the reference's conformance-test filter): keeps the endpoints a request names in
its ``test-epp-endpoint-selection`` header.

The header is a comma-separated list of ``IP`` or ``IP:port`` items (IPv6 in brackets, ``[::1]:8000``). An
``IP:port`` item keeps the endpoint with exactly that address and port; a bare ``IP`` keeps the pool's endpoint
with that address (with several ranks on one IP, the last one the pool lists, as the reference's map lookup
gives). The result follows the header's order, one endpoint per IP, and items that match no endpoint are
skipped. A request without the header, or with a blank one, keeps **no** endpoint (so it fails with 503, as in the
reference). The Gateway API Inference Extension conformance suite steers its requests with it; any client could,
so it belongs in test configs only. No parameters.

YAML::

    - type: header-based-testing-filter
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle, NoParams
from epp.framework.request import InferenceRequest

__all__ = ["HeaderBasedTestingFilter", "SELECTION_HEADER"]

SELECTION_HEADER = "test-epp-endpoint-selection"


def _split_item(item: str) -> tuple[str, str]:
    """``"10.0.0.1:8000"`` -> ("10.0.0.1", "8000"); ``"[::1]:80"`` -> ("::1", "80"); a bare IP -> (ip, "")."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else ""
    if item.count(":") == 1:
        host, _, port = item.partition(":")
        return host, port
    return item, ""  # a bare IPv4 address, or an unbracketed IPv6 one


class HeaderBasedTestingFilter:
    """Keeps, in header order, the endpoints named by ``test-epp-endpoint-selection``; none without it."""

    type_name: ClassVar[str] = "header-based-testing-filter"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        value = request.headers.get(SELECTION_HEADER, "")
        if not value.strip():
            return []
        by_ip: dict[str, Endpoint] = {}
        by_hostport: dict[str, Endpoint] = {}
        for ep in endpoints:
            ip = ep.address.strip().strip("[]")
            if ip:
                by_ip[ip] = ep
                by_hostport[f"{ip}:{ep.port}"] = ep
        kept: list[Endpoint] = []
        seen: set[str] = set()
        for raw in value.split(","):
            item = raw.strip()
            if not item:
                continue
            host, port = _split_item(item)
            found = by_hostport.get(f"{host}:{port}") if port else by_ip.get(host)
            if found is not None and found.address not in seen:
                seen.add(found.address)
                kept.append(found)
        return kept


_check: type[Filter] = HeaderBasedTestingFilter
