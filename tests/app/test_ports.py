"""``free_ports``: ports for child processes, free when probed, below the kernel's ephemeral range, never handed
out twice in a row by one process."""

from __future__ import annotations

import contextlib
import socket

import pytest

from epp.runtime import ports
from epp.runtime.ports import ephemeral_range, free_ports


def bindable(base: int, n: int) -> bool:
    with contextlib.ExitStack() as stack:
        try:
            for port in range(base, base + n):
                stack.enter_context(socket.create_server(("127.0.0.1", port)))
        except OSError:
            return False
    return True


def test_consecutive_ports_below_the_ephemeral_range_and_free() -> None:
    lo, _ = ephemeral_range()
    base = free_ports(3)
    assert 10000 <= base and base + 3 <= lo
    assert bindable(base, 3)


def test_successive_calls_give_distinct_ports_and_keep_out_of_avoid() -> None:
    first = free_ports(4)
    taken = set(range(first, first + 4))
    for _ in range(50):
        base = free_ports(2, avoid=range(first - 10, first + 10))
        assert not taken & {base, base + 1}
        assert not set(range(first - 10, first + 10)) & {base, base + 1}
        taken |= {base, base + 1}


def test_a_port_bound_elsewhere_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        monkeypatch.setattr(ports, "_LOWEST", port)  # the only room left is the held port
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (port + 2, 65535))
        with pytest.raises(RuntimeError, match="no 1 consecutive free ports"):
            free_ports(1)


def test_a_range_starting_too_low_is_kept_out_of(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (10001, 60999))
    for _ in range(20):
        base = free_ports(2)
        assert base + 2 <= 10001 or base > 60999


def test_no_room_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    with pytest.raises(RuntimeError, match="no 1 consecutive free ports"):
        free_ports(1)
