"""``bench.http_gateway``'s CPU accounting: a router process's user and system time from ``/proc``, and the
row's figures (CPU per request and the kernel's part of it) taken from one run, the median one."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from bench.gateway_load import Result, cpu_times
from bench.http_gateway import _cpu_pid, _median_cpu


def _run(requests: int, cpu_s: float | None, system_s: float | None) -> Result:
    return Result(requests, 0, 1.0, [], [], cpu_s, system_s)


def test_cpu_times_split_a_process_into_user_and_system_seconds() -> None:
    # A child that spends time in write() system calls, then in user code, until its own clock (os.times, the
    # same tick-based accounting /proc reports) shows both: a fixed number of writes can finish within one tick
    # on a fast machine and be charged to user time alone. Bounded at 20 s, so a kernel that never charges system
    # time fails the assertion below instead of hanging.
    child = subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                              "fd = os.open(os.devnull, os.O_WRONLY)\n"
                              "end = time.monotonic() + 20\n"
                              "while os.times().system < 0.05 and time.monotonic() < end:\n"
                              "    for _ in range(10000): os.write(fd, b'x')\n"
                              "x = 0\n"
                              "while os.times().user < 0.05 and time.monotonic() < end: x += 1\n"
                              "sys.stdout.write('done\\n'); sys.stdout.flush(); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        times = cpu_times(child.pid)
        assert times is not None
        user, system = times
        assert user > 0 and system > 0
    finally:
        child.communicate("")
    assert cpu_times(None) is None
    assert cpu_times(child.pid) is None  # reaped: no /proc entry


def test_median_cpu_takes_both_figures_from_the_median_run() -> None:
    runs = [_run(100, 0.090, 0.010), _run(100, 0.050, 0.040), _run(200, 0.140, 0.020)]
    # per request: 0.9 ms (0.1 kernel), 0.5 ms (0.4 kernel), 0.7 ms (0.1 kernel): the median run is the third
    total, system = _median_cpu(runs)  # type: ignore[misc]
    assert (round(total, 6), round(system, 6)) == (0.7, 0.1)


def test_median_cpu_of_an_even_count_is_the_lower_middle_run_and_none_without_figures() -> None:
    total, system = _median_cpu([_run(10, 0.02, 0.01), _run(10, 0.01, 0.002)])  # type: ignore[misc]
    assert (round(total, 6), round(system, 6)) == (1.0, 0.2)
    assert _median_cpu([_run(10, None, None), _run(0, 0.0, 0.0)]) is None


def test_cpu_pid_follows_a_shell_launcher_to_its_only_child() -> None:
    # A launcher script that runs the router without exec: the router's CPU is its child's.
    script = [sys.executable, "-c", "import sys; sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.read()"]
    shell = subprocess.Popen(["bash", "-c", shlex.join(script) + "; true"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    direct = subprocess.Popen(script, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert shell.stdout is not None and shell.stdout.readline() == "up\n"
        assert direct.stdout is not None and direct.stdout.readline() == "up\n"
        child = _cpu_pid(shell.pid)
        assert child != shell.pid
        assert Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0] == sys.executable.encode()
        assert _cpu_pid(direct.pid) == direct.pid  # not a shell: itself
    finally:
        shell.communicate("")
        direct.communicate("")
    assert _cpu_pid(shell.pid) == shell.pid  # gone: itself
