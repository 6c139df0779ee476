"""The routing benchmark's breakdown by kind of request and by session (bench/routing/breakdown.py)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import orjson
import pytest

from bench.routing.breakdown import by_kind, by_server, main, sessions
from bench.routing.runner import Outcome
from bench.routing.runs import schedule_digest
from bench.routing.workloads import WORKLOADS, Request, generate


def _request(index: int, offset: float, group: int = -1, kind: str = "") -> Request:
    return Request(index, offset, "/v1/chat/completions", b"{}", group, kind)


def _done(index: int, ttft: float, prompt: int = 100, cached: int = 0, servers: list[int] | None = None) -> Outcome:
    return Outcome(index, 200, ttft, ttft + 1.0, prompt, cached, 10, servers=servers)


def test_workloads_label_the_kinds_they_mix() -> None:
    long_short = generate(WORKLOADS["long-short"], 20, 30.0, 1)
    for r in long_short:
        prompt = len(orjson.loads(r.body)["messages"][0]["content"])
        assert r.kind == ("long" if prompt == 4 * 16000 else "short")
    assert {r.kind for r in long_short} == {"long", "short"}
    turns: dict[int, list[str]] = {}
    for r in generate(WORKLOADS["multi-turn"], 20, 30.0, 1):
        turns.setdefault(r.group, []).append(r.kind)
        user_turns = sum(m["role"] == "user" for m in orjson.loads(r.body)["messages"])
        assert r.kind == f"turn {user_turns}"
    assert all(kinds == [f"turn {k + 1}" for k in range(len(kinds))] for kinds in turns.values())
    assert {r.kind for r in generate(WORKLOADS["random"], 20, 10.0, 1)} == {""}  # one kind: no long share
    assert [w.name for w in WORKLOADS.values() if w.sessions] == ["multi-turn"]


def test_by_kind_takes_each_kinds_percentiles_over_its_successful_requests() -> None:
    requests = [_request(i, i * 0.1, kind="long" if i % 5 == 0 else "short") for i in range(20)]
    outcomes = [_done(i, 0.6 + i / 1000 if i % 5 == 0 else 0.01 * (i + 1), cached=50) for i in range(20)]
    outcomes[1] = Outcome(1, 503, error="overloaded")  # a failure counts in no kind
    rows = {row.kind: row for row in by_kind(requests, outcomes)}
    assert [row.kind for row in by_kind(requests, outcomes)] == ["long", "short"]  # as first sent
    assert rows["long"].requests == 4 and rows["short"].requests == 15
    shorts = sorted(10.0 * (i + 1) for i in range(20) if i % 5 and i != 1)
    assert rows["short"].ttft_ms[0] == pytest.approx(shorts[7])  # the median of 15
    assert rows["long"].ttft_ms[1] == pytest.approx(610 + 0.7 * 5)  # 600, 605, 610, 615: 0.9 falls 0.7 past 610
    assert rows["short"].hit_rate == pytest.approx(0.5)
    assert math.isnan(by_kind([_request(0, 0.0, kind="x")], [])[0].e2e_p99_ms)


def test_by_kind_counts_requests_sent_to_a_server_still_prefilling_one_of_their_kind() -> None:
    requests = [_request(0, 0.0, kind="long"), _request(1, 0.5, kind="long"), _request(2, 0.6, kind="long"),
                _request(3, 0.7, kind="short"), _request(4, 0.8, kind="long"), _request(5, 2.0, kind="long")]
    outcomes = [_done(0, 1.0, servers=[0]), _done(1, 1.0, servers=[0]),  # sent while 0 was before its first token
                _done(2, 1.0, servers=[1]),   # another server
                _done(3, 0.1, servers=[0]),   # another kind
                _done(4, 1.0, servers=None),  # where it ran is unknown
                _done(5, 1.0, servers=[0])]   # 0 and 1 have their first tokens (at 1.0 and 1.5)
    rows = {row.kind: row for row in by_kind(requests, outcomes)}
    assert (rows["long"].behind, rows["short"].behind) == (1, 0)
    outcomes[2].ttft = 0.4  # the rest of the long ones: 0, 2 and 5 (4's server is unknown), TTFT 1.0, 0.4, 1.0
    assert by_kind(requests, outcomes)[0].clear_ttft_p90_ms == pytest.approx(1000.0)
    outcomes[5].ttft = 0.2  # 1.0, 0.4, 0.2: 0.9 falls 0.8 of the way from 0.4 to 1.0
    assert by_kind(requests, outcomes)[0].clear_ttft_p90_ms == pytest.approx(400 + 0.8 * 600)
    assert by_kind(requests, outcomes)[1].clear_ttft_p90_ms == pytest.approx(100.0)  # short: its only one
    outcomes[2].ttft, outcomes[5].ttft = 1.0, 1.0
    requests[5] = _request(5, 1.3, kind="long")
    outcomes[5].lag = 0.1  # the client sent it late, at 1.4: before 1's first token at 1.5
    assert by_kind(requests, outcomes)[0].behind == 2


def test_by_server_counts_each_servers_requests_and_those_in_the_runs_ttft_tail() -> None:
    # 10 requests: the run's TTFT p90 falls 0.1 past the 9th (0.09 s), so only the 10th (0.1 s) is above it.
    outcomes = [_done(i, 0.01 * (i + 1), servers=[0] if i >= 7 else [1]) for i in range(10)]
    outcomes += [Outcome(10, 503, error="overloaded"), _done(11, 0.5)]  # a failure, a server unknown: in no row
    rows = by_server(outcomes)
    assert [(r.servers, r.requests, r.above_p90) for r in rows] == [((0,), 3, 1), ((1,), 7, 0)]
    assert rows[0].ttft_p50_ms == pytest.approx(90.0) and rows[1].ttft_p50_ms == pytest.approx(40.0)
    assert by_server([_done(0, 0.01, servers=[2, 3])])[0].servers == (2, 3)  # a P/D pair is one row


def test_sessions_count_later_turns_moved_and_mostly_missed() -> None:
    requests = [_request(0, 0.0, 7), _request(1, 0.5, 8), _request(2, 1.0, 7), _request(3, 1.5, 8),
                _request(4, 2.0, 7), _request(5, 2.5, 8)]
    outcomes = [_done(0, 0.01, servers=[0]), _done(1, 0.01, servers=[1]),
                _done(2, 0.01, prompt=200, cached=150, servers=[0]),   # stayed, cached
                _done(3, 0.01, prompt=200, cached=50, servers=[2]),    # moved and mostly missed
                _done(4, 0.01, prompt=300, cached=100, servers=[0]),   # stayed, mostly missed (evicted)
                _done(5, 0.01, prompt=300, cached=250, servers=None)]  # where it ran is unknown: not a move
    counts = sessions(requests, outcomes)
    assert (counts.later, counts.moved, counts.mostly_missed, counts.moved_and_missed) == (4, 1, 2, 1)


def _out_dir(tmp_path: Path, digest: str | None = None) -> tuple[Path, list[Request]]:
    requests = generate(WORKLOADS["multi-turn"], 10, 4.0, 1)
    results = {"seed": 1, "servers": 4, "duration": 4.0,
               "schedules": [{"workload": "multi-turn", "qps": 10.0, "requests": len(requests),
                              "sha256": digest or schedule_digest(requests)}]}
    (tmp_path / "results.json").write_text(json.dumps(results))
    for run in ("epp-cost-model-run1", "sglang-cache_aware-run1"):
        log = tmp_path / "logs" / f"multi-turn-10-{run}"
        log.mkdir(parents=True)
        lines = [json.dumps(asdict(_done(r.index, 0.02, servers=[r.group % 4]))) for r in requests]
        (log / "outcomes.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path, requests


def test_the_command_reports_every_run_of_a_results_directory(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out, requests = _out_dir(tmp_path)
    assert main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "**multi-turn, 10 QPS**" in text
    firsts = sum(r.kind == "turn 1" for r in requests)
    assert f"| epp-cost-model-run1 | turn 1 | {firsts} | 20.0 / 20.0 / 20.0 | 1,020.0 | 0.0% | 0 |" in text
    later = len(requests) - firsts
    assert f"| sglang-cache_aware-run1 | later turns: moved / less than half cached / both | {later} | 0 / {later} / 0" \
        in text  # no answer here had anything cached


def test_the_command_refuses_a_run_of_another_schedule(tmp_path: Path) -> None:
    out, _ = _out_dir(tmp_path, digest="0" * 64)
    with pytest.raises(SystemExit, match="another schedule"):
        main([str(out)])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing")])
