"""``session-affinity-filter`` (Alpha): pins a session to the endpoint that served it, as a hard constraint.

When the session's endpoint is a candidate the filter keeps it alone; when there is no session, or its endpoint is
no longer a candidate, it keeps every candidate so later filters and scorers decide. It never returns an empty
list. ``strategy: encoded_endpoint_header`` (default, stateless) reads the endpoint token of
``session-affinity-scorer`` (:func:`~epp.plugins.session_binding.session_token`) and writes it on the response
after the pick; ``strategy: session_id`` (stateful) reads a session id from ``sessionIdConfig.sources`` (a request
header, or the ``SessionID`` a ``session-id-producer`` published) and binds it to the endpoint profile
``profileName`` chose (:class:`~epp.plugins.session_binding.SessionBindings`).

YAML::

    - type: session-affinity-filter
      parameters:
        strategy: encoded_endpoint_header      # or session_id
        profileName: ""                        # profile whose pick is written/bound; empty = primary (decode)
        encodedEndpointHeaderConfig:
          header: x-session-token
        sessionIdConfig:
          sources:                             # default: [{header: x-session-id}]
            - header: x-session-id
            - attribute: session-id-producer
          evictionTtlSeconds: 300              # > 0
          evictionSweepSeconds: 10             # > 0
"""

from __future__ import annotations

import time
from typing import Any, Callable, ClassVar

from pydantic import Field, field_validator, model_validator

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle, PreRequest, SchedulingResult
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import SESSION_HEADER, InferenceRequest

from ..producers.session_id import (
    DEFAULT_SESSION_HEADER,
    SESSION_PRODUCER_TYPE,
    SessionIdProducer,
    find_session_producer,
)
from ..session_binding import (
    SessionBindings,
    decode_token,
    header_value,
    normalize_header,
    picked_endpoint,
    session_id,
    session_token,
)

__all__ = ["SessionAffinityFilter", "ENCODED_ENDPOINT_HEADER", "SESSION_ID"]

ENCODED_ENDPOINT_HEADER = "encoded_endpoint_header"
SESSION_ID = "session_id"


class _Source(PluginParams):
    header: str = ""
    attribute: str = ""

    @model_validator(mode="after")
    def _exactly_one(self) -> _Source:
        if bool(self.header) == bool(self.attribute):
            raise ValueError("exactly one of header or attribute must be set")
        return self


class _EncodedConfig(PluginParams):
    header: str = ""


class _SessionIdConfig(PluginParams):
    sources: list[_Source] = Field(default_factory=list)
    eviction_ttl_seconds: float = Field(0, alias="evictionTtlSeconds")
    eviction_sweep_seconds: float = Field(0, alias="evictionSweepSeconds")

    @field_validator("eviction_ttl_seconds", "eviction_sweep_seconds")
    @classmethod
    def _not_negative(cls, value: float) -> float:
        if value < 0:  # 0 (unset) takes the default, as the reference's ApplyDefaults does
            raise ValueError(f"must be > 0, got {value}")
        return value


class SessionAffinityFilter:
    """Keeps only the session's endpoint when it is a candidate, else every candidate."""

    type_name: ClassVar[str] = "session-affinity-filter"

    class Params(PluginParams):
        strategy: str = Field(ENCODED_ENDPOINT_HEADER, alias="strategy")
        profile_name: str = Field("", alias="profileName")
        encoded_endpoint_header_config: _EncodedConfig = Field(_EncodedConfig.model_validate({}),
                                                               alias="encodedEndpointHeaderConfig")
        session_id_config: _SessionIdConfig = Field(_SessionIdConfig.model_validate({}), alias="sessionIdConfig")

        @field_validator("strategy")
        @classmethod
        def _strategy(cls, value: str) -> str:
            if value not in (ENCODED_ENDPOINT_HEADER, SESSION_ID):
                raise ValueError(f"strategy must be {ENCODED_ENDPOINT_HEADER!r} or {SESSION_ID!r}, got {value!r}")
            return value

    def __init__(self, name: str, params: Params, handle: Handle, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.params = params
        self.profile = params.profile_name
        self.stateful = params.strategy == SESSION_ID
        self.header = normalize_header(params.encoded_endpoint_header_config.header)
        cfg = params.session_id_config
        self.sources: list[tuple[str, str]] = [
            ("header", normalize_header(s.header)) if s.header else ("attribute", s.attribute)
            for s in (cfg.sources or [_Source(header=DEFAULT_SESSION_HEADER)])]
        self.bindings = SessionBindings(cfg.eviction_ttl_seconds or 300, cfg.eviction_sweep_seconds or 10, clock)
        self._producers: dict[str, SessionIdProducer] = {}
        attributes = [ref for kind, ref in self.sources if kind == "attribute"]
        # Only the attribute EPP can serve needs a producer; the loader creates the default one if none is declared.
        self.consumes: tuple[str, ...] = (SESSION_PRODUCER_TYPE,) \
            if self.stateful and SESSION_PRODUCER_TYPE in attributes else ()

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """An automatically created ``session-id-producer`` reads the reference's default header."""
        return {"headerName": DEFAULT_SESSION_HEADER}

    def bind(self, handle: Handle) -> None:
        """Resolve each ``attribute`` source to the ``session-id-producer`` it names (ConfigError otherwise)."""
        if not self.stateful:
            return
        for kind, ref in self.sources:
            if kind == "attribute":
                self._producers[ref] = find_session_producer(self, handle, ref, "sessionIdConfig.sources")

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        wanted = self._bound(cycle, request) if self.stateful else self._token_target(request)
        if wanted is None:
            return endpoints
        kept = [ep for ep in endpoints if session_id(ep) == wanted]
        return kept[:1] or endpoints

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        picked = picked_endpoint(result, self.profile)
        if picked is None:
            return
        if not self.stateful:
            result.response_headers[self.header] = session_token(picked)
            return
        sid = self._session(result.cycle, request)
        if sid:
            self.bindings.bind(sid, session_id(picked))

    def _token_target(self, request: InferenceRequest) -> str | None:
        token = request.session_token if self.header == SESSION_HEADER else None
        return decode_token(token or header_value(request.headers, self.header))

    def _session(self, cycle: CycleState, request: InferenceRequest) -> str:
        """The session identifier from the first source that gives a non-empty one, or ""."""
        for kind, ref in self.sources:
            if kind == "header":
                value = header_value(request.headers, ref)
            else:
                value = (self._producers[ref].session_id(cycle) or "").strip() if ref in self._producers else ""
            if value:
                return value
        return ""

    def _bound(self, cycle: CycleState, request: InferenceRequest) -> str | None:
        sid = self._session(cycle, request)
        return self.bindings.bound(sid) if sid else None


_check: type[Filter] = SessionAffinityFilter
_check_pre: type[PreRequest] = SessionAffinityFilter
