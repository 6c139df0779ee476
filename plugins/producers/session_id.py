"""``session-id-producer`` (Beta): reads a session identifier off each request and remembers which endpoint each
session was last routed to.

Before the scheduling cycle (:meth:`SessionIdProducer.produce`) it publishes in the cycle state ``SessionID`` (from
the configured ``headerName`` or ``cookieName``) and ``BoundEndpoint`` (the ``host:port`` the session is bound to).
After the pick (:meth:`SessionIdProducer.pre_request`) it binds the session to the primary profile's endpoint, in an
LRU of ``lruSize`` entries that expire ``ttl`` after they were last written. Without a session identifier both
steps do nothing. Consumers find an instance with :func:`find_session_producer` and read
:meth:`SessionIdProducer.session_id` / :meth:`SessionIdProducer.bound_endpoint`; each instance owns its bindings.

YAML::

    - type: session-id-producer
      parameters:
        headerName: x-my-session-id     # or cookieName: llm-d-session (exactly one)
        lruSize: 1024                   # > 0; 0 or unset: 1024
        ttl: 30m                        # Go duration, > 0; unset: 30m
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, ClassVar

from pydantic import Field, field_validator, model_validator

from epp.config.units import parse_duration
from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, DataProducer, Handle, PreRequest, SchedulingResult
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

__all__ = ["SessionIdProducer", "SESSION_PRODUCER_TYPE", "DEFAULT_SESSION_HEADER", "find_session_producer",
           "cookie_value"]

SESSION_PRODUCER_TYPE = "session-id-producer"
DEFAULT_SESSION_HEADER = "x-session-id"
"""The header an automatically created producer reads (the reference's default for its data keys)."""
_DEFAULT_LRU = 1024
_DEFAULT_TTL = "30m"


def cookie_value(header: str, name: str) -> str:
    """The value of cookie ``name`` in a ``Cookie`` header (first match), or ""."""
    if not header or not name:
        return ""
    for pair in header.split(";"):
        key, sep, value = pair.strip().partition("=")
        if sep and key == name:
            return value
    return ""


class _ExpiringLru:
    """At most ``size`` entries; an entry expires ``ttl`` seconds after it was last written."""

    def __init__(self, size: int, ttl: float, clock: Callable[[], float]) -> None:
        self.size, self.ttl, self._clock = size, ttl, clock
        self._items: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> str | None:
        item = self._items.get(key)
        if item is None:
            return None
        if self._clock() > item[1]:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return item[0]

    def add(self, key: str, value: str) -> None:
        self._items[key] = (value, self._clock() + self.ttl)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


class SessionIdProducer:
    """Publishes ``SessionID`` and ``BoundEndpoint`` before scheduling; binds the session after the pick."""

    type_name: ClassVar[str] = SESSION_PRODUCER_TYPE

    class Params(PluginParams):
        header_name: str = Field("", alias="headerName")
        cookie_name: str = Field("", alias="cookieName")
        lru_size: int = Field(0, alias="lruSize")
        ttl: str = Field("", alias="ttl")

        @field_validator("lru_size")
        @classmethod
        def _lru(cls, value: int) -> int:
            if value < 0:
                raise ValueError(f"lruSize must be > 0, got {value}")
            return value

        @field_validator("ttl")
        @classmethod
        def _ttl(cls, value: str) -> str:
            if value and parse_duration(value) <= 0:
                raise ValueError(f"ttl must be > 0, got {value!r}")
            return value

        @model_validator(mode="after")
        def _one_source(self) -> SessionIdProducer.Params:
            header, cookie = self.header_name.strip(), self.cookie_name.strip()
            if bool(header) == bool(cookie):
                both = ", not both" if header else ""
                raise ValueError(f"requires exactly one of headerName or cookieName to be set{both}")
            return self

    def __init__(self, name: str, params: Params, handle: Handle, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.params = params
        self.header = params.header_name.strip().lower()
        self.cookie = params.cookie_name.strip()
        ttl = parse_duration(params.ttl or _DEFAULT_TTL)
        self._bindings = _ExpiringLru(params.lru_size or _DEFAULT_LRU, ttl, clock)
        self.session_key = f"{SESSION_PRODUCER_TYPE}/{name}/SessionID"
        self.bound_key = f"{SESSION_PRODUCER_TYPE}/{name}/BoundEndpoint"

    def extract(self, request: InferenceRequest) -> str:
        """The request's session identifier (trimmed), or "" when the source is absent or empty."""
        if self.header:
            return (request.headers.get(self.header) or "").strip()
        return cookie_value(request.headers.get("cookie") or "", self.cookie).strip()

    def produce(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        """Put ``SessionID`` (and ``BoundEndpoint`` when the session is bound) in ``cycle``."""
        sid = self.extract(request)
        if not sid:
            return
        cycle[self.session_key] = sid
        bound = self._bindings.get(sid)
        if bound is not None:
            cycle[self.bound_key] = bound

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """Bind the session to the ``host:port`` the primary profile chose (refreshing the entry's TTL)."""
        sid = self.extract(request)
        endpoints = result.endpoints
        if sid and endpoints:
            self._bindings.add(sid, endpoints[0].hostport)

    def session_id(self, cycle: CycleState) -> str | None:
        """The ``SessionID`` this producer published in ``cycle``, or None."""
        value = cycle.get(self.session_key)
        return value if isinstance(value, str) and value else None

    def bound_endpoint(self, cycle: CycleState) -> str | None:
        """The ``BoundEndpoint`` (``host:port``) this producer published in ``cycle``, or None."""
        value = cycle.get(self.bound_key)
        return value if isinstance(value, str) and value else None


def find_session_producer(owner: object, handle: Handle, ref: str, field: str) -> SessionIdProducer:
    """The ``session-id-producer`` plugin named ``ref``, which consumer ``owner`` reads through parameter ``field``.

    ConfigError naming ``owner`` and ``field`` when ``ref`` names no such plugin (the reference fails at start-up
    on a data key no plugin produces)."""
    found = handle.plugin(ref)
    if isinstance(found, SessionIdProducer):
        return found
    name, type_name = getattr(owner, "name", "?"), getattr(owner, "type_name", "?")
    what = "no plugin has that name" if found is None else f"it is a {found.type_name}"
    raise ConfigError(f"plugin '{name}' (type: {type_name}): {field} reads request attribute '{ref}', which EPP "
                      f"has no producer of ({what}; EPP's request attributes are the SessionID of a "
                      f"{SESSION_PRODUCER_TYPE}, named by that plugin's name)", plugin=name, field=field)


_check_producer: type[DataProducer] = SessionIdProducer
_check_pre: type[PreRequest] = SessionIdProducer
