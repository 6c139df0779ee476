"""The Kubernetes list/watch protocol, over the real ``kubernetes_asyncio`` client's raw responses.

- list, then watch from the list's ``resourceVersion`` with ``allowWatchBookmarks`` and a server-side
  ``timeoutSeconds``; ``BOOKMARK`` events only advance the resourceVersion;
- a stream that ends (server timeout, cut connection, an event cut in half) is resumed from the last
  resourceVersion seen in a *complete* event, so nothing is lost or applied twice;
- ``410 Gone`` (as an ``ERROR`` event or an HTTP status) means the resourceVersion expired: re-list (the
  caller's ``on_list`` replaces its state with the listed one);
- any other failure (API server down at start, restarting, 5xx) retries with exponential backoff and jitter;
  errors are logged once per change.

:class:`ListWatcher` runs this loop for any number of resources (one task each) and keeps their cursors, counters
and the once-per-change error log; :mod:`epp.datalayer.kubernetes` decides what is watched and what it means.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import aiohttp

__all__ = ["ListWatcher", "Resource", "WatchOptions"]

log = logging.getLogger("epp.datalayer.kubernetes")  # one log stream for Kubernetes discovery, as before the split


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """Timing of list/watch: server-side watch timeout (randomised up to 2x, as client-go), client read
    timeout margin, and the retry backoff after failures."""

    watch_timeout: float = 300.0
    read_margin: float = 30.0
    request_timeout: float = 30.0
    backoff_initial: float = 0.2
    backoff_max: float = 10.0
    bookmarks: bool = True


class _Gone(Exception):
    """The watch's resourceVersion expired (410): re-list."""


class _ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass
class _Cursor:
    """Where a list/watch loop is: the last resourceVersion applied (None = must list) and events this stream."""

    rv: str | None = None
    events: int = 0


@dataclass
class Resource:
    """How to list/watch one resource kind through the client: ``kind`` names it in logs and cursors,
    ``list_call`` is a ``kubernetes_asyncio`` list method (called with ``watch=True`` to watch), ``selectors`` its
    label/field selector keywords."""

    kind: str
    list_call: Callable[..., Awaitable[Any]]
    selectors: dict[str, str] = field(default_factory=dict)
    quiet_missing: bool = False
    """A 404 (the resource's CRD is not installed) is expected: logged once at INFO, not as a warning."""


class ListWatcher:
    """Runs list/watch loops (:meth:`run`) with ``options``; ``relists`` and ``watches`` count re-lists after 410
    and watch requests, :meth:`resource_version` tells where a resource's loop is."""

    def __init__(self, options: WatchOptions, rng: random.Random) -> None:
        self.options = options
        self._rng = rng
        self._errors: dict[str, str] = {}
        self._cursors: dict[str, _Cursor] = {}
        self.relists = 0
        self.watches = 0

    def resource_version(self, kind: str) -> str | None:
        """The last resourceVersion applied for the resource named ``kind``; None before a list."""
        cursor = self._cursors.get(kind)
        return None if cursor is None else cursor.rv

    async def run(self, res: Resource, on_list: Callable[[list[Any]], None],
                  on_event: Callable[[str, Any], None]) -> None:
        """List (``on_list(items)``), then watch forever from the last resourceVersion (``on_event(type, obj)``
        for ADDED, MODIFIED and DELETED); re-list on 410; back off on errors. Returns only when cancelled."""
        opts = self.options
        cursor = self._cursors[res.kind] = _Cursor()
        backoff = opts.backoff_initial
        while True:
            try:
                if cursor.rv is None:
                    items, cursor.rv = await self._list(res)
                    on_list(items)
                    self.clear_error(res.kind)
                started, cursor.events = time.monotonic(), 0
                await self._watch(res, cursor, on_event)
                self.clear_error(res.kind)
                if cursor.events or time.monotonic() - started > 1.0:
                    backoff = opts.backoff_initial
                    continue
                # A stream that ended at once without events: do not spin against a flapping server.
                await asyncio.sleep(self._jittered(backoff))
                backoff = min(opts.backoff_max, backoff * 2)
            except _Gone:
                log.info("%s watch: resourceVersion %s expired (410 Gone), re-listing", res.kind, cursor.rv)
                cursor.rv = None
                self.relists += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- the API server may fail in any way; retry forever
                if res.quiet_missing and isinstance(exc, _ApiError) and exc.status == 404:
                    self.error(res.kind, f"{res.kind}: not installed in this cluster (404); watching for it",
                                level=logging.INFO)
                else:
                    self.error(res.kind, f"{res.kind} list/watch failed: {_describe(exc)}; retrying")
                await asyncio.sleep(self._jittered(backoff))
                backoff = min(opts.backoff_max, backoff * 2)

    async def _list(self, res: Resource) -> tuple[list[Any], str]:
        resp = await res.list_call(_preload_content=False, _request_timeout=self.options.request_timeout,
                                   **res.selectors)
        async with resp:
            body = await resp.read()
            if resp.status != 200:
                raise _ApiError(resp.status, _status_message(body))
        data = json.loads(body)
        return list(data.get("items") or []), str((data.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, res: Resource, cursor: _Cursor, on_event: Callable[[str, Any], None]) -> None:
        """Follow one watch stream, advancing ``cursor`` after every complete event (and bookmark)."""
        opts = self.options
        server_timeout = int(opts.watch_timeout * self._rng.uniform(1.0, 2.0))
        timeout = aiohttp.ClientTimeout(sock_connect=opts.request_timeout,
                                        sock_read=server_timeout + opts.read_margin)
        self.watches += 1
        resp = await res.list_call(watch=True, resource_version=cursor.rv, allow_watch_bookmarks=opts.bookmarks,
                                   timeout_seconds=server_timeout, _preload_content=False,
                                   _request_timeout=timeout, **res.selectors)
        async with resp:
            if resp.status == 410:
                raise _Gone()
            if resp.status != 200:
                raise _ApiError(resp.status, _status_message(await resp.read()))
            while True:
                try:
                    line = await resp.content.readline()
                except aiohttp.ClientPayloadError as exc:  # connection cut mid-chunk (LB, API server restart)
                    log.debug("%s watch stream cut: %s; resuming from %s", res.kind, exc, cursor.rv)
                    return
                if not line.endswith(b"\n"):
                    return  # end of stream, or an event cut in half: resume from the last complete one
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                    kind, obj = event["type"], event["object"]
                    meta = obj.get("metadata") or {}
                except (ValueError, KeyError, TypeError, AttributeError):
                    self.error(res.kind, f"{res.kind} watch: malformed event {line[:200]!r}; resuming")
                    return
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise _ApiError(int(obj.get("code") or 500), str(obj.get("message") or obj))
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    on_event(kind, obj)
                    cursor.events += 1
                cursor.rv = str(meta.get("resourceVersion") or cursor.rv)  # BOOKMARK: only this

    def _jittered(self, delay: float) -> float:
        return delay * self._rng.uniform(0.8, 1.2)

    def error(self, key: str, message: str, level: int = logging.WARNING) -> None:
        """Log ``message`` for ``key`` unless it is the message already logged for it."""
        if self._errors.get(key) != message:
            log.log(level, "%s", message)
            self._errors[key] = message

    def clear_error(self, key: str) -> None:
        """``key`` works again: say so if an error was logged for it."""
        if self._errors.pop(key, None) is not None:
            log.info("%s list/watch recovered", key)

    def forget(self, key: str) -> None:
        """Drop ``key``'s error silently (the next error for it is logged again)."""
        self._errors.pop(key, None)


def _status_message(body: bytes) -> str:
    try:
        data = json.loads(body)
        return str(data.get("message") or data.get("reason") or body[:200])
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", "replace")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
