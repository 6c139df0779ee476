"""The shared test helpers of ``conftest.py``: ``eventually`` returns what held or names what it waited for, and
``servers`` stops everything it started, last first, even when a stop fails."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from .conftest import Servers, eventually


class Recorded:
    """A server that records its start arguments and, in ``log``, when it stops."""

    def __init__(self, name: str, log: list[str], fail_stop: bool = False) -> None:
        self.name, self.log, self.fail_stop = name, log, fail_stop
        self.args: tuple[object, ...] = ()

    async def start(self, *args: object) -> None:
        self.args = args

    async def stop(self) -> None:
        self.log.append(self.name)
        if self.fail_stop:
            raise RuntimeError(f"{self.name} failed to stop")


async def test_eventually_returns_the_true_value_of_a_plain_or_an_async_predicate() -> None:
    calls: list[int] = []

    def third_call() -> list[int] | None:
        calls.append(1)
        return calls if len(calls) == 3 else None

    async def ready() -> str:
        return "ready"

    assert await eventually(third_call, "the third call") == [1, 1, 1]
    assert await eventually(ready, "ready") == "ready"


async def test_eventually_names_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match="waiting for the answer: 42"):
        await eventually(lambda: False, lambda: f"the answer: {6 * 7}", timeout=0.05)
    with pytest.raises(AssertionError, match=r"waiting for .*lambda: 1 == 2"):
        await eventually(lambda: 1 == 2, timeout=0.05)


async def test_servers_stop_last_first_even_when_one_fails_to_stop() -> None:
    log: list[str] = []
    with pytest.raises(RuntimeError, match="b failed to stop"):
        async with AsyncExitStack() as stack:
            servers = Servers(stack)
            a = await servers.start(Recorded("a", log), "127.0.0.1", 0)
            await servers.start(Recorded("b", log, fail_stop=True))
            servers.defer(lambda: log.append("sync cleanup"))
            await servers.start(Recorded("c", log))
            assert a.args == ("127.0.0.1", 0) and log == []
    assert log == ["c", "sync cleanup", "b", "a"]
