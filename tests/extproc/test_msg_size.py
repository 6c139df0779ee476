"""The ext_proc message size limits (``--grpc-max-recv-msg-size`` / ``--grpc-max-send-msg-size``): a message over
either ends its stream with RESOURCE_EXHAUSTED, on both transports, as grpc does; messages within them are served."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from epp.cli.main import build_parser
from epp.cli.reference_flags import reference_settings
from epp.cli.serve import options_from_args
from epp.config.units import FORMAT_ERROR, SUFFIX_ERROR, parse_size_flag
from epp.extproc.protocol import pb
from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions

from .helpers import CHAT, Client, make_director, request_body, request_headers, set_headers, specs

DESTINATION = "x-gateway-destination-endpoint"


async def _route(client: Client, body: bytes) -> pb.ProcessingResponse:
    """One chat request on a new stream: the routing reply (the call's error raised as ``AioRpcError``)."""
    call = client.open()
    await call.write(request_headers())
    await call.write(request_body(body))
    reply = await call.read()
    if reply is grpc.aio.EOF:
        await call  # raises the call's status
    call.cancel()
    return reply


async def test_a_received_message_over_the_limit_is_resource_exhausted(serve) -> None:
    _, client = await serve(make_director(specs(1)), max_recv_message=1024)
    big = CHAT.replace(b"hello there", b"x" * 2000)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _route(client, big)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    reply = await _route(client, CHAT)  # the limit ends that stream only
    assert set_headers(reply.request_headers.response)[DESTINATION] == "10.0.0.1:8000"


async def test_a_sent_message_over_the_limit_is_resource_exhausted(serve) -> None:
    director = make_director(specs(1))
    _, client = await serve(director, max_send_message=512)
    # In full-duplex mode EPP sends the request body back to Envoy after its routing reply: a 1,000-byte body
    # makes that reply exceed the send limit, while the routing reply itself fits.
    call = client.open()
    await call.write(request_headers())
    await call.write(request_body(CHAT.replace(b"hello there", b"x" * 1000)))
    head = await call.read()
    assert set_headers(head.request_headers.response)[DESTINATION] == "10.0.0.1:8000"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    endpoint = director.datastore.endpoints()[0]
    for _ in range(500):  # grpc.aio releases the stream's request just after the client saw the status
        if endpoint.inflight_requests == 0:
            break
        await asyncio.sleep(0.01)
    assert endpoint.inflight_requests == 0
    reply = await _route(client, CHAT)  # the limit ends that stream only
    assert set_headers(reply.request_headers.response)[DESTINATION] == "10.0.0.1:8000"


def test_the_flags_take_the_references_quantities() -> None:
    args = build_parser().parse_args(["serve", "--endpoints", "e.yaml", "--grpc-max-recv-msg-size", "10MiB",
                                      "--grpc-max-send-msg-size", "25MB"])
    options = options_from_args(args)
    assert (options.grpc_max_recv, options.grpc_max_send) == (10 * 1024 * 1024, 25_000_000)
    args = build_parser().parse_args(["serve", "--endpoints", "e.yaml", "--grpc-max-recv-msg-size", "0"])
    assert options_from_args(args).grpc_max_recv == 0  # 0: EPP's own limit, as grpc's default in the reference


@pytest.mark.parametrize(("text", "size"), [
    ("10MiB", 10 << 20), ("25MB", 25_000_000), ("4Ki", 4096), ("4194304", 4194304), (" 8Mi ", 8 << 20),
    ("1.5k", 1500), ("1e3", 1000), ("2Gb", 2_000_000_000), ("1Ti", 1 << 40), ("9E", 9 * 10**18), ("0", 0),
], ids=str)
def test_sizes_read_as_the_reference_reads_them(text: str, size: int) -> None:
    assert parse_size_flag("grpc-max-recv-msg-size", text) == size


@pytest.mark.parametrize(("text", "message"), [
    ("-1Mi", "must be non-negative, got -1048576"),
    ("10E", "overflows maximum supported size: 10E"),  # over 2**63 - 1
    ("1Ei", "overflows maximum supported size: 1Ei"),  # past ParseQuantity's int64 fast path, as in Go
    ("1.5", "overflows maximum supported size: 1.5"),  # not a whole number: AsInt64 refuses it
    ("500m", "overflows maximum supported size: 500m"),
    ("ten", FORMAT_ERROR), ("B", FORMAT_ERROR), ("", FORMAT_ERROR), ("1.2.3", FORMAT_ERROR),
    ("10Qi", FORMAT_ERROR), ("10K", SUFFIX_ERROR), ("1e+", SUFFIX_ERROR),
], ids=str)
def test_bad_sizes_get_the_references_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_size_flag("grpc-max-send-msg-size", text)
    assert str(err.value).endswith(message) and "grpc-max-send-msg-size" in str(err.value)


def test_a_bad_size_flag_stops_epp_serve_naming_the_flag() -> None:
    args = build_parser().parse_args(["serve", "--endpoints", "e.yaml", "--grpc-max-send-msg-size=-4Ki"])
    with pytest.raises(ValueError, match="--grpc-max-send-msg-size must be non-negative, got -4096"):
        reference_settings(args, log_level_given=False)


@pytest.mark.parametrize("transport", ["native", "grpcio"])
async def test_epp_serve_applies_the_flag_to_its_ext_proc_server(transport: str) -> None:
    options = ServeOptions(endpoints=[EndpointSpec(name="ep0", address="10.0.0.1", port=8000)], host="127.0.0.1",
                           grpc_port=0, health_port=None, metrics_port=None, plaintext=True,
                           extproc_transport=transport, grpc_max_recv=1024)
    app = EppApp(options)
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.extproc.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _route(Client(channel), CHAT.replace(b"hello there", b"x" * 2000))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await app.stop()
