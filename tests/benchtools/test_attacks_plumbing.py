"""``bench.attacks``' plumbing: every attack runs in its tiny configuration against a real ``epp serve`` over the
simulated pool and returns a well-formed outcome; one row runs end to end (EPP, the well-behaved client process,
the quiet and attack windows, the table); and the verdicts follow the targets. No performance is asserted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.attacks import (
    ROWS,
    Context,
    Row,
    build_parser,
    cells,
    endpoints_file,
    expected_timeouts,
    run_row,
    selected,
    table,
)
from bench.attacks_base import NOT_JUDGED, PRESETS, Closes, Target, Timeouts
from bench.attacks_proc import Epp, window
from bench.gateway_load import Child

TINY = PRESETS["tiny"]
WATCHED_CONNECTIONS = {"e-preface": TINY.idle_connections, "e-idle": TINY.idle_connections, "f": TINY.slowloris,
                       "g-trickle": TINY.trickled, "g-stalled": TINY.stalled, "h": TINY.flood}
"""How many connections each close-watching attack opens in the tiny configuration."""


@pytest.fixture(scope="module")
def pool() -> Iterator[list[int]]:
    backend = Child("_backend", "--backend", "sim", "--latency", "0.01", "--tokens", "4")
    try:
        yield backend.info["ports"]
    finally:
        backend.stop()


@pytest.fixture(scope="module")
def endpoints(pool: list[int], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return endpoints_file(tmp_path_factory.mktemp("attacks"), pool)


@pytest.fixture(scope="module")
def epp(endpoints: Path) -> Iterator[tuple[Epp, Target]]:
    server = Epp(endpoints, "native", endpoints.parent / "epp.log", [])
    target = asyncio.run(server.start())
    try:
        yield server, target
    finally:
        server.stop()


@pytest.mark.parametrize("name", [spec.name for spec in ROWS])
async def test_each_attack_returns_a_well_formed_outcome(epp: tuple[Epp, Target], name: str) -> None:
    server, target = epp
    spec = next(s for s in ROWS if s.name == name)
    outcome = await asyncio.wait_for(spec.attack(target, TINY), 60)
    assert outcome.facts and all(isinstance(k, str) and isinstance(v, str) and v for k, v in outcome.facts.items())
    assert "error" not in outcome.facts
    if name in WATCHED_CONNECTIONS:
        closes = outcome.closes
        assert closes is not None and len(closes.times) == WATCHED_CONNECTIONS[name]
        assert all(t is None or 0 <= t <= closes.watched + 1 for t in closes.times)
        assert closes.verdict(TINY.timeouts.slack) in ("PASS", "FAIL", "-", NOT_JUDGED)
    else:
        assert outcome.closes is None
    assert server.alive, f"EPP exited during {name}; log: {server.log}"


async def test_a_row_runs_end_to_end_and_renders(endpoints: Path) -> None:
    ctx = Context(endpoints, endpoints.parent, TINY, [], quiet=1.0)
    spec = next(s for s in ROWS if s.name == "j")
    row = await run_row(spec, "native", ctx)
    assert row.epp_survived and row.quiet["requests"] + row.during["requests"] > 0
    assert row.seconds >= ctx.quiet  # the attack window lasts at least as long as the quiet one
    assert set(row.verdicts()) == {"rss", "p99", "closes", "verdict"}
    assert "new /metrics series" in row.facts and row.close_times == []
    text = table([row])
    assert text.count("\n") == 2 and text.splitlines()[2].count(" | ") == len(cells(row)) - 1


def _row(single: bool, rss: float, quiet_p99: float, p99: float, errors: int, closes: str = "-") -> Row:
    window = {"requests": 100, "errors": 0, "p50": 1.0, "p99": quiet_p99, "max": quiet_p99}
    during = {**window, "p99": p99, "errors": errors}
    return Row("x", "x", "native", single, {"k": "v"}, "-", closes, 1.0, rss, 0.1, 0.1, window, during, True)


@pytest.mark.parametrize(("row", "expected"), [
    (_row(True, 10, 5, 9, 0), {"rss": "PASS", "p99": "PASS", "closes": "-", "verdict": "PASS"}),
    (_row(True, 65, 5, 9, 0), {"rss": "FAIL", "p99": "PASS", "closes": "-", "verdict": "FAIL"}),
    (_row(False, 500, 5, 11, 0), {"rss": "-", "p99": "FAIL", "closes": "-", "verdict": "FAIL"}),
    (_row(False, 500, 5, 9, 1), {"rss": "-", "p99": "FAIL", "closes": "-", "verdict": "FAIL"}),
    (_row(False, 0, 5, 9, 0, "FAIL"), {"rss": "-", "p99": "PASS", "closes": "FAIL", "verdict": "FAIL"}),
    (_row(False, 0, 5, 9, 0, NOT_JUDGED), {"rss": "-", "p99": "PASS", "closes": NOT_JUDGED, "verdict": NOT_JUDGED}),
    (_row(False, 0, 5, 11, 0, NOT_JUDGED), {"rss": "-", "p99": "FAIL", "closes": NOT_JUDGED, "verdict": "FAIL"}),
], ids=["within", "rss-over", "p99-over", "client-error", "late-close", "close-not-judged", "fail-wins"])
def test_verdicts_follow_the_targets(row: Row, expected: dict[str, str]) -> None:
    assert row.verdicts() == expected


@pytest.mark.parametrize(("closes", "expected"), [
    (Closes(10, 20, [3.0, 11.5]), "PASS"),
    (Closes(10, 20, [3.0, 12.5]), "FAIL"),
    (Closes(10, 20, [3.0, None]), "FAIL"),
    (Closes(10, 8, [3.0, None]), NOT_JUDGED),
    (Closes(None, 20, [None]), "-"),
], ids=["within-slack", "late", "open-past-timeout", "watch-too-short", "not-judged"])
def test_closes_are_judged_against_timeout_plus_slack(closes: Closes, expected: str) -> None:
    assert closes.verdict(Timeouts().slack) == expected


def test_a_letter_selects_its_variants() -> None:
    assert [s.name for s in selected("c,j")] == ["c-ping", "c-settings", "j"]
    with pytest.raises(SystemExit):
        selected("z")


def test_a_request_the_attack_stalled_counts_in_the_attack_window_only() -> None:
    # quiet window 0..10, attack window 10..20: the request from 9.9 to 12.5 was stalled by the attack
    samples = [(1.0, 1.01, True), (9.9, 12.5, True), (12.6, 12.61, True), (13.0, 18.0, False)]
    quiet = window(samples, 0.0, 10.0, within=True)
    during = window(samples, 10.0, 20.0, within=False)
    assert (quiet.requests, quiet.errors) == (1, 0)
    assert (during.requests, during.errors) == (3, 1)
    assert during.max == pytest.approx(2600.0)


def test_expected_timeouts_come_from_the_flag_then_epp_args_then_epp_defaults() -> None:
    args = build_parser().parse_args(["--epp-args", "--http-header-timeout 5s --retries 0 --http-body-timeout 1m30s",
                                 "--preface-timeout", "3", "--body-timeout", "7"])
    assert expected_timeouts(args) == Timeouts(preface=3.0, idle=Timeouts().idle, head=5.0, body=7.0)
    assert expected_timeouts(build_parser().parse_args([])) == Timeouts()
