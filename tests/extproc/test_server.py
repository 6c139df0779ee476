"""ExtProcServer around the protocol: health service names, TLS, graceful drain."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from epp._pb.grpc.health.v1 import health_pb2
from epp.extproc import ExtProcServer, TlsFiles
from epp.extproc.tls import self_signed

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


async def test_health_names_follow_the_reference_and_readiness_follows_sync(serve) -> None:
    director = make_director(specs(1), synced=False)
    server, _ = await serve(director)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
        check, watch = health_stubs(channel)

        async def status(name: str) -> int:
            return (await check(health_pb2.HealthCheckRequest(service=name))).status

        # Without leader election every name but liveness follows readiness, as in the reference: its Helm chart
        # probes a single replica with the service name "inference-extension".
        assert await status("liveness") == SERVING
        for name in ("readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "", "inference-extension"):
            assert await status(name) == NOT_SERVING
        assert await health_list(channel) == {"envoy.service.ext_proc.v3.ExternalProcessor": NOT_SERVING}
        updates = watch(health_pb2.HealthCheckRequest(service="readiness"))
        assert (await updates.read()).status == NOT_SERVING
        director.datastore.mark_synced()
        assert (await updates.read()).status == SERVING
        for name in ("readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "", "inference-extension"):
            assert await status(name) == SERVING
        assert await health_list(channel) == {"envoy.service.ext_proc.v3.ExternalProcessor": SERVING}
        director.datastore.mark_unsynced()  # the InferencePool was deleted
        assert (await updates.read()).status == NOT_SERVING
        assert await status("readiness") == NOT_SERVING and await status("liveness") == SERVING
        director.datastore.mark_synced()  # ... and is back
        assert (await updates.read()).status == SERVING
        server.health.set_draining()
        assert (await updates.read()).status == NOT_SERVING
        assert await status("readiness") == NOT_SERVING and await status("liveness") == SERVING
        other = watch(health_pb2.HealthCheckRequest(service="inference-extension"))
        assert (await other.read()).status == NOT_SERVING


async def test_tls_with_a_self_signed_certificate_generated_at_start(serve) -> None:
    server, _ = await serve(make_director(specs(1)), plaintext=False)
    assert server.key_pair is not None
    creds = grpc.ssl_channel_credentials(root_certificates=server.key_pair.cert_pem)
    async with grpc.aio.secure_channel(f"localhost:{server.port}", creds) as channel:
        replies = await Client(channel).exchange([request_headers(), request_body(CHAT)], 1)
    assert set_headers(replies[0].request_headers.response)["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as plain:
        with pytest.raises(grpc.aio.AioRpcError):
            await Client(plain).exchange([request_headers("/v1/models", eos=True)], 1)


async def test_tls_with_given_certificate_files(serve, tmp_path) -> None:
    pair = self_signed(["epp.test"])
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    server, _ = await serve(make_director(specs(1)), plaintext=False,
                            tls=TlsFiles(cert=tmp_path / "tls.crt", key=tmp_path / "tls.key"))
    creds = grpc.ssl_channel_credentials(root_certificates=pair.cert_pem)
    options = [("grpc.ssl_target_name_override", "epp.test")]
    async with grpc.aio.secure_channel(f"127.0.0.1:{server.port}", creds, options=options) as channel:
        replies = await Client(channel).exchange([request_headers("/v1/models", eos=True)], 1)
    assert replies[0].WhichOneof("response") == "request_headers"


async def test_graceful_stop_lets_a_running_stream_finish_and_refuses_new_ones(transport: str) -> None:
    director = make_director(specs(1))
    server = ExtProcServer(director, host="127.0.0.1", port=0, health_port=None, plaintext=True, transport=transport)
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        client = Client(channel)
        call = client.open()
        await call.write(request_headers())
        await call.write(request_body(CHAT[:5], eos=False))
        for _ in range(200):
            if server.active_streams == 1:
                break
            await asyncio.sleep(0.01)
        stopping = asyncio.create_task(server.stop(grace=30))
        await asyncio.sleep(0.05)
        await call.write(request_body(CHAT[5:], eos=True))
        head = await call.read()
        assert set_headers(head.request_headers.response)["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
        await call.read()
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        await stopping
        assert director.datastore.endpoints()[0].inflight_requests == 0
        with pytest.raises(grpc.aio.AioRpcError):
            await client.exchange([request_headers("/v1/models", eos=True)], 1)


def test_body_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ExtProcServer(make_director(specs(1)), body_limit=0)
