"""The routing benchmark's replay of each run's last answer on every server (bench/routing/lastanswer.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.routing.floor import decode_seconds, prefill_seconds
from bench.routing.lastanswer import Seq, last_answer, main, replay, replay_run
from bench.routing.runner import Outcome
from epp_sim import SimConfig, TimeModel

TM = TimeModel()


def _alone(prompt: int, tokens: int) -> float:
    """The floor of one answer on an idle server (:mod:`bench.routing.floor`): its prompt, then its other tokens."""
    return prefill_seconds(TM, prompt, 0, 8192) + decode_seconds(TM, prompt, tokens)


def test_an_answer_alone_takes_its_prefill_and_one_step_per_further_token() -> None:
    assert replay([], Seq(0.0, 200, 1000, 1000), TM, 8192) == pytest.approx(_alone(1000, 200))


def test_a_cached_prompt_is_not_computed_again() -> None:
    cached = replay([], Seq(0.0, 200, 1000, 16), TM, 8192)
    assert cached < _alone(1000, 200) - 0.9 * TM.prefill_s_per_token * 984


def test_an_answer_decoding_beside_it_adds_its_share_to_each_step_they_share() -> None:
    """The other answer has 50 tokens left: the first 50 of the answer's decode steps carry its cost too."""
    alone = replay([], Seq(0.0, 200, 1000, 1000), TM, 8192)
    beside = replay([Seq(0.0, 50, 500, 0)], Seq(0.0, 200, 1000, 1000), TM, 8192)
    shared = sum(TM.decode_s_per_seq + TM.attn_s_per_kv_token * (500 + i) for i in range(50))
    assert beside - alone == pytest.approx(shared)


def test_a_request_sent_later_joins_when_it_arrives() -> None:
    """A long prompt sent 0.1 s after the answer stalls one of its steps by that prompt's prefill."""
    alone = replay([], Seq(0.0, 200, 100, 100), TM, 8192)
    later = replay([Seq(0.1, 10, 8000, 8000)], Seq(0.0, 200, 100, 100), TM, 8192)
    assert later - alone > TM.prefill_s_per_token * 8000
    assert replay([Seq(alone + 1.0, 10, 8000, 8000)], Seq(0.0, 200, 100, 100), TM, 8192) == pytest.approx(alone)


def test_the_last_answer_is_the_successful_one_that_ended_last() -> None:
    outcomes = [Outcome(0, 200, 0.1, 1.0, end=5.0), Outcome(1, 503, error="overloaded", end=9.0),
                Outcome(2, 200, 0.1, 2.0, end=6.0)]
    last = last_answer(outcomes)
    assert last is not None and last.index == 2
    assert last_answer([Outcome(0, 503, error="overloaded")]) is None


def _run(tmp_path: Path, name: str, outcomes: list[Outcome], servers: int) -> Path:
    run = tmp_path / "logs" / name
    run.mkdir(parents=True)
    (run / "outcomes.jsonl").write_text("".join(json.dumps(asdict(o)) + "\n" for o in outcomes))
    (run / "servers.json").write_text(json.dumps([{"config": SimConfig().model_dump()}] * servers))
    return run


def test_a_run_replays_its_last_answer_on_every_server_and_names_the_best(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Server 0 decodes a 1,000-token answer when the last one is sent there; server 1 is idle: the replay puts the
    last answer at its time alone on server 1 and later on server 0, and names server 1."""
    busy = Outcome(0, 200, 0.02, 8.0, 100, 0, 1000, end=8.0, servers=[0])
    last = Outcome(1, 200, 0.03, 1.2, 1000, 0, 200, end=8.5, servers=[0])
    run = _run(tmp_path, "random-28-x-run1", [busy, last], 2)
    r = replay_run(run)
    assert r is not None and (r.index, r.server, r.e2e, r.best) == (1, 0, 1.2, 1)
    assert r.replayed[1] == pytest.approx(_alone(1000, 200)) and r.replayed[0] > r.replayed[1]
    _run(tmp_path, "pd-10-x-run1", [Outcome(0, 200, 0.02, 1.0, 100, 0, 10, end=1.0, servers=[0, 1])], 2)
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| random-28-x-run1 |"))
    assert row.startswith("| random-28-x-run1 | 1 | 0 | 1.200 | 0: ") and row.endswith("| 1 |")
    assert "| pd-10-x-run1 | skipped" in out


def test_a_directory_without_runs_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "logs").mkdir()
    assert main([str(tmp_path)]) == 2
    assert "no runs" in capsys.readouterr().err
