"""``session-affinity-scorer`` (llm-d): keeps a session on the endpoint that served its previous request.

The client echoes back the ``x-session-token`` response header it was given. The token is llm-d's:
``base64("<namespace>/<name>")``, the endpoint's Kubernetes ``NamespacedName`` (``session_affinity.go``), where
``<name>`` is the endpoint name, ``<pod>-rank-<i>`` (``i`` = index of the port in the pool's ``targetPorts``,
so ``-rank-0`` even for a single port). A token minted by llm-d's EPP for the same pool therefore routes here
too, and the other way round. Endpoints that are not Pods (an endpoints file) have no namespace, and their token
is ``base64("/<name>")``, as Go's ``NamespacedName.String()`` writes an empty namespace.

Formula::

    score = 1.0 for the endpoint whose "<namespace>/<name>" the request's x-session-token decodes to,
            0.0 for every other (no token, or one that does not decode: 0.0 everywhere)

As a PreRequest hook it sets ``x-session-token`` on the client response to the chosen target. (llm-d sets it at
end of stream; the token only depends on the target, so setting it with the response headers is equivalent.)

YAML::

    - type: session-affinity-scorer
"""

from __future__ import annotations

import base64
import binascii
from typing import ClassVar

from epp.endpoint import Endpoint
from epp.framework import CycleState, Handle, NoParams, PreRequest, SchedulingResult, Scorer
from epp.request import SESSION_HEADER, InferenceRequest

__all__ = ["SessionAffinityScorer", "session_token", "session_id"]


def session_id(endpoint: Endpoint) -> str:
    """``<namespace>/<name>``: what the token carries (Go ``types.NamespacedName.String()``)."""
    return f"{endpoint.spec.namespace}/{endpoint.name}"


def session_token(endpoint: Endpoint) -> str:
    """The token that routes a session back to ``endpoint``: standard base64 of :func:`session_id`."""
    return base64.b64encode(session_id(endpoint).encode()).decode()


def _decode(token: str) -> str | None:
    try:
        return base64.b64decode(token, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


class SessionAffinityScorer:
    """1.0 for the endpoint the session token names, 0 for the others; sets the token on responses."""

    type_name: ClassVar[str] = "session-affinity-scorer"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        token = request.session_token or request.headers.get(SESSION_HEADER)
        wanted = _decode(token) if token else None
        if wanted is None:
            return [0.0] * len(endpoints)
        return [1.0 if session_id(ep) == wanted else 0.0 for ep in endpoints]

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        endpoints = result.endpoints
        if endpoints:
            result.response_headers[SESSION_HEADER] = session_token(endpoints[0])


_check: type[Scorer] = SessionAffinityScorer
_check_pre: type[PreRequest] = SessionAffinityScorer
