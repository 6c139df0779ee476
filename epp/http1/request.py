"""HTTP/1.1 request parsing on llhttp (``httptools``, no leniencies) for the gateway's own server; no I/O.

:class:`RequestParser` takes a connection's bytes split anywhere (:meth:`~RequestParser.feed`) and hands out its
complete requests in order (:meth:`~RequestParser.take`); each byte goes through llhttp once and a body is kept
as its pieces until it is complete. llhttp's strict grammar decides what is malformed (request line, header
names and values, framing, chunk lines, trailers); on top of it EPP accepts only HTTP/1.0 and 1.1, origin- or
absolute-form targets, exactly one ``Host`` in 1.1 (at most one in 1.0), and ``Transfer-Encoding`` of exactly
``chunked`` in 1.1. ``Upgrade`` is ignored (RFC 9110 §7.8): the request is served as plain HTTP/1.1. Errors
are EPP errors raised by ``feed``, after which the parser takes nothing more: ``BadRequest`` (400),
``PayloadTooLarge`` (413: a ``Content-Length`` over the limit before any body byte, a chunked body once past
it), ``NotImplementedByEpp`` (501: codings before ``chunked``). Of a repeated header the last value is kept,
except ``Transfer-Encoding``, whose lines form one list. The routing path is percent-decoded as UTF-8 with
invalid bytes replaced; the raw target is kept as received.
"""

from __future__ import annotations

from collections import deque
from urllib.parse import unquote

import httptools

from epp.errors import BadRequest, EppError, NotImplementedByEpp, PayloadTooLarge

__all__ = ["UNSUPPORTED_VERSION", "Request", "RequestParser", "check_transfer_encoding", "request_target"]

UNSUPPORTED_VERSION = "unsupported HTTP version (HTTP/1.0 and HTTP/1.1 are served)"

_OWS = (0x20, 0x09)
_NAMES: dict[bytes, str] = {}
"""Header names seen, as the lower-case text used for them (bounded by :data:`_NAMES_MAX`): most requests repeat a
few spellings, and a lookup costs less than decoding."""
_NAMES_MAX = 512
_METHODS = {m.encode(): m for m in ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH")}

_REQUEST_COST = 1024
"""Bytes a parsed request counts for in :attr:`RequestParser.held` besides its head and body (its objects), so that
many tiny pipelined requests weigh what they cost."""


class Request:
    """One request: its head once parsed, its ``body`` once complete."""

    __slots__ = ("body", "expect", "headers", "held", "keep_alive", "method", "parts", "path", "raw_path", "size",
                 "v11")

    def __init__(self, method: str, raw_path: str, path: str, v11: bool, headers: dict[str, str],
                 keep_alive: bool) -> None:
        self.method = method
        self.raw_path = raw_path
        self.path = path
        self.v11 = v11
        self.headers = headers
        self.keep_alive = keep_alive
        self.expect = False  # the client waits for "100 Continue" before it sends the body
        self.parts: list[bytes] = []
        self.size = 0
        self.held = 0
        self.body = b""


class RequestParser:
    """The requests of one connection (see the module docstring). ``body_limit`` bounds a body, ``max_head`` a
    head (request target and fields), a trailer section, and the bytes fed without completing any element."""

    __slots__ = ("_delivered", "_error", "_head_bytes", "_headers", "_parser", "_quiet", "_skip_head",
                 "_upgrade_framing", "_url", "body_limit", "current", "held", "in_head", "max_head", "ready")

    def __init__(self, body_limit: int, max_head: int) -> None:
        self.body_limit = body_limit
        self.max_head = max_head
        self.ready: deque[Request] = deque()
        self.current: Request | None = None
        """The request whose head is complete and whose body is still arriving."""
        self.in_head = False
        """A request head has begun and is not complete."""
        self.held = 0
        """Bytes held for requests not yet taken (heads, bodies, :data:`_REQUEST_COST` each)."""
        self._parser = httptools.HttpRequestParser(self)
        self._url: list[bytes] = []
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._quiet = 0
        self._delivered = False
        self._error: EppError | None = None
        self._upgrade_framing: bytes | None = None
        self._skip_head = False

    def feed(self, data: bytes) -> None:
        """Parse ``data``; complete requests go to :meth:`take`. Raises the request's ``EppError``."""
        if self._error is not None:
            raise self._error
        self._delivered = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._after_upgrade(data[upgrade.args[0]:])
        except httptools.HttpParserError as exc:
            raise self._error or self._fail(BadRequest(f"malformed HTTP request ({exc})")) from None
        # httptools joins a field split over many reads internally: bound the bytes fed while nothing completes
        if self._delivered:
            self._quiet = 0
        else:
            self._quiet += len(data)
            if self._quiet > self.max_head:
                raise self._fail(BadRequest(f"request head, header line or chunk framing larger than "
                                            f"{self.max_head} bytes"))

    def take(self) -> Request | None:
        """The next complete request, in arrival order, or None."""
        if not self.ready:
            return None
        req = self.ready.popleft()
        self.held -= req.held
        return req

    def discard(self) -> None:
        """Drop every request and partial element held, so ``held`` is 0 (the connection refused its input and
        parses nothing more)."""
        self.ready.clear()
        self.current = None
        self.in_head = False
        self.held = 0
        self._url = []
        self._headers = {}

    def error_path(self) -> str:
        """The path of the request that failed (or is being parsed), as far as it was received; "" if none."""
        if self.current is not None:
            return self.current.path
        try:
            return request_target(b"".join(self._url).decode("latin-1"))[1]
        except BadRequest:
            return ""

    # -- llhttp callbacks (httptools calls them by name) -------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = []
        self._headers = {}
        if self._skip_head:
            return  # _after_upgrade's framing head: its target and fields go to the lists just dropped
        self.in_head = True
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url.append(url)  # llhttp hands the target over in pieces when it spans reads
        self._delivered = True
        self._head_bytes += len(url)
        if self._head_bytes > self.max_head:
            self._too_large()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._delivered = True
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self.max_head:
            self._too_large()
        if not self.in_head:
            return  # a trailer field (or one of _after_upgrade's framing head): counted, ignored
        key = _NAMES.get(name)
        if key is None:
            key = _header_name(name)
        if value and value[-1] in _OWS:  # llhttp skipped the leading whitespace, not the trailing
            value = value.rstrip(b" \t")
        try:
            val = value.decode()
        except UnicodeDecodeError:  # obs-text: kept as surrogates, so that it is forwarded as received
            val = value.decode("utf-8", "surrogateescape")
        headers = self._headers
        if key in headers:
            self._repeat(key, val)
        else:
            headers[key] = val

    def on_headers_complete(self) -> None:
        self._delivered = True
        if self._skip_head:
            self._skip_head = False
            return
        self.in_head = False
        req = self._request()
        self.current = req
        req.held = self._head_bytes + _REQUEST_COST
        self.held += req.held
        self._head_bytes = 0  # from here on it counts the trailer section
        headers = req.headers
        if req.v11 and "host" not in headers:
            raise self._fail(BadRequest("HTTP/1.1 request without a Host header"))  # RFC 9112 §3.2
        te = headers.get("transfer-encoding")
        if te is not None:
            # llhttp already refused Transfer-Encoding with Content-Length, and chunked that is not final
            try:
                check_transfer_encoding(te, v11=req.v11, has_length=False)
            except EppError as err:
                raise self._fail(err) from None
            framing = b"Transfer-Encoding: chunked"
        else:
            size = int(headers.get("content-length") or 0)  # llhttp checked it is digits, and only one
            if size > self.body_limit:
                raise self._fail(PayloadTooLarge(f"request body of {size} bytes exceeds the limit of "
                                                 f"{self.body_limit}"))
            framing = b"Content-Length: %d" % size if size else b""
        # HTTP/1.0 clients cannot ask for 100 Continue (RFC 9110 §10.1.1): the expectation is ignored.
        req.expect = req.v11 and bool(framing) and headers.get("expect", "").lower() == "100-continue"
        if framing and self._parser.should_upgrade():
            self._upgrade_framing = framing  # llhttp stops before the body of an upgrade: see _after_upgrade

    def on_body(self, body: bytes) -> None:
        self._delivered = True
        req = self.current
        assert req is not None  # llhttp calls on_body only after on_headers_complete set it
        req.parts.append(body)
        req.size += len(body)
        req.held += len(body)
        self.held += len(body)
        if req.size > self.body_limit:  # only a chunked body gets here: a Content-Length was checked
            raise self._fail(PayloadTooLarge(f"request body exceeds the limit of {self.body_limit} bytes"))

    def on_message_complete(self) -> None:
        self._delivered = True
        if self._upgrade_framing is not None:
            return  # the body is still to come (_after_upgrade)
        req = self.current
        assert req is not None  # llhttp completes only a message whose head it delivered
        self.current = None
        parts = req.parts
        req.body = parts[0] if len(parts) == 1 else b"".join(parts)
        req.parts = []
        self.ready.append(req)

    # -- helpers -----------------------------------------------------------------------------------------------

    def _request(self) -> Request:
        """The request of the head just parsed (its version and target checked)."""
        parser = self._parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise self._fail(BadRequest(UNSUPPORTED_VERSION))
        url = self._url[0] if len(self._url) == 1 else b"".join(self._url)
        try:
            raw_path, path = request_target(url.decode("latin-1"))  # llhttp let only ASCII through
        except BadRequest as err:
            raise self._fail(err) from None
        method = parser.get_method()
        return Request(_METHODS.get(method) or method.decode(), raw_path, path, version == "1.1", self._headers,
                       parser.should_keep_alive())

    def _too_large(self) -> None:
        raise self._fail(BadRequest(f"request head or trailer section larger than {self.max_head} bytes"))

    def _repeat(self, key: str, value: str) -> None:
        """A header seen before: a second ``Host`` is an error (RFC 9112 §3.2); ``Transfer-Encoding`` lines form
        one list (RFC 9110 §5.3), so that no coding hides in an earlier line; otherwise the last value wins."""
        if key == "host":
            raise self._fail(BadRequest("more than one Host header"))
        if key == "transfer-encoding":
            value = f"{self._headers[key]}, {value}"
        self._headers[key] = value

    def _after_upgrade(self, rest: bytes) -> None:
        """llhttp paused at the end of an ``Upgrade`` request's head; EPP ignores the upgrade. A new parser goes
        on with ``rest``; when the request has a body, the new parser first reads that body, framed as the head
        announced it (a framing-only head is fed to it, whose callbacks are skipped)."""
        self._parser = httptools.HttpRequestParser(self)
        framing, self._upgrade_framing = self._upgrade_framing, None
        if framing is not None:
            self._skip_head = True
            self._parser.feed_data(b"POST / HTTP/1.1\r\n%b\r\n\r\n" % framing)
        if rest:
            self.feed(rest)

    def _fail(self, err: EppError) -> EppError:
        self._error = err
        return err


def _header_name(name: bytes) -> str:
    """``name`` as lower-case text (llhttp let only token characters, all ASCII, through), remembered."""
    key = name.lower().decode()
    if len(_NAMES) < _NAMES_MAX:
        _NAMES[name] = key
    return key


def check_transfer_encoding(te: str, *, v11: bool, has_length: bool) -> None:
    """Pass a request's ``Transfer-Encoding`` (its lines joined with commas) that is exactly ``chunked`` in HTTP/1.1
    without ``Content-Length``; else raise its error: 400 in HTTP/1.0 or with ``Content-Length`` (the framing is
    faulty, RFC 9112 §6.1, §6.3), 400 when ``chunked`` is not the final coding once (the body's end cannot be
    found, RFC 9112 §6.3), else 501 (the codings before it are not implemented, RFC 9112 §6.1). Shared by both
    front ends."""
    if has_length or not v11:
        raise BadRequest("invalid Transfer-Encoding (HTTP/1.1 only, without Content-Length)")
    if te.lower() == "chunked":
        return
    codings = [c.strip(" \t").lower() for c in te.split(",")]
    if codings[-1] != "chunked" or "chunked" in codings[:-1]:
        raise BadRequest("invalid Transfer-Encoding: chunked must be the final coding, applied once")
    raise NotImplementedByEpp("Transfer-Encoding: codings other than chunked are not implemented")


def request_target(target: str) -> tuple[str, str]:
    """(raw path with query, percent-decoded path without query) of an origin- or absolute-form request target;
    ``BadRequest`` for another form."""
    if not target.startswith("/"):
        if target.startswith(("http://", "https://")):
            slash = target.find("/", target.index("//") + 2)
            target = target[slash:] if slash >= 0 else "/"
        else:
            raise BadRequest("malformed request target")
    path = target.partition("?")[0]
    if "%" in path:
        path = unquote(path, errors="replace")
    return target, path
