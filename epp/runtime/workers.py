"""Several EPP processes behind one Envoy, sharing the scheduling state that must be shared.

``--workers N`` runs N EPP processes on consecutive ports; the Envoy ext_proc cluster lists all of them and spreads
streams over them. Each worker runs its own discovery, Director and ExtProcServer; over a mesh of Unix datagram
sockets (:class:`PeerLink`, directory mode 0700) they share in-flight counts (every 20 ms), the bookings of any
plugin implementing :class:`~epp.framework.plugins.SharedLoad` and the approximate prefix-cache index (any plugin
implementing :class:`~epp.framework.plugins.SharedBlockIndex`) as they change (bookings coalesced over 2 ms),
model-server metrics (only worker 0 scrapes) and EPP's own request metrics (worker 0 alone serves ``/metrics``).
Delivery is best effort: counts and bookings are re-sent every period, a dropped prefix update only costs an
affinity miss.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import struct
import tempfile
import time
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epp.framework.plugins import SharedBlockIndex, SharedLoad

if TYPE_CHECKING:
    from epp.datalayer.datastore import Datastore
    from epp.framework.endpoint import Endpoint
    from epp.metrics.instruments import Family
    from epp.scheduling.director import Director

__all__ = ["PeerLink", "run_workers", "die_with_parent"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

log = logging.getLogger("epp.runtime.workers")

_INFLIGHT, _PREFIX, _METRICS, _FAMILIES, _LOAD = b"I", b"P", b"M", b"F", b"L"
_MAX_DATAGRAM = 60_000
LOAD_DELAY = 0.002
"""Seconds a change of the bookings waits for others to go out with it: 2 ms kept two workers' cost model as good as
one process on shared-prefix (docs/routing.md), and caps the datagrams at 500 a second however many requests."""
_HEADER = struct.Struct("<HI")  # name length, hash count


class PeerLink:
    """This worker's end of the mesh: worker ``index`` of ``size``, sockets in ``directory``.

    :meth:`attach` wires a started Director's datastore and pipeline to the mesh; :meth:`start` binds and begins
    publishing; :meth:`stop` closes. ``scrape_owner`` is the worker whose scraped metrics everyone uses (0).
    """

    def __init__(self, index: int, size: int, directory: str | Path, *, period: float = 0.02,
                 scrape_owner: int = 0, metrics_period: float = 1.0) -> None:
        if not 0 <= index < size:
            raise ValueError(f"worker index {index} out of range for {size} workers")
        self.index, self.size, self.directory, self.period = index, size, Path(directory), period
        self.scrape_owner = scrape_owner
        self.metrics_period = metrics_period
        self.datastore: Datastore | None = None
        self._families: dict[str, Family] = {}
        self._metrics_due = 0.0
        self._indexes: list[SharedBlockIndex] = []
        self._loads: dict[str, SharedLoad] = {}  # by plugin name, the same in every worker (one config)
        self._load_due = False  # a publication of the bookings is scheduled for this loop iteration
        self._peers = [str(self.directory / f"w{i}.sock") for i in range(size) if i != index]
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._remote: dict[tuple[int, str], tuple[Endpoint, int, int]] = {}
        self._prefix_out: list[bytes] = []
        self._prefix_size = 0
        self._published: dict[str, object] = {}
        self._owner_states: dict[str, tuple[Any, bool, int]] = {}  # the scrape owner's latest, by endpoint name
        self.dropped = 0

    # -- wiring ---------------------------------------------------------------------------------------------

    def attach(self, director: Director, families: Iterable[Family] = ()) -> None:
        """Share ``director``'s in-flight counts, prefix index and (from the scrape owner) endpoint metrics, and
        report its request metrics and ``families`` (e.g. the ext_proc stream metrics) to the scrape owner."""
        self.datastore = director.datastore
        request_families = getattr(director.metrics, "families", None)
        self._families = {family.name: family for family in (*(request_families() if request_families else ()),
                                                              *families)}
        for plugin in director.pipeline.handle.plugins():
            if isinstance(plugin, SharedBlockIndex):
                plugin.on_blocks_added(self._on_blocks_added)
                self._indexes.append(plugin)
            if isinstance(plugin, SharedLoad):
                plugin.on_load_changed(self._on_load_changed)
                self._loads[plugin.name] = plugin
        if self.index != self.scrape_owner:
            self._adopt(self.datastore.endpoints())
            self.datastore.subscribe(self._on_change)

    def _on_change(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        for endpoint in removed:
            if self.datastore is not None and self.datastore.get(endpoint.name) is None:
                self._owner_states.pop(endpoint.name, None)
        self._adopt(added)

    def _adopt(self, endpoints: list[Endpoint]) -> None:
        """Endpoints this worker discovered take the scrape owner's latest state for them, or start unhealthy
        until it arrives (as the owner's own scraper starts them): never healthy with metrics nobody scraped."""
        for endpoint in endpoints:
            state = self._owner_states.get(endpoint.name)
            if state is None:
                endpoint.healthy = False
            else:
                endpoint.metrics, endpoint.healthy, endpoint.scrape_failures = state

    def _on_load_changed(self) -> None:
        # Soon, not at the next period: two workers routing within one period would each miss the other's
        # booking, which cost the cost model most of its TTFT lead on shared-prefix (docs/routing.md).
        if not self._load_due and self._sock is not None:
            self._load_due = True
            asyncio.get_running_loop().call_later(LOAD_DELAY, self._publish_loads)

    def _publish_loads(self) -> None:
        self._load_due = False
        self._send(_LOAD + pickle.dumps((self.index, {name: plugin.local_load()
                                                      for name, plugin in self._loads.items()}), protocol=5))

    def _on_blocks_added(self, hashes: list[int], endpoint: Endpoint) -> None:
        self._queue_prefix(endpoint.name, hashes)

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind this worker's socket and start publishing (call after :meth:`attach`)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.directory / f"w{self.index}.sock"
        path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind(str(path))
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._receive)
        self._task = asyncio.create_task(self._publish_loop(), name=f"epp-peer-link-{self.index}")

    async def stop(self) -> None:
        """Stop publishing and close the socket."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            (self.directory / f"w{self.index}.sock").unlink(missing_ok=True)

    # -- sending --------------------------------------------------------------------------------------------

    def _send(self, data: bytes, peers: list[str] | None = None) -> None:
        sock = self._sock
        if sock is None:
            return
        for peer in self._peers if peers is None else peers:
            try:
                sock.sendto(data, peer)
            except (FileNotFoundError, ConnectionRefusedError):
                pass  # that worker is not up (yet, or any more)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.ENOBUFS):
                    raise
                self.dropped += 1

    def _queue_prefix(self, name: str, hashes: list[int]) -> None:
        raw = name.encode()
        entry = _HEADER.pack(len(raw), len(hashes)) + raw + array("Q", hashes).tobytes()
        if self._prefix_size + len(entry) > _MAX_DATAGRAM:
            self._flush_prefix()
        if not self._prefix_out:
            asyncio.get_running_loop().call_soon(self._flush_prefix)
        self._prefix_out.append(entry)
        self._prefix_size += len(entry)

    def _flush_prefix(self) -> None:
        if self._prefix_out:
            self._send(_PREFIX + b"".join(self._prefix_out))
            self._prefix_out = []
            self._prefix_size = 0

    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self._publish_inflight()
            if self._loads:
                self._publish_loads()
            if self.index == self.scrape_owner:
                self._publish_metrics()
            elif self._families and time.monotonic() >= self._metrics_due:
                self._metrics_due = time.monotonic() + self.metrics_period
                self._publish_families()

    def _local_counts(self) -> dict[str, tuple[int, int]]:
        """This worker's own in-flight counts: the endpoint counters minus what peers contributed."""
        assert self.datastore is not None
        remote_req: dict[str, int] = {}
        remote_tok: dict[str, int] = {}
        for (_, name), (ep, req, tok) in self._remote.items():
            if self.datastore.get(name) is ep:
                remote_req[name] = remote_req.get(name, 0) + req
                remote_tok[name] = remote_tok.get(name, 0) + tok
        return {ep.name: (max(0, ep.inflight_requests - remote_req.get(ep.name, 0)),
                          max(0, ep.inflight_tokens - remote_tok.get(ep.name, 0)))
                for ep in self.datastore.endpoints()}

    def _publish_inflight(self) -> None:
        self._send(_INFLIGHT + pickle.dumps((self.index, self._local_counts()), protocol=5))

    def _publish_metrics(self) -> None:
        assert self.datastore is not None
        changed = {}
        for ep in self.datastore.endpoints():
            state = (ep.metrics, ep.healthy, ep.scrape_failures)
            if self._published.get(ep.name) != state:
                self._published[ep.name] = state
                changed[ep.name] = state
        if changed:
            self._send(_METRICS + pickle.dumps(changed, protocol=5))

    def _publish_families(self) -> None:
        """Send the scrape owner (which serves ``/metrics``) this worker's request-metric totals, in datagrams
        under the size limit."""
        owner = [str(self.directory / f"w{self.scrape_owner}.sock")]
        for name, family in self._families.items():
            pending = [family.snapshot()]
            while pending:
                entries = pending.pop()
                data = _FAMILIES + pickle.dumps((self.index, name, entries), protocol=5)
                if len(data) <= _MAX_DATAGRAM or len(entries) < 2:
                    self._send(data, owner)
                else:
                    half = len(entries) // 2
                    pending += [entries[:half], entries[half:]]

    def _apply_families(self, peer: int, name: str, entries: list[tuple[tuple[str, ...], Any]]) -> None:
        family = self._families.get(name)
        if family is not None:
            family.merge_peer(peer, entries)

    # -- receiving ------------------------------------------------------------------------------------------

    def _receive(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                data = sock.recv(1 << 20)
            except BlockingIOError:
                return
            kind, payload = data[:1], data[1:]
            try:
                if kind == _PREFIX:
                    self._apply_prefix(payload)
                elif kind == _INFLIGHT:
                    self._apply_inflight(*pickle.loads(payload))
                elif kind == _LOAD:
                    self._apply_load(*pickle.loads(payload))
                elif kind == _METRICS:
                    self._apply_metrics(pickle.loads(payload))
                elif kind == _FAMILIES:
                    self._apply_families(*pickle.loads(payload))
            except Exception:  # a malformed message must not stop the link
                log.exception("bad message from a peer worker")

    def _apply_prefix(self, payload: bytes) -> None:
        assert self.datastore is not None
        at, n = 0, len(payload)
        while at < n:
            name_len, count = _HEADER.unpack_from(payload, at)
            at += _HEADER.size
            name = payload[at:at + name_len].decode()
            at += name_len
            hashes = array("Q")
            hashes.frombytes(payload[at:at + 8 * count])
            at += 8 * count
            endpoint = self.datastore.get(name)
            if endpoint is not None:
                for index in self._indexes:
                    index.add_peer_blocks(hashes.tolist(), endpoint)

    def _apply_load(self, peer: int, loads: dict[str, dict[str, tuple[float, ...]]]) -> None:
        if peer == self.index or not 0 <= peer < self.size:  # each plugin keeps one entry per real peer, no more
            return
        for name, load in loads.items():
            plugin = self._loads.get(name)
            if plugin is not None:
                plugin.set_peer_load(peer, load)

    def _apply_inflight(self, peer: int, counts: dict[str, tuple[int, int]]) -> None:
        assert self.datastore is not None
        seen = set()
        for name, (req, tok) in counts.items():
            seen.add(name)
            self._set_remote(peer, name, req, tok)
        for key in [k for k in self._remote if k[0] == peer and k[1] not in seen]:
            self._set_remote(peer, key[1], 0, 0)
            del self._remote[key]

    def _set_remote(self, peer: int, name: str, req: int, tok: int) -> None:
        assert self.datastore is not None
        endpoint = self.datastore.get(name)
        if endpoint is None:
            return
        key = (peer, name)
        old = self._remote.get(key)
        old_req, old_tok = (old[1], old[2]) if old is not None and old[0] is endpoint else (0, 0)
        endpoint.inflight_requests = max(0, endpoint.inflight_requests + req - old_req)
        endpoint.inflight_tokens = max(0, endpoint.inflight_tokens + tok - old_tok)
        self._remote[key] = (endpoint, req, tok)

    def _apply_metrics(self, changed: dict[str, tuple[Any, bool, int]]) -> None:
        assert self.datastore is not None
        self._owner_states.update(changed)  # kept for endpoints this worker has not discovered yet
        for name, (metrics, healthy, failures) in changed.items():
            endpoint = self.datastore.get(name)
            if endpoint is not None:
                endpoint.metrics = metrics
                endpoint.healthy = healthy
                endpoint.scrape_failures = failures


def die_with_parent() -> None:
    """In a worker (or, as ``preexec_fn``, a child about to exec): get SIGTERM when the parent process dies (Linux
    ``PR_SET_PDEATHSIG``), so a parent killed with SIGKILL leaves no worker serving and holding its ports; a
    worker exits at once if the parent is already gone. A no-op where ``prctl`` is not available."""
    parent = multiprocessing.parent_process()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        return
    if parent is not None and parent.pid is not None and os.getppid() != parent.pid:
        os._exit(1)  # the parent died before the death signal was armed


def run_workers(size: int, target: Callable[..., None], *args: Any, directory: str | Path | None = None) -> int:
    """Run ``target(index, size, directory, *args)`` in ``size`` spawned processes until they all exit.

    ``target`` must be a module-level function (it is pickled); it builds and runs one EPP, creating a
    :class:`PeerLink` from its arguments. SIGINT/SIGTERM are forwarded to every worker; a worker that fails
    stops the others. Returns the first failing worker's exit code, else 0.
    """
    if size < 1:
        raise ValueError("need at least one worker")
    ctx = multiprocessing.get_context("spawn")
    owned = directory is None
    path = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="epp-workers-"))
    procs = [ctx.Process(target=target, args=(i, size, str(path), *args), name=f"epp-worker-{i}")
             for i in range(size)]
    for proc in procs:
        proc.start()

    def forward(signum: int, frame: object) -> None:
        for proc in procs:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = _join_all(procs)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if owned:
            for leftover in path.glob("w*.sock"):
                leftover.unlink(missing_ok=True)
            path.rmdir()
    return code


def _join_all(procs: list[Any]) -> int:
    """Wait for every worker; the first non-zero exit code (0 if none). When one fails (e.g. it could not bind
    its port), the others are stopped rather than left serving as a partial set."""
    running, code = list(procs), 0
    while running:
        multiprocessing.connection.wait([p.sentinel for p in running])
        for proc in [p for p in running if not p.is_alive()]:
            running.remove(proc)
            proc.join()
            if proc.exitcode and not code:
                code = proc.exitcode
                for other in running:
                    other.terminate()
    return code
