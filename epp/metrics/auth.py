"""Securing EPP's metrics port: Kubernetes authentication and authorization (``--metrics-endpoint-auth``,
:class:`KubeMetricsAuth`) and TLS (``--metrics-cert-dir``, ``--metrics-client-ca-file``, :class:`MetricsTls`).

A request needs ``Authorization: Bearer <token>`` that a ``TokenReview`` authenticates (else 401) and whose user a
``SubjectAccessReview`` allows ``get`` on the path as a non-resource URL (else 403), answers cached as
controller-runtime caches them; the API server failing gives 401 when authenticating, 500 when authorizing. TLS
serves ``DIR/tls.crt`` and ``DIR/tls.key`` (reloaded when they change on disk); with a client CA every client must
present a certificate it signed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from epp.extproc.tls import KeyPair

__all__ = ["KubeMetricsAuth", "MetricsTls", "AUTHN_TTL", "ALLOW_TTL", "DENY_TTL"]

log = logging.getLogger(__name__)

AUTHN_TTL = 60.0
ALLOW_TTL = 300.0
DENY_TTL = 30.0
_TIMEOUT = 10.0
_MAX_CACHE = 4096


@dataclass(frozen=True, slots=True)
class _User:
    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class KubeMetricsAuth:
    """Checks bearer tokens with the Kubernetes API (see the module docstring); use :meth:`middleware`.

    ``api_client`` is a ``kubernetes_asyncio`` ApiClient; without one it is built at :meth:`start` from
    ``kubeconfig`` or the in-cluster config (and closed at :meth:`stop`)."""

    def __init__(self, *, api_client: Any = None, kubeconfig: str | os.PathLike[str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._api_client = api_client
        self._owns_client = api_client is None
        self._kubeconfig = kubeconfig
        self._clock = clock
        self._tokens: dict[str, tuple[float, _User | None]] = {}
        self._decisions: dict[tuple[_User, str, str], tuple[float, bool, str]] = {}
        self._last_error = ""

    async def start(self) -> None:
        if self._api_client is None:
            from epp.datalayer.kubernetes import make_api_client

            self._api_client = await make_api_client(self._kubeconfig)

    async def stop(self) -> None:
        if self._owns_client and self._api_client is not None:
            await self._api_client.close()
            self._api_client = None

    def middleware(self) -> Callable[[web.Request, Callable[[web.Request], Awaitable[web.StreamResponse]]],
                                     Awaitable[web.StreamResponse]]:
        """An aiohttp middleware answering 401/403/500 before the handler, as the reference's filter."""

        @web.middleware
        async def check(request: web.Request,
                        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
            status, text = await self.check(request.headers.get("Authorization"), request.path,
                                            request.method.lower())
            if status != 200:
                return web.Response(status=status, text=text + "\n")
            return await handler(request)

        return check

    async def check(self, authorization: str | None, path: str, verb: str) -> tuple[int, str]:
        """``(200, "")`` if the bearer token in ``authorization`` may ``verb`` ``path``, else the refusal."""
        if not authorization or not authorization.startswith("Bearer "):
            return 401, "Unauthorized"
        try:
            user = await self._authenticate(authorization[len("Bearer "):].strip())
        except Exception as exc:  # the API server failing must answer this request, never crash the server
            self._log_error("TokenReview", exc)
            return 401, "Unauthorized"
        if user is None:
            return 401, "Unauthorized"
        try:
            allowed, reason = await self._authorize(user, path, verb)
        except Exception as exc:
            self._log_error("SubjectAccessReview", exc)
            return 500, "Authorization failed"
        if not allowed:
            return 403, f"Authorization denied for user {user.name}" + (f": {reason}" if reason else "")
        return 200, ""

    async def _authenticate(self, token: str) -> _User | None:
        now = self._clock()
        cached = self._tokens.get(token)
        if cached is not None and cached[0] > now:
            return cached[1]
        from kubernetes_asyncio import client

        body = client.V1TokenReview(api_version="authentication.k8s.io/v1", kind="TokenReview",
                                    spec=client.V1TokenReviewSpec(token=token))
        review = await asyncio.wait_for(client.AuthenticationV1Api(self._api_client).create_token_review(body),
                                        _TIMEOUT)
        status = review.status
        user = None
        if status is not None and status.authenticated and status.user is not None:
            u = status.user
            user = _User(u.username or "", u.uid or "", tuple(u.groups or ()),
                         tuple(sorted((k, tuple(v)) for k, v in (u.extra or {}).items())))
        self._remember(self._tokens, token, (now + AUTHN_TTL, user))
        return user

    async def _authorize(self, user: _User, path: str, verb: str) -> tuple[bool, str]:
        now = self._clock()
        key = (user, path, verb)
        cached = self._decisions.get(key)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2]
        from kubernetes_asyncio import client

        spec = client.V1SubjectAccessReviewSpec(
            user=user.name, uid=user.uid, groups=list(user.groups), extra={k: list(v) for k, v in user.extra},
            non_resource_attributes=client.V1NonResourceAttributes(path=path, verb=verb))
        body = client.V1SubjectAccessReview(api_version="authorization.k8s.io/v1", kind="SubjectAccessReview",
                                            spec=spec)
        review = await asyncio.wait_for(client.AuthorizationV1Api(self._api_client).create_subject_access_review(
            body), _TIMEOUT)
        allowed = bool(review.status is not None and review.status.allowed and not review.status.denied)
        reason = (review.status.reason or "") if review.status is not None else ""
        self._remember(self._decisions, key, (now + (ALLOW_TTL if allowed else DENY_TTL), allowed, reason))
        return allowed, reason

    @staticmethod
    def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
        if len(cache) >= _MAX_CACHE:  # bound memory under a flood of distinct tokens: drop the oldest entry
            cache.pop(next(iter(cache)))
        cache[key] = value

    def _log_error(self, what: str, exc: Exception) -> None:
        text = f"{what} failed: {type(exc).__name__}: {exc}".strip()
        if text != self._last_error:
            self._last_error = text
            log.warning("metrics endpoint auth: %s", text)


class MetricsTls:
    """The metrics port's TLS: :attr:`context` for the server, kept current by :meth:`start`'s file watcher.

    ``ValueError`` at construction, worded as the reference's start-up errors, if the pair in ``cert_dir`` or the
    CA in ``client_ca_file`` cannot be used."""

    def __init__(self, cert_dir: str | os.PathLike[str], client_ca_file: str | os.PathLike[str] | None = None,
                 *, interval: float = 1.0) -> None:
        from epp.extproc.tls import CertWatcher, TlsFiles

        self.files = TlsFiles(Path(cert_dir, "tls.crt"), Path(cert_dir, "tls.key"))
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            self.context.load_cert_chain(self.files.cert, self.files.key)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ValueError(f"metrics TLS certificate {self.files.cert}, {self.files.key}: {exc}") from None
        if client_ca_file is not None:
            self._require_client_certs(client_ca_file)
        self.watcher = CertWatcher(self.files, self._reload, interval)

    def _require_client_certs(self, ca_file: str | os.PathLike[str]) -> None:
        try:
            pem = Path(ca_file).read_text(encoding="ascii", errors="replace")
        except OSError as exc:
            raise ValueError(f"reading metrics client CA {ca_file}: {exc.strerror or exc}") from None
        try:
            self.context.load_verify_locations(cadata=pem)
        except (ssl.SSLError, ValueError):
            raise ValueError(f"no valid CA certs in metrics client CA file: {ca_file}") from None
        self.context.verify_mode = ssl.CERT_REQUIRED

    def _reload(self, key_pair: KeyPair) -> None:
        from epp.extproc.tls import check_key_pair, load_pair_into

        check_key_pair(key_pair)  # a mismatched pair must not reach the live context
        load_pair_into(self.context, key_pair)

    async def start(self) -> None:
        """Start polling the pair for changes."""
        self.watcher.start()

    async def stop(self) -> None:
        await self.watcher.stop()
