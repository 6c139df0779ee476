"""Child processes of the routing benchmark (simulated servers, routers, Envoy), each started and stopped by its PID.

:class:`Child` starts one command in its own session (a terminal's Ctrl-C reaches only the benchmark, which then
stops its children) with ``PR_SET_PDEATHSIG`` (a benchmark killed outright takes its children with it), its output
in a log file; ``await stop()`` sends SIGTERM to that PID and SIGKILL after a grace period. ``wait_for`` polls a
condition while checking that the child is still alive, so a router that exits at start-up fails fast with its log.
Ports for the children come from :func:`epp.runtime.ports.free_ports`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from epp.envoy.process import terminate
from epp.runtime.workers import die_with_parent

__all__ = ["Child", "wait_for"]


class Child:
    """One child process: ``argv`` with stdout and stderr in ``log``."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.env = None if env is None else {**os.environ, **env}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    def start(self) -> Child:
        """Start the process with a fresh log; returns self."""
        # A fresh log, not appended: start-up reads the listening port from the log, and a run into a reused
        # results directory otherwise found the previous run's port there and pointed its router at a dead server.
        with open(self.log, "wb") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True, preexec_fn=die_with_parent)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM the process (SIGKILL after ``grace`` seconds) and wait for it; its exit status."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            await terminate(proc, grace)
        return proc.returncode

    def output(self, limit: int = 4000) -> str:
        """The end of the child's log."""
        try:
            return self.log.read_text(errors="replace")[-limit:]
        except OSError:
            return ""


async def wait_for(condition: Callable[[], Awaitable[bool]], child: Child, what: str, timeout: float = 60.0,
                   interval: float = 0.1) -> None:
    """Poll ``condition`` until it is true; ``RuntimeError`` with the child's log if the child exits or
    ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        if await condition():
            return
        if not child.running():
            raise RuntimeError(f"{child.name} exited before {what}:\n{child.output()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{child.name}: no {what} within {timeout:g} s:\n{child.output()}")
        await asyncio.sleep(interval)
