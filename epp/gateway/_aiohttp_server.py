"""aiohttp's server as the gateway's second front end: requests it refuses are answered in OpenAI error format, with
the statuses EPP's own server (``_frontend``) gives for the same bytes.

:class:`OpenAIErrorHandler` overrides aiohttp's ``RequestHandler.handle_error`` (where it answers a request it cannot
parse) and :class:`GatewaySite` listens with that handler as the protocol factory, as ``web.TCPSite`` does; the
runner's graceful shutdown is unchanged and nothing in aiohttp is patched. Heads aiohttp accepts but EPP's own server
refuses are found by :func:`refusal` and answered first by the app's handlers. The remaining differences are listed
in docs/gateway.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion10, HttpVersion11
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from epp.errors import (
    BadRequest,
    EppError,
    InternalError,
    NotImplementedByEpp,
    PayloadTooLarge,
    UpstreamTimeout,
    error_body,
)
from epp.framework.request import is_messages_path
from epp.gateway._h1request import UNSUPPORTED_VERSION, check_transfer_encoding

__all__ = ["GatewaySite", "OpenAIErrorHandler", "closing_error_response", "refusal"]

_ERROR_BY_STATUS: Mapping[int, type[EppError]] = MappingProxyType({
    400: BadRequest, 413: PayloadTooLarge, 501: NotImplementedByEpp, 504: UpstreamTimeout})
_MAX_DETAIL = 120  # characters of aiohttp's own description kept in the message (it may quote the request)


def closing_error_response(err: EppError, *, anthropic: bool = False) -> web.Response:
    """``err`` as a JSON error response (Anthropic's envelope when ``anthropic``, else OpenAI's) after which
    aiohttp closes the connection (as EPP's own server does after refusing a request)."""
    resp = web.Response(status=err.status, body=error_body(err, anthropic=anthropic), content_type="application/json")
    resp.force_close()
    return resp


def refusal(request: web.BaseRequest) -> EppError | None:
    """The error EPP's own server gives for this request's head where aiohttp's parser accepted it, else None:
    an HTTP version other than 1.0 and 1.1 (400), and a ``Transfer-Encoding`` in HTTP/1.0 (400) or with codings
    other than ``chunked`` (501; aiohttp would pass, say, a gzip-coded body on undecoded)."""
    version = request.version
    if version != HttpVersion11 and version != HttpVersion10:
        return BadRequest(UNSUPPORTED_VERSION)
    te = request.headers.get("Transfer-Encoding")
    if te is None:
        return None
    try:
        check_transfer_encoding(te, v11=version == HttpVersion11, has_length="Content-Length" in request.headers)
    except EppError as err:
        return err
    return None


class OpenAIErrorHandler(web.RequestHandler):
    """aiohttp's per-connection protocol, answering its own errors in OpenAI format.

    Contract of :meth:`handle_error` (called by aiohttp for a request it could not parse, status 400, and for a
    handler that raised, 500, or timed out, 504): returns a JSON error response with the status EPP's error table
    gives (400 ``BadRequest``, 500 ``InternalError``, ...) and closes the connection after it. Parse errors are
    the client's and logged at debug level (EPP's own server does not log them); handler failures are logged
    with their traceback, as aiohttp does.
    """

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        err = _error_for(status, exc, message)
        if err.status >= 500:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
        else:
            self.log_debug("Refused a request from %s: %s", request.remote, err.message)
        if request.writer.output_size > 0:  # as aiohttp: a response already started cannot become an error
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        return closing_error_response(err, anthropic=is_messages_path(request.path))


def _error_for(status: int, exc: BaseException | None, message: str | None) -> EppError:
    """The EPP error for an aiohttp error answer of ``status``."""
    kind = _ERROR_BY_STATUS.get(status, InternalError if status >= 500 else BadRequest)
    if kind is InternalError:
        return InternalError("internal error")
    if kind is UpstreamTimeout:
        return UpstreamTimeout("the request timed out")
    return kind(_describe(exc, message))


def _describe(exc: BaseException | None, message: str | None) -> str:
    """A one-line message for a request aiohttp could not parse: the first line of its own description."""
    if isinstance(exc, LineTooLong):  # its description quotes the line
        return f"malformed HTTP request: a line of the head is longer than {exc.args[1]} bytes"
    text = exc.message if isinstance(exc, HttpProcessingError) else (message or "")
    detail = text.strip().partition("\n")[0].rstrip(":. ")[:_MAX_DETAIL]
    return f"malformed HTTP request: {detail}" if detail else "malformed HTTP request"


class GatewaySite(web.BaseSite):
    """A TCP site like ``web.TCPSite`` whose connections are served by :class:`OpenAIErrorHandler`, built with
    ``handler_args`` (``RequestHandler`` keyword arguments: keep-alive timeout, access log, field size limit).
    After :meth:`start`, :attr:`port` is the port listened on (useful with port 0)."""

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, *, handler_args: Mapping[str, Any],
                 backlog: int = 128, reuse_port: bool = False) -> None:
        super().__init__(runner, backlog=backlog)
        self.host = host
        self.port = port
        self.reuse_port = reuse_port
        self.handler_args = dict(handler_args)

    @property
    def name(self) -> str:
        return f"http://{self.host or '0.0.0.0'}:{self.port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        manager = self._runner.server
        assert manager is not None  # BaseSite refuses a runner that was not set up
        args = self.handler_args
        self._server = server = await loop.create_server(
            lambda: OpenAIErrorHandler(manager, loop=loop, **args), self.host or None, self.port, backlog=self._backlog,
            reuse_port=self.reuse_port or None)
        self.port = int(server.sockets[0].getsockname()[1])
