"""Leader election over a ``coordination.k8s.io/v1`` Lease, for EPP's active-passive HA mode
(``--ha-enable-leader-election``).

Several EPP replicas watch the same pool (hot standby); only the leader reports ready, so the Service sends Envoy
to the leader alone. :class:`LeaderElector` keeps client-go's record rules: a Lease held by another identity is
respected while it is valid *as observed locally* (monotonic time, never another pod's clock); every replace
carries the ``resourceVersion`` just read, so two replicas never both win; :attr:`LeaderElector.is_leader` turns
false the instant no renew succeeded within ``renew_deadline`` (< ``lease_duration``, so a follower cannot take
over before); :meth:`LeaderElector.stop` releases the Lease. A replica that loses the Lease keeps campaigning with
its warm state. API failures are logged (rate-limited) and retried; they never end the campaign.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import socket
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import aiohttp

from epp.datalayer.kubernetes import make_api_client
from epp.errors import ConfigError

__all__ = ["LeaderElector", "lease_name_for", "micro_time"]

log = logging.getLogger(__name__)

LEASE_API_VERSION = "coordination.k8s.io/v1"
JITTER_FACTOR = 1.2  # client-go: a follower waits retry_period * (1 + rand * 1.2) between tries
ERROR_LOG_EVERY = 60.0  # the same API error is logged at most once a minute
_EXPECTED_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, ValueError)


def lease_name_for(namespace: str, pool_name: str) -> str:
    """The reference's Lease name for the EPP of pool ``namespace/pool_name`` (unique per EPP deployment)."""
    return f"epp-{namespace}-{pool_name}.gateway-api-inference-extension.sigs.k8s.io"


def micro_time(now: datetime | None = None) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with exactly six fractional digits."""
    return (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _ApiStatus(Exception):
    """The API server answered with an unexpected HTTP status."""

    def __init__(self, status: int, body: bytes) -> None:
        try:
            message = str(json.loads(body).get("message") or body[:200])
        except (ValueError, AttributeError):
            message = body[:200].decode("utf-8", "replace")
        super().__init__(f"HTTP {status}: {message}")


class LeaderElector:
    """Campaigns for the Lease ``namespace/name`` (see the module docstring for the rules).

    ``api_client`` is a ``kubernetes_asyncio`` ApiClient; without one, :meth:`start` builds one from
    ``kubeconfig`` (or in-cluster config) and :meth:`stop` closes it. ``ConfigError`` unless
    ``lease_duration > renew_deadline > 1.2 * retry_period > 0`` (client-go's constraints).
    """

    def __init__(self, *, namespace: str, name: str, identity: str | None = None, api_client: Any = None,
                 kubeconfig: str | os.PathLike[str] | None = None, lease_duration: float = 15.0,
                 renew_deadline: float = 10.0, retry_period: float = 2.0) -> None:
        if not (retry_period > 0 and renew_deadline > JITTER_FACTOR * retry_period
                and lease_duration > renew_deadline):
            raise ConfigError(f"leader election needs lease duration ({lease_duration}s) > renew deadline "
                              f"({renew_deadline}s) > {JITTER_FACTOR} x retry period ({retry_period}s) > 0")
        self.namespace, self.name = namespace, name
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self._identity = identity or f"{socket.gethostname()}_{uuid.uuid4()}"
        self._api_client, self._owns_client, self._kubeconfig = api_client, False, kubeconfig
        self._leases: Any = None
        self._task: asyncio.Task[None] | None = None
        self._leading = False
        self._renew_by = 0.0  # monotonic: leadership ends here unless a renew succeeds first
        self._observed: dict[str, Any] | None = None  # the Lease spec last seen or written
        self._observed_at = 0.0  # monotonic time it was first seen in that state
        self._changed = asyncio.Event()
        self._rng = random.Random()
        self._last_error: tuple[str, float] | None = None

    @property
    def identity(self) -> str:
        """This replica's holder identity (default ``<hostname>_<uuid4>``, as controller-runtime)."""
        return self._identity

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the Lease and its last successful renew is within the renew deadline."""
        return self._leading and time.monotonic() < self._renew_by

    @property
    def holder(self) -> str | None:
        """The holder identity last seen on the Lease (``""`` when released; None before the first read), as
        client-go's ``GetLeader``."""
        return None if self._observed is None else str(self._observed.get("holderIdentity") or "")

    async def start(self) -> None:
        """Start campaigning in a background task; returns at once. A second call does nothing."""
        if self._task is not None:
            return
        from kubernetes_asyncio import client

        if self._api_client is None:
            self._api_client, self._owns_client = await make_api_client(self._kubeconfig), True
        self._leases = client.CoordinationV1Api(self._api_client)
        log.info("leader election: campaigning for lease %s/%s as %s", self.namespace, self.name, self._identity)
        self._task = asyncio.get_running_loop().create_task(self._campaign(), name=f"leader-election:{self.name}")

    async def stop(self, release: bool = True) -> None:
        """Stop campaigning. A leader stops leading at once and, with ``release``, writes the released record so a
        follower takes over without waiting for the lease to expire. Safe to call more than once."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._set_leading(False, "stopping")
        if release and self._holds_record():
            await self._release()
        if self._owns_client and self._api_client is not None:
            await self._api_client.close()
            self._api_client, self._owns_client = None, False

    async def changed(self) -> None:
        """Resolve at the next change of leadership (either way)."""
        await self._changed.wait()

    # -- the campaign -------------------------------------------------------------------------------------------

    async def _campaign(self) -> None:
        while True:
            await self._round()
            await asyncio.sleep(self._pause())

    async def _round(self) -> None:
        """One try to acquire or renew, bounded by the renew deadline when leading."""
        started = time.monotonic()
        if self._leading and started >= self._renew_by:
            self._set_leading(False, f"no successful renew within {self.renew_deadline:g}s")
        try:
            async with asyncio.timeout(self._renew_by - started if self._leading else self.renew_deadline):
                outcome = await self._try_acquire_or_renew()
        except Exception as exc:  # noqa: BLE001 -- the API server may fail in any way; never end the campaign
            self._report(exc)
            return
        self._recovered()
        if outcome:
            self._renew_by = started + self.renew_deadline
            self._set_leading(True, "acquired the lease")
        elif outcome is False and self._leading:
            self._set_leading(False, f"the lease is held by {self.holder}")

    def _pause(self) -> float:
        if self._leading:  # wake at the deadline at the latest, so losing it is noticed (and announced) on time
            return max(0.0, min(self.retry_period, self._renew_by - time.monotonic()))
        return self.retry_period * (1.0 + self._rng.random() * JITTER_FACTOR)

    async def _try_acquire_or_renew(self) -> bool | None:
        """True: this replica holds the Lease now. False: another holder's lease is valid. None: lost a race
        (409), try again."""
        now = micro_time()
        lease = await self._read()
        if lease is None:
            return await self._write(None, self._record(now, now, 0))
        spec = lease.get("spec") or {}
        if spec != self._observed:
            self._observed, self._observed_at = spec, time.monotonic()
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self._identity and self._observed_valid(spec):
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self._identity:
            record = self._record(spec.get("acquireTime") or now, now, transitions)
        else:
            record = self._record(now, now, transitions + 1)
        return await self._write(lease, record)

    def _observed_valid(self, spec: dict[str, Any]) -> bool:
        duration = spec.get("leaseDurationSeconds") or self.lease_duration
        return time.monotonic() < self._observed_at + duration

    def _record(self, acquired: str, renewed: str, transitions: int) -> dict[str, Any]:
        return {"holderIdentity": self._identity, "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),
                "acquireTime": acquired, "renewTime": renewed, "leaseTransitions": transitions}

    def _holds_record(self) -> bool:
        return self.holder == self._identity

    async def _release(self) -> None:
        """Write the released record (over the Lease as read now, if this replica still holds it)."""
        try:
            async with asyncio.timeout(self.renew_deadline):
                lease = await self._read()
                spec = (lease or {}).get("spec") or {}
                if lease is None or spec.get("holderIdentity") != self._identity:
                    return
                now = micro_time()
                released = {"holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now,
                            "leaseTransitions": int(spec.get("leaseTransitions") or 0)}
                if await self._write(lease, released):
                    log.info("leader election: released lease %s/%s", self.namespace, self.name)
                else:
                    log.warning("leader election: lease %s/%s changed while releasing it", self.namespace, self.name)
        except Exception as exc:  # noqa: BLE001 -- best effort at shutdown: the lease then expires on its own
            log.warning("leader election: could not release lease %s/%s: %s", self.namespace, self.name,
                        _describe(exc))

    # -- API calls -----------------------------------------------------------------------------------------------

    async def _read(self) -> dict[str, Any] | None:
        """The Lease object, or None if it does not exist."""
        status, body = await self._call(self._leases.read_namespaced_lease, self.name, self.namespace)
        if status == 404:
            return None
        if status != 200:
            raise _ApiStatus(status, body)
        return json.loads(body)

    async def _write(self, lease: dict[str, Any] | None, spec: dict[str, Any]) -> bool | None:
        """Create the Lease (``lease`` None) or replace ``lease`` (with its resourceVersion) with ``spec``. True if
        written, None on a 409 (someone else wrote first)."""
        if lease is None:
            body = {"apiVersion": LEASE_API_VERSION, "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
            status, raw = await self._call(self._leases.create_namespaced_lease, self.namespace, body)
        else:
            status, raw = await self._call(self._leases.replace_namespaced_lease, self.name, self.namespace,
                                           {**lease, "spec": spec})
        if status == 409:
            return None
        if status not in (200, 201):
            raise _ApiStatus(status, raw)
        self._observed, self._observed_at = json.loads(raw).get("spec") or spec, time.monotonic()
        return True

    @staticmethod
    async def _call(method: Any, *args: Any) -> tuple[int, bytes]:
        resp = await method(*args, _preload_content=False)
        async with resp:
            return resp.status, await resp.read()

    # -- state changes and logs ---------------------------------------------------------------------------------

    def _set_leading(self, leading: bool, reason: str) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        log.info("leader election: %s leadership of lease %s/%s (%s)", "gained" if leading else "lost",
                 self.namespace, self.name, reason)
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    def _report(self, exc: BaseException) -> None:
        message = f"leader election: lease {self.namespace}/{self.name}: {_describe(exc)}"
        now = time.monotonic()
        if self._last_error is not None and self._last_error[0] == message \
                and now - self._last_error[1] < ERROR_LOG_EVERY:
            return
        self._last_error = (message, now)
        log.warning("%s; retrying every %gs", message, self.retry_period,
                    exc_info=None if isinstance(exc, (_ApiStatus, *_EXPECTED_ERRORS)) else exc)

    def _recovered(self) -> None:
        if self._last_error is not None:
            self._last_error = None
            log.info("leader election: lease %s/%s: the API server answers again", self.namespace, self.name)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
