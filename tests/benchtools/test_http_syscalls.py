"""``bench.http_syscalls`` reads ``strace -c`` summaries (the text below is a capture from this machine)."""

from __future__ import annotations

from bench.http_syscalls import parse_strace_summary

CAPTURE = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 46.94    0.100928          19      5048           write
 31.48    0.067700          12      5349           epoll_pwait
 21.57    0.046389           8      5348           read
  0.00    0.000002           1         2           setsockopt
  0.00    0.000004           4         1         1 connect
------ ----------- ----------- --------- --------- ----------------
100.00    0.215025          13     15748         1 total
"""


def test_calls_per_syscall_without_the_total() -> None:
    assert parse_strace_summary(CAPTURE) == {"write": 5048, "epoll_pwait": 5349, "read": 5348, "setsockopt": 2,
                                             "connect": 1}


def test_nothing_traced_is_empty() -> None:
    assert parse_strace_summary("% time     seconds  usecs/call     calls    errors syscall\n") == {}
