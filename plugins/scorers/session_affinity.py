"""``session-affinity-scorer`` (Alpha): prefers the endpoint that served the session before.

Two algorithms, chosen by ``algorithm``: ``encoded_endpoint_header`` (default, stateless: the request header
``headerName`` carries ``base64("<namespace>/<name>")`` of the endpoint that served the previous request, and a
PreRequest hook writes it on the response for the endpoint profile ``profileName`` chose) and ``session_id_header``
(stateful: the header carries an opaque session id bound in EPP to the endpoint that served it,
:class:`~epp.plugins.session_binding.SessionBindings`; a session moves only after its endpoint has been missing
from the candidates for ``missThreshold`` requests). Parameters of the other algorithm are accepted and ignored.

Formula::

    encoded_endpoint_header: 1.0 for the endpoint the token decodes to, 0.0 for the others
                             (no token, or one that does not decode: 0.0 everywhere)
    session_id_header:       1.0 for the bound endpoint when it is a candidate, else for the least-bound
                             candidate; 0.0 for the others (no session identifier: 0.0 everywhere)

YAML::

    - type: session-affinity-scorer
      parameters:
        algorithm: encoded_endpoint_header   # or session_id_header
        headerName: x-session-token          # read (and, encoded_endpoint_header, written); lower-cased
        profileName: ""                      # profile whose pick is written/bound; empty = primary (decode)
        evictionTtlSeconds: 600              # session_id_header only; > 0
        evictionSweepSeconds: 30             # session_id_header only; > 0
        missThreshold: 3                     # session_id_header only; >= 0, 0 = 3
"""

from __future__ import annotations

import time
from typing import Callable, ClassVar

from pydantic import Field, field_validator

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, PreRequest, SchedulingResult, Scorer
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import SESSION_HEADER, InferenceRequest

from ..session_binding import (
    SessionBindings,
    decode_token,
    header_value,
    normalize_header,
    picked_endpoint,
    session_id,
    session_token,
)

__all__ = ["SessionAffinityScorer", "session_token", "session_id", "ENCODED_ENDPOINT_HEADER", "SESSION_ID_HEADER"]

ENCODED_ENDPOINT_HEADER = "encoded_endpoint_header"
SESSION_ID_HEADER = "session_id_header"
_DEFAULT_MISS_THRESHOLD = 3


class SessionAffinityScorer:
    """Scores the session's endpoint 1.0 and the others 0; see the module docstring for both algorithms."""

    type_name: ClassVar[str] = "session-affinity-scorer"

    class Params(PluginParams):
        algorithm: str = Field(ENCODED_ENDPOINT_HEADER, alias="algorithm")
        header_name: str = Field("", alias="headerName")
        profile_name: str = Field("", alias="profileName")
        eviction_ttl_seconds: float = Field(600, alias="evictionTtlSeconds")
        eviction_sweep_seconds: float = Field(30, alias="evictionSweepSeconds")
        miss_threshold: int = Field(0, alias="missThreshold")

        @field_validator("algorithm")
        @classmethod
        def _algorithm(cls, value: str) -> str:
            if value not in (ENCODED_ENDPOINT_HEADER, SESSION_ID_HEADER):
                raise ValueError(f"algorithm must be {ENCODED_ENDPOINT_HEADER!r} or {SESSION_ID_HEADER!r}, "
                                 f"got {value!r}")
            return value

        @field_validator("eviction_ttl_seconds", "eviction_sweep_seconds")
        @classmethod
        def _positive(cls, value: float) -> float:
            if value <= 0:
                raise ValueError(f"must be > 0, got {value}")
            return value

        @field_validator("miss_threshold")
        @classmethod
        def _misses(cls, value: int) -> int:
            if value < 0:
                raise ValueError(f"must be >= 0, got {value}")
            return value

    def __init__(self, name: str, params: Params, handle: Handle, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.params = params
        self.header = normalize_header(params.header_name)
        self.profile = params.profile_name
        self.stateful = params.algorithm == SESSION_ID_HEADER
        self.miss_threshold = params.miss_threshold or _DEFAULT_MISS_THRESHOLD
        self.bindings = SessionBindings(params.eviction_ttl_seconds, params.eviction_sweep_seconds, clock)
        self._present_key = f"{self.type_name}/{name}/bound-present"

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        target = self._stateful_target(cycle, request, endpoints) if self.stateful else self._token_target(request)
        return [1.0 if session_id(ep) == target else 0.0 for ep in endpoints]

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        picked = picked_endpoint(result, self.profile)
        if picked is None:
            return
        if self.stateful:
            self._commit(request, result.cycle, session_id(picked))
        else:
            result.response_headers[self.header] = session_token(picked)

    # -- encoded_endpoint_header ---------------------------------------------------------------------------------

    def _token_target(self, request: InferenceRequest) -> str | None:
        token = request.session_token if self.header == SESSION_HEADER else None
        return decode_token(token or header_value(request.headers, self.header))

    # -- session_id_header ---------------------------------------------------------------------------------------

    def _stateful_target(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> str | None:
        """The id of the endpoint to prefer; records whether the bound endpoint was a candidate, for PreRequest."""
        sid = header_value(request.headers, self.header)
        if not sid or not endpoints:
            return None
        bound = self.bindings.bound(sid)
        if bound is not None:
            present = any(session_id(ep) == bound for ep in endpoints)
            cycle[self._present_key] = present
            if present:
                return bound
        return session_id(self.bindings.least_bound(endpoints))

    def _commit(self, request: InferenceRequest, cycle: CycleState, picked: str) -> None:
        """Bind a new session; refresh a kept one; move one whose endpoint was absent ``missThreshold`` times."""
        sid = header_value(request.headers, self.header)
        if not sid:
            return
        bound = self.bindings.bound(sid)
        if bound is None or bound == picked:
            self.bindings.bind(sid, picked)
            return
        present = cycle.get(self._present_key)
        if present is None:  # no record from this request's scoring: never a reason to move
            return
        if present:
            self.bindings.refresh(sid)  # the picker chose another endpoint; the binding stands
        elif self.bindings.miss(sid) >= self.miss_threshold:
            self.bindings.bind(sid, picked)


_check: type[Scorer] = SessionAffinityScorer
_check_pre: type[PreRequest] = SessionAffinityScorer
