"""Per-endpoint HTTP polling for the data sources other than the metrics scraper (``models-data-source``).

:class:`HttpPoller` runs one asyncio loop per endpoint of the :class:`~epp.datalayer.datastore.Datastore`, present
and future (``await start()`` / ``await stop()``, both idempotent), sharing one lean keep-alive client. Each loop
GETs ``scheme://host:port/path`` at once, then every ``interval`` start to start (never overlapping itself). At most
``max_concurrency`` requests are in flight, each bounded by ``timeout``, so a dead endpoint never delays the others.
A 200 answer's body goes to ``on_body(endpoint, body)``; anything else is a failed poll, counted and logged once per
change. Nothing an endpoint does escapes a loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from dataclasses import dataclass
from typing import Callable

from epp.datalayer.http import HttpError, MetricsHttpClient
from epp.datalayer.scraper import DataLayerErrors, ScrapeStats
from epp.framework.endpoint import Endpoint, EndpointSpec
from epp.framework.pool import EndpointPool

__all__ = ["PollConfig", "HttpPoller", "TlsOptionError", "tls_client_context"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PollConfig:
    """Where and how often to poll (see the module docstring); ``insecure_skip_verify`` applies to ``https``
    endpoints when the poller is given no ``ssl_context``."""

    scheme: str = "http"
    path: str = "/"
    interval: float = 0.05
    timeout: float = 1.0
    max_concurrency: int = 32
    max_bytes: int = 4 * 1024 * 1024
    accept: str = "application/json"
    insecure_skip_verify: bool = True

    def __post_init__(self) -> None:
        if self.interval <= 0 or self.timeout <= 0:
            raise ValueError("interval and timeout must be positive")
        if self.max_concurrency < 1 or self.max_bytes < 1:
            raise ValueError("max_concurrency and max_bytes must be at least 1")
        if self.scheme not in ("http", "https"):
            raise ValueError(f"scheme must be http or https, not {self.scheme!r}")
        if not self.path.startswith("/"):
            raise ValueError(f"path must start with '/', not {self.path!r}")


class TlsOptionError(ValueError):
    """A TLS option (``field``: its YAML name) names a file that cannot be used."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def tls_client_context(insecure_skip_verify: bool, ca_cert_path: str = "", client_cert_path: str = "",
                       client_key_path: str = "") -> ssl.SSLContext:
    """The reference's TLS options as an ``SSLContext``: no verification with ``insecure_skip_verify`` (the CA is
    then not read), else verification against ``ca_cert_path`` only when given, else the system trust store; plus
    a client certificate for mTLS when either client path is given (both are needed).

    :class:`TlsOptionError` naming the option (``caCertPath``, ``clientCertPath``, ``clientKeyPath``) when a file
    cannot be used."""
    verify_ca = ca_cert_path and not insecure_skip_verify
    try:
        ctx = ssl.create_default_context(cafile=ca_cert_path if verify_ca else None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsOptionError("caCertPath", f"no valid CA certificate in {ca_cert_path!r}: {_reason(exc)}") from exc
    if insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if client_cert_path or client_key_path:
        if not client_key_path:
            raise TlsOptionError("clientKeyPath", "must be set with clientCertPath")
        if not client_cert_path:
            raise TlsOptionError("clientCertPath", "must be set with clientKeyPath")
        try:
            ctx.load_cert_chain(client_cert_path, client_key_path)
        except (OSError, ssl.SSLError) as exc:
            raise TlsOptionError("clientCertPath", f"cannot load the client certificate {client_cert_path!r} "
                                 f"with key {client_key_path!r}: {_reason(exc)}") from exc
    return ctx


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)


class _Loop:
    """One endpoint's loop: its task, the spec it last polled, consecutive failures and the last error logged."""

    __slots__ = ("task", "spec", "failures", "error")

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.spec: EndpointSpec | None = None
        self.failures = 0
        self.error: str | None = None


class HttpPoller:
    """Polls every endpoint of a datastore over HTTP (see the module docstring for the contract); ``source_type``
    (default ``name``) labels the poll errors counted into ``errors``."""

    def __init__(self, datastore: EndpointPool, config: PollConfig, on_body: Callable[[Endpoint, bytes], None], *,
                 name: str, ssl_context: ssl.SSLContext | None = None, rng: random.Random | None = None,
                 errors: DataLayerErrors | None = None, source_type: str = "") -> None:
        self.datastore = datastore
        self.config = config
        self.name = name
        self.stats = ScrapeStats()
        self.errors = errors
        self.source_type = source_type or name
        self._on_body = on_body
        self._ssl = ssl_context
        self._rng = rng or random.Random()
        self._http: MetricsHttpClient | None = None
        self._slots: asyncio.Semaphore | None = None
        self._loops: dict[Endpoint, _Loop] = {}
        self._subscribed = False

    @property
    def running(self) -> bool:
        return self._http is not None

    async def start(self) -> None:
        """Poll every current endpoint and follow datastore changes. Idempotent."""
        if self._http is not None:
            return
        cfg = self.config
        self._http = MetricsHttpClient(accept=cfg.accept, insecure_skip_verify=cfg.insecure_skip_verify,
                                       max_bytes=cfg.max_bytes, ssl_context=self._ssl)
        self._slots = asyncio.Semaphore(cfg.max_concurrency)
        if not self._subscribed:
            self.datastore.subscribe(self._on_change)
            self._subscribed = True
        for ep in self.datastore.endpoints():
            self._start_loop(ep)

    async def stop(self) -> None:
        """Cancel every loop, wait for them, and close the connections. Idempotent."""
        http, self._http = self._http, None
        loops, self._loops = self._loops, {}
        tasks = [lp.task for lp in loops.values() if lp.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if http is not None:
            await http.aclose()

    def polling(self, ep: Endpoint) -> bool:
        """True while a loop runs for ``ep``."""
        lp = self._loops.get(ep)
        return lp is not None and lp.task is not None and not lp.task.done()

    def failures(self, ep: Endpoint) -> int:
        """Consecutive failed polls of ``ep`` (0 after a success, or when it is not polled)."""
        lp = self._loops.get(ep)
        return lp.failures if lp is not None else 0

    def last_error(self, ep: Endpoint) -> str | None:
        """Why the latest poll of ``ep`` failed, or None when it succeeded (or has not run)."""
        lp = self._loops.get(ep)
        return lp.error if lp is not None else None

    def _on_change(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        if self._http is None:
            return
        for ep in removed:
            lp = self._loops.pop(ep, None)
            if lp is not None and lp.task is not None:
                lp.task.cancel()
            self._http.close(ep)
        for ep in added:
            self._start_loop(ep)

    def _start_loop(self, ep: Endpoint) -> None:
        if ep in self._loops:
            return
        lp = _Loop()
        self._loops[ep] = lp
        lp.task = asyncio.get_running_loop().create_task(self._run(ep, lp), name=f"{self.name}:{ep.name}")

    async def _run(self, ep: Endpoint, lp: _Loop) -> None:
        interval, first = self.config.interval, True
        while self._http is not None:
            started = time.monotonic()
            try:
                await self._poll_once(ep, lp)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- a model server must never crash EPP
                self._failed(ep, lp, exc)
                delay = interval
            else:
                self._succeeded(ep, lp)
                delay = max(0.0, interval - (time.monotonic() - started))
            if first:  # endpoints added together poll together once, then spread out
                delay, first = self._rng.uniform(0, delay), False
            await asyncio.sleep(delay)

    async def _poll_once(self, ep: Endpoint, lp: _Loop) -> None:
        http, slots = self._http, self._slots
        assert http is not None and slots is not None
        if lp.spec is not ep.spec:  # discovery retagged it: the metrics host may have moved
            if lp.spec is not None:
                http.close(ep)
            lp.spec = ep.spec
        cfg = self.config
        async with slots:
            status, body = await http.get(ep, *self._target(ep), cfg.path, cfg.timeout)
        if status != 200:
            raise HttpError(f"HTTP {status}")
        self._on_body(ep, body)

    def _target(self, ep: Endpoint) -> tuple[str, str, int]:
        """Scheme, host and port polled for ``ep`` (see the module docstring)."""
        spec = ep.spec
        scheme = "https" if spec.scheme == "https" else self.config.scheme
        return scheme, spec.metrics_address or spec.address, spec.metrics_port or spec.port

    def _succeeded(self, ep: Endpoint, lp: _Loop) -> None:
        self.stats.ok += 1
        lp.failures = 0
        if lp.error is not None:
            log.info("%s: endpoint %s: poll recovered (was: %s)", self.name, ep.name, lp.error)
            lp.error = None

    def _failed(self, ep: Endpoint, lp: _Loop, exc: BaseException) -> None:
        self.stats.failed += 1
        lp.failures += 1
        if self.errors is not None:
            self.errors.datalayer_poll_error(self.source_type)
        message = "timed out" if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) else (
            str(exc) if isinstance(exc, (HttpError, ValueError)) else f"{type(exc).__name__}: {exc}")
        if message != lp.error:
            scheme, host, port = self._target(ep)
            host = f"[{host}]" if ":" in host else host
            log.warning("%s: endpoint %s: poll of %s://%s:%d%s failed: %s", self.name, ep.name, scheme, host, port,
                        self.config.path, message)
            lp.error = message
