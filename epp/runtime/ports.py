"""Ports to hand to a child process: free when probed, and outside the kernel's ephemeral range.

A port from ``bind(0)`` comes from the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), which every
outgoing ``connect()`` and every ``bind(0)`` on the machine also draws from, so between the probe and the child's
own bind another socket may take it. A port below the range is only taken by an explicit bind, so one free when
probed stays free for the child unless another process binds that very number. :func:`free_ports` probes random
bases in [10000, the range's start), holds all ``n`` consecutive ports on every host while it probes, and never
hands out a port it handed out recently, so several calls give distinct ports.
"""

from __future__ import annotations

import random
import socket
from collections import deque
from collections.abc import Container
from pathlib import Path

__all__ = ["ephemeral_range", "free_ports"]

_LOWEST = 10000  # above the well-known and most registered service ports
_LINUX_DEFAULT = (32768, 60999)
_issued: deque[int] = deque(maxlen=1024)  # handed out by this process: not again, though a child may not have bound yet


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (Linux's default where it cannot be read)."""
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return _LINUX_DEFAULT
    return lo, hi


def free_ports(n: int = 1, hosts: tuple[str, ...] = ("127.0.0.1",), avoid: Container[int] = ()) -> int:
    """The first of ``n`` consecutive ports free on every one of ``hosts``, none in ``avoid``, all below the
    ephemeral range (or, where it starts too low to leave room, above ``_LOWEST`` and outside it)."""
    lo, hi = ephemeral_range()
    below = lo - n > _LOWEST
    top = lo - n if below else 65536 - n
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(_LOWEST, top)
        if any(port in avoid or port in _issued for port in range(base, base + n)):
            continue
        if not below and base + n > lo and base <= hi:
            continue  # a range starting this low leaves no room below it: keep out of it instead
        if _all_free(base, n, hosts):
            _issued.extend(range(base, base + n))
            return base
    raise RuntimeError(f"no {n} consecutive free ports below {lo} on {', '.join(hosts)}")


def _all_free(base: int, n: int, hosts: tuple[str, ...]) -> bool:
    socks: list[socket.socket] = []
    try:
        for host in hosts:
            for port in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for sock in socks:
            sock.close()
