"""What ``epp envoy-config`` can set, checked: :class:`EnvoyConfigOptions` and the timeouts it derives.

:meth:`EnvoyConfigOptions.check` raises :class:`EnvoyConfigError` for options that cannot make a working
configuration; :attr:`~EnvoyConfigOptions.idle_timeout` and :attr:`~EnvoyConfigOptions.message_timeout` are derived
from the route timeout and EPP's longest flow-control wait (``queue_wait_s``) when not given, and
:meth:`~EnvoyConfigOptions.warnings` says what they still cannot cover. Defaults match ``epp serve``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["EnvoyConfigOptions", "EnvoyConfigError", "LbPolicy", "parse_hostport", "DEFAULT_XDS_PORT",
           "INFERENCE_SUFFIXES", "DEFAULT_MESSAGE_TIMEOUT_S", "DEFAULT_IDLE_TIMEOUT_S", "QUEUE_MARGIN_S",
           "MAX_MESSAGE_TIMEOUT_S"]

DEFAULT_XDS_PORT = 18000
"""Where ``epp envoy-config`` expects EPP's EDS server (``epp serve --xds-port``) unless ``--xds`` says."""
INFERENCE_SUFFIXES = (
    "chat/completions", "completions", "embeddings", "responses", "conversations", "chat/completions/render",
    "completions/render", "images/generations", "images/edits", "audio/speech", "videos", "videos/sync",
    "messages", "messages/count_tokens", "messages/render")
"""The path suffixes ``openai-parser`` and ``anthropic-parser`` claim: what EPP's default parser reads."""
DEFAULT_MESSAGE_TIMEOUT_S = 5.0
DEFAULT_IDLE_TIMEOUT_S = 300.0
"""Envoy's default HCM ``stream_idle_timeout``."""
QUEUE_MARGIN_S = 5.0
"""Added to the flow-control wait: EPP answers an expired request within its dispatch tick, then Envoy relays it."""
MAX_MESSAGE_TIMEOUT_S = 3600.0
"""Envoy's upper bound on the ext_proc ``message_timeout`` (the field's validation rule)."""


LbPolicy = Literal["override-host", "original-dst"]


class EnvoyConfigError(ValueError):
    """Options that cannot make a working configuration."""


@dataclass(frozen=True)
class EnvoyConfigOptions:
    """Everything ``epp envoy-config`` can set; defaults match ``epp serve``'s defaults.

    ``message_timeout_s``/``idle_timeout_s`` of None are derived (:attr:`message_timeout`,
    :attr:`idle_timeout`). ``queue_wait_s`` is the longest time EPP's flow control may hold a request before
    answering it (its largest request TTL; 0: no TTL, it waits as long as Envoy does; None: no flow control, or
    not known). ``xds`` lists EPP's EDS server(s) (empty: the first ``epp`` host on :data:`DEFAULT_XDS_PORT`);
    ``retries`` bounds the further endpoints one request may try (override-host only); ``suffixes`` are the
    claimed path suffixes routed for ``POST``; ``allow_paths`` are further exact paths routed for any method.
    """

    listen: str = "0.0.0.0:8081"
    epp: tuple[str, ...] = ("127.0.0.1:9002",)
    mode: Literal["full-duplex", "buffered"] = "full-duplex"
    response_mode: Literal["streamed", "full-duplex", "none"] = "streamed"
    fail_open: bool = False
    fallback: tuple[str, ...] = ()
    plaintext: bool = False
    admin: str | None = "127.0.0.1:9901"
    body_limit: int = 10 << 20
    route_timeout_s: float = 300.0
    message_timeout_s: float | None = None
    request_timeout_s: float = 120.0
    idle_timeout_s: float | None = None
    queue_wait_s: float | None = None
    epp_connect_timeout_s: float = 2.0
    access_log: bool = False
    lb: LbPolicy = "original-dst"
    """The library default needs nothing from EPP; ``epp envoy-config`` defaults to ``override-host``."""
    xds: tuple[str, ...] = ()
    retries: int = 3
    suffixes: tuple[str, ...] = INFERENCE_SUFFIXES
    allow_paths: tuple[str, ...] = ()
    epp_health_port: int | None = None
    """EPP's gRPC health port (``epp serve --health-port``): Envoy health-checks every ``epp`` address on it and
    sends new ext_proc streams to the SERVING ones. None (the library default; ``epp envoy-config`` defaults to
    9003, ``epp serve``'s): no health checks."""
    health_interval_s: float = 1.0

    def check(self) -> None:
        """Raise :class:`EnvoyConfigError` for contradictory options."""
        if not self.epp:
            raise EnvoyConfigError("at least one --epp address is needed")
        if self.response_mode == "none" and self.mode == "full-duplex":
            raise EnvoyConfigError(
                "--response-mode none needs --mode buffered: with a FULL_DUPLEX_STREAMED request body and no "
                "response phase Envoy ends the ext_proc stream right after EPP's routing reply, so EPP would "
                "release the request (in-flight counts, flow-control slot, running requests) while the model "
                "server is still answering")
        if self.fail_open and self.mode == "full-duplex":
            raise EnvoyConfigError(
                "--fail-open needs --mode buffered: Envoy ignores failure_mode_allow for FULL_DUPLEX_STREAMED "
                "bodies (an unreachable EPP gives 500 either way)")
        if self.fallback and not self.fail_open:
            raise EnvoyConfigError("--fallback is only used with --fail-open")
        if self.body_limit <= 0:
            raise EnvoyConfigError("--body-limit must be positive")
        if self.message_timeout_s is not None and not 0 < self.message_timeout_s <= MAX_MESSAGE_TIMEOUT_S:
            raise EnvoyConfigError(f"--message-timeout must be in (0, {MAX_MESSAGE_TIMEOUT_S:g}] (Envoy's range)")
        if self.xds and self.lb != "override-host":
            raise EnvoyConfigError("--xds is only used with --lb override-host")
        if self.epp_health_port is not None and not 0 < self.epp_health_port <= 65535:
            raise EnvoyConfigError("--epp-health-port must be a port (1-65535)")
        if not 0 < self.health_interval_s <= 60:
            raise EnvoyConfigError("--health-interval must be in (0, 60] seconds")
        if not 0 <= self.retries <= 10:
            raise EnvoyConfigError("--retries must be from 0 to 10")
        if not self.suffixes:
            raise EnvoyConfigError("no inference path to route")
        for path in self.allow_paths:
            if not path.startswith("/") or "?" in path or "#" in path:
                raise EnvoyConfigError(f"--allow-path takes a path such as /tokenize, got {path!r}")
        for addr in (self.listen, *self.epp, *self.fallback, *self.xds, *((self.admin,) if self.admin else ())):
            parse_hostport(addr)

    @property
    def xds_addresses(self) -> tuple[str, ...]:
        """Where Envoy asks for the pool's endpoints: ``xds``, else the first EPP host on the default port."""
        if self.xds:
            return self.xds
        host = parse_hostport(self.epp[0])[0]
        return (f"[{host}]:{DEFAULT_XDS_PORT}" if ":" in host else f"{host}:{DEFAULT_XDS_PORT}",)

    @property
    def idle_timeout(self) -> float:
        """The HCM ``stream_idle_timeout`` (0: none): as given, else Envoy's 5 min raised to the route timeout (a
        non-streamed answer is silent until it is done) and to the queue wait plus a margin (so is a queued one)."""
        if self.idle_timeout_s is not None:
            return self.idle_timeout_s
        wait = self.queue_wait_s or 0.0
        return max(DEFAULT_IDLE_TIMEOUT_S, self.route_timeout_s, wait + QUEUE_MARGIN_S if wait > 0 else 0.0)

    @property
    def message_timeout(self) -> float:
        """The ext_proc ``message_timeout``: as given, else 5 s. In buffered mode EPP answers the body only once
        admitted, so a known queue wait raises it to :meth:`_queue_bound`, at most Envoy's 1 h."""
        if self.message_timeout_s is not None:
            return self.message_timeout_s
        if self.mode != "buffered" or self.queue_wait_s is None:
            return DEFAULT_MESSAGE_TIMEOUT_S
        return min(max(DEFAULT_MESSAGE_TIMEOUT_S, self._queue_bound()), MAX_MESSAGE_TIMEOUT_S)

    def _queue_bound(self) -> float:
        """How long Envoy must let EPP hold a request: the queue wait plus a margin; with no TTL, as long as the
        idle timeout lets the request live (so that it, not the message timeout, ends the wait)."""
        wait = self.queue_wait_s or 0.0
        return wait + QUEUE_MARGIN_S if wait > 0 else self.idle_timeout or MAX_MESSAGE_TIMEOUT_S

    def warnings(self) -> list[str]:
        """What these timeouts cannot do for EPP's flow-control queue (``queue_wait_s``); empty when all is well."""
        wait = self.queue_wait_s
        if wait is None:
            return []
        out = []
        bound, idle = self._queue_bound(), self.idle_timeout
        if wait == 0 and idle:
            out.append(f"EPP's flow control has no request TTL (0: wait as long as the client does); Envoy ends a "
                       f"request still queued after its stream idle timeout, {idle:g} s, with 504 'stream timeout'")
        elif 0 < idle < bound:
            out.append(f"the stream idle timeout ({idle:g} s) is shorter than EPP's longest flow-control wait "
                       f"({wait:g} s): Envoy answers a request still queued then with 504 'stream timeout' instead "
                       f"of EPP's own answer (429 or 503)")
        if self.mode == "buffered" and self.message_timeout < bound:
            bypass = " and, with --fail-open, sends it to the fallback, past flow control" if self.fail_open else ""
            limit = "; Envoy allows at most 1 h, use --mode full-duplex" if bound > MAX_MESSAGE_TIMEOUT_S else ""
            out.append(f"buffered mode: Envoy waits at most --message-timeout {self.message_timeout:g} s for EPP to "
                       f"answer a request body, less than a request may be queued ({bound:g} s): Envoy then answers "
                       f"504 with an empty body instead of EPP's 429 or 503{bypass}{limit}")
        return out


def parse_hostport(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); :class:`EnvoyConfigError` if malformed."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise EnvoyConfigError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)
