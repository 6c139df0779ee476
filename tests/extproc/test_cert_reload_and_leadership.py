"""``--enable-cert-reload`` (new handshakes get a certificate swapped on disk, on both transports) and the health
service's leader-election rules (``--ha-enable-leader-election``), as the reference's ``cmd/epp/runner/health.go``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from epp._pb.grpc.health.v1 import health_pb2
from epp.extproc import ExtProcServer, TlsFiles
from epp.extproc.health import HealthService
from epp.extproc.tls import CertWatcher, KeyPair, self_signed

from ..conftest import eventually
from .helpers import (
    CHAT,
    Client,
    health_list,
    health_stubs,
    make_director,
    request_body,
    request_headers,
    set_headers,
    specs,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


def write_pair(directory: Path, pair: KeyPair) -> TlsFiles:
    """Write ``pair`` as a Kubernetes Secret mount looks: files replaced atomically."""
    for name, data in (("tls.crt", pair.cert_pem), ("tls.key", pair.key_pem)):
        tmp = directory / f".{name}.tmp"
        tmp.write_bytes(data)
        tmp.replace(directory / name)
    return TlsFiles(directory / "tls.crt", directory / "tls.key")


async def pick(port: int, trusted: bytes) -> str:
    """One request over a fresh TLS connection that trusts only ``trusted``; the destination EPP picked."""
    creds = grpc.ssl_channel_credentials(root_certificates=trusted)
    async with grpc.aio.secure_channel(f"localhost:{port}", creds) as channel:
        replies = await asyncio.wait_for(Client(channel).exchange([request_headers(), request_body(CHAT)], 1), 10)
    return set_headers(replies[0].request_headers.response)["x-gateway-destination-endpoint"]


async def reloading_server(serve, directory: Path, pair: KeyPair) -> tuple[ExtProcServer, CertWatcher]:  # type: ignore[no-untyped-def]
    """A TLS server on ``pair`` (written to ``directory``) whose watcher polls every 50 ms."""
    server, _ = await serve(make_director(specs(1)), plaintext=False, tls=write_pair(directory, pair),
                            cert_reload=True)
    assert server.cert_watcher is not None
    server.cert_watcher.interval = 0.05
    return server, server.cert_watcher


async def test_a_certificate_replaced_on_disk_serves_new_connections(serve, tmp_path: Path) -> None:
    old, new = self_signed(), self_signed()
    server, watcher = await reloading_server(serve, tmp_path, old)
    assert await pick(server.port, old.cert_pem) == "10.0.0.1:8000"
    (tmp_path / "tls.key").write_bytes(b"half-written")  # a pair that does not load is skipped, not fatal
    write_pair(tmp_path, new)
    await eventually(lambda: watcher.reloads > 0, "the new certificate was not loaded")
    assert await pick(server.port, new.cert_pem) == "10.0.0.1:8000"
    with pytest.raises((grpc.aio.AioRpcError, asyncio.TimeoutError)):
        await pick(server.port, old.cert_pem)  # the old certificate is no longer presented


async def test_a_mismatched_pair_keeps_the_old_certificate(serve, tmp_path: Path) -> None:
    old, other = self_signed(), self_signed()
    server, watcher = await reloading_server(serve, tmp_path, old)
    write_pair(tmp_path, KeyPair(key_pem=other.key_pem, cert_pem=old.cert_pem + b"\n"))  # key of another cert
    stamp = watcher._stamp()
    await eventually(lambda: watcher._failed == stamp, "the watcher never looked at the changed files")
    assert watcher.reloads == 0
    assert await pick(server.port, old.cert_pem) == "10.0.0.1:8000"


class Leadership:
    """A leader flag with change notification (what :class:`epp.datalayer.leader.LeaderElector` offers)."""

    def __init__(self) -> None:
        self.is_leader = False
        self._event = asyncio.Event()

    def set(self, leader: bool) -> None:
        self.is_leader = leader
        self._event.set()
        self._event = asyncio.Event()

    async def changed(self) -> None:
        await self._event.wait()


async def test_with_leader_election_only_the_synced_leader_is_ready(serve) -> None:
    director = make_director(specs(1))
    leadership = Leadership()
    server, _ = await serve(director, health=HealthService(director.datastore, leadership))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
        check, watch = health_stubs(channel)

        async def status(name: str) -> int:
            return (await check(health_pb2.HealthCheckRequest(service=name))).status

        ready_names = ("readiness", "", "envoy.service.ext_proc.v3.ExternalProcessor")
        assert await status("liveness") == SERVING
        assert [await status(n) for n in ready_names] == [NOT_SERVING] * 3  # synced, but a follower
        assert await status("inference-extension") == SERVICE_UNKNOWN  # as the reference with leader election
        updates = watch(health_pb2.HealthCheckRequest(service="readiness"))
        assert (await updates.read()).status == NOT_SERVING
        leadership.set(True)
        assert (await updates.read()).status == SERVING
        assert [await status(n) for n in ready_names] == [SERVING] * 3
        assert await health_list(channel) == {"envoy.service.ext_proc.v3.ExternalProcessor": SERVING,
                                              "liveness": SERVING, "readiness": SERVING}
        director.datastore.mark_unsynced()  # leader, but the pool is gone
        assert (await updates.read()).status == NOT_SERVING
        director.datastore.mark_synced()
        assert (await updates.read()).status == SERVING
        leadership.set(False)  # the Lease was lost
        assert (await updates.read()).status == NOT_SERVING
        assert await health_list(channel) == {"envoy.service.ext_proc.v3.ExternalProcessor": NOT_SERVING,
                                              "liveness": SERVING, "readiness": NOT_SERVING}
        assert await status("liveness") == SERVING
