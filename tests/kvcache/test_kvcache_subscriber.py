"""KV-event subscribers against real ZMQ PUB sockets on 127.0.0.1 (both connect and bind mode)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
import zmq
import zmq.asyncio

from epp.kvcache import KVEventSubscribers

TOPIC = b"kv@10.0.0.1:8000@sim-model"
Message = tuple[str, bytes, "str | None"]


class Publisher:
    """A ZMQ PUB socket sending vLLM's three-frame messages, bound on a free port or connected to one."""

    def __init__(self, ctx: zmq.asyncio.Context, connect: str | None = None) -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.seq = 0
        if connect is None:
            self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        else:
            self.sock.connect(connect)
            self.endpoint = connect

    async def send(self, payload: bytes, topic: bytes = TOPIC) -> None:
        await self.sock.send_multipart([topic, self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    async def send_frames(self, frames: list[bytes]) -> None:
        await self.sock.send_multipart(frames)

    def close(self) -> None:
        self.sock.close(linger=0)


class Recorder:
    """A subscriber handler that records what it is given and can wait for it."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.arrived = asyncio.Event()

    def __call__(self, topic: str, payload: bytes, owner: str | None) -> None:
        self.messages.append((topic, payload, owner))
        self.arrived.set()

    def payloads(self) -> list[bytes]:
        return [m[1] for m in self.messages]

    async def received(self, payload: bytes) -> None:
        while payload not in self.payloads():
            self.arrived.clear()
            await self.arrived.wait()


@pytest.fixture
def ctx() -> Iterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.term()


@pytest.fixture
async def publishers(ctx: zmq.asyncio.Context) -> AsyncIterator[list[Publisher]]:
    pubs: list[Publisher] = []
    yield pubs
    for pub in pubs:
        pub.close()


async def joined(pub: Publisher, rec: Recorder) -> None:
    """Publish until the subscription is up (ZMQ's slow joiner drops messages sent before it)."""
    async with asyncio.timeout(60):
        while not rec.messages:
            await pub.send(b"hello")
            await asyncio.sleep(0.01)


def running(name: str) -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == f"kv-events:{name}"]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_connect_mode_delivers_topic_payload_and_owner(ctx: zmq.asyncio.Context,
                                                             publishers: list[Publisher]) -> None:
    pub = Publisher(ctx)
    publishers.append(pub)
    rec = Recorder()
    subs = KVEventSubscribers(rec)
    try:
        subs.ensure("pod-a", pub.endpoint, owner="10.0.0.1:8000")
        assert subs.keys() == ["pod-a"] and subs.address("pod-a") == pub.endpoint
        await joined(pub, rec)
        await pub.send(b"not for us", topic=b"other@10.0.0.1:8000@sim-model")
        await pub.send(b"\x81\xa2ts\x01")
        await rec.received(b"\x81\xa2ts\x01")
        assert rec.messages[-1] == (TOPIC.decode(), b"\x81\xa2ts\x01", "10.0.0.1:8000")
        assert all(topic.startswith("kv@") for topic, _, _ in rec.messages)
        assert subs.malformed == 0
    finally:
        await subs.close()


async def test_bind_mode_delivers_with_no_owner(ctx: zmq.asyncio.Context, publishers: list[Publisher],
                                                unused_tcp_port: int) -> None:
    rec = Recorder()
    subs = KVEventSubscribers(rec, retry_interval=0.05)
    address = f"tcp://127.0.0.1:{unused_tcp_port}"
    try:
        subs.ensure("global", address, bind=True)
        pub = Publisher(ctx, connect=address)
        publishers.append(pub)
        await joined(pub, rec)
        await pub.send(b"payload")
        await rec.received(b"payload")
        assert rec.messages[-1] == (TOPIC.decode(), b"payload", None)
    finally:
        await subs.close()
    # close() waited for the socket to close: the address is free again.
    again = ctx.socket(zmq.SUB)
    again.bind(address)
    again.close(linger=0)


async def test_malformed_messages_are_counted_and_skipped(ctx: zmq.asyncio.Context,
                                                         publishers: list[Publisher]) -> None:
    pub = Publisher(ctx)
    publishers.append(pub)
    rec = Recorder()
    subs = KVEventSubscribers(rec)
    try:
        subs.ensure("pod-a", pub.endpoint)
        await joined(pub, rec)
        before = len(rec.messages)
        await pub.send_frames([TOPIC, b"payload"])  # two frames
        await pub.send_frames([TOPIC, b"\x00\x01", b"payload"])  # a short sequence number
        await pub.send_frames([TOPIC, bytes(8), b"p", b"extra"])  # four frames
        await pub.send(b"good")
        await rec.received(b"good")
        assert rec.payloads()[before:] == [b"good"]
        assert subs.malformed == 3
    finally:
        await subs.close()


async def test_a_failing_handler_does_not_stop_the_socket(ctx: zmq.asyncio.Context, publishers: list[Publisher],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    pub = Publisher(ctx)
    publishers.append(pub)
    rec = Recorder()

    def handler(topic: str, payload: bytes, owner: str | None) -> None:
        if payload == b"boom":
            raise RuntimeError("handler bug")
        rec(topic, payload, owner)

    subs = KVEventSubscribers(handler)
    try:
        subs.ensure("pod-a", pub.endpoint, owner="pod-a")
        await joined(pub, rec)
        with caplog.at_level(logging.ERROR, logger="epp.kvcache.subscriber"):
            await pub.send(b"boom")
            await pub.send(b"after")
            await rec.received(b"after")
        assert b"boom" not in rec.payloads()
        assert "handling a message from pod-a failed" in caplog.text
        assert "handler bug" in caplog.text
        assert running("pod-a")
    finally:
        await subs.close()


async def test_ensure_is_idempotent_and_replaces_a_changed_address(ctx: zmq.asyncio.Context,
                                                                   publishers: list[Publisher]) -> None:
    first, second = Publisher(ctx), Publisher(ctx)
    publishers += [first, second]
    rec = Recorder()
    subs = KVEventSubscribers(rec)
    try:
        subs.ensure("pod-a", first.endpoint)
        task = running("pod-a")
        subs.ensure("pod-a", first.endpoint)
        assert running("pod-a") == task
        subs.ensure("pod-a", second.endpoint)
        assert subs.address("pod-a") == second.endpoint
        await joined(second, rec)
        await second.send(b"from second")
        await rec.received(b"from second")
        await settle()
        assert len(running("pod-a")) == 1 and running("pod-a") != task
    finally:
        await subs.close()


async def test_remove_and_close_stop_the_tasks(ctx: zmq.asyncio.Context, publishers: list[Publisher]) -> None:
    pub = Publisher(ctx)
    publishers.append(pub)
    rec = Recorder()
    subs = KVEventSubscribers(rec)
    subs.ensure("pod-a", pub.endpoint)
    subs.ensure("pod-b", pub.endpoint)
    await joined(pub, rec)
    assert running("pod-a") and running("pod-b")
    subs.remove("pod-a")
    subs.remove("pod-unknown")
    await settle()
    assert not running("pod-a") and running("pod-b")
    assert subs.keys() == ["pod-b"] and subs.address("pod-a") is None
    await subs.close()
    assert not running("pod-b") and subs.keys() == []


async def test_a_bind_that_fails_is_retried(ctx: zmq.asyncio.Context, publishers: list[Publisher],
                                            unused_tcp_port: int, caplog: pytest.LogCaptureFixture) -> None:
    address = f"tcp://127.0.0.1:{unused_tcp_port}"
    # A SUB holds the port: a publisher that reaches it while it closes completes a valid handshake and reconnects
    # (against another PUB the handshake would fail and libzmq may stop reconnecting).
    squatter = ctx.socket(zmq.SUB)
    squatter.bind(address)
    rec = Recorder()
    subs = KVEventSubscribers(rec, retry_interval=0.02)
    try:
        with caplog.at_level(logging.ERROR, logger="epp.kvcache.subscriber"):
            subs.ensure("global", address, bind=True)
            async with asyncio.timeout(60):
                while "cannot bind" not in caplog.text:
                    await asyncio.sleep(0.01)
        assert running("global")
        squatter.close(linger=0)
        pub = Publisher(ctx, connect=address)
        publishers.append(pub)
        await joined(pub, rec)
        assert rec.messages[0] == (TOPIC.decode(), b"hello", None)
    finally:
        squatter.close(linger=0)
        await subs.close()
