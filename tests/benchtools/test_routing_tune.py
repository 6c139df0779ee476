"""``python -m bench.routing.tune``: the grid over a profile, the trace reader, the guarded ranking and a real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench.routing.report import Summary
from bench.routing.tune import Candidate, TuneError, grid, load_trace, main, parse_axis, rank
from epp.config.loader import load_config
from epp.runtime.builtins import default_registry

CONFIGS = Path(__file__).resolve().parents[2] / "config"


def cost_model() -> dict:
    return yaml.safe_load((CONFIGS / "cost-model.yaml").read_text())


def test_an_axis_is_a_plugin_parameter_or_a_weight_and_its_values_are_yaml() -> None:
    param = parse_axis("ttft-cost-scorer.decodeWeight=0.25,1,true")
    assert (param.plugin, param.parameter, param.profile, param.values) == ("ttft-cost-scorer", "decodeWeight", "",
                                                                             (0.25, 1, True))
    weight = parse_axis("default/queue-scorer=1,2")
    assert (weight.plugin, weight.parameter, weight.profile, weight.values) == ("queue-scorer", "", "default", (1, 2))
    for bad in ("decodeWeight=1", "ttft-cost-scorer.decodeWeight", "x.y=", "=1"):
        with pytest.raises(TuneError, match="--vary"):
            parse_axis(bad)


def test_the_grid_starts_with_the_base_and_holds_each_other_combination_once() -> None:
    config = cost_model()
    candidates = grid(config, [parse_axis("ttft-cost-scorer.decodeWeight=0.25,1"),
                               parse_axis("default/ttft-cost-scorer=1,2")])
    # the base lists the scorer with weight 1 and leaves decodeWeight at its default, 0.25: (0.25, 1) is the base
    assert [c.changes for c in candidates] == [
        {}, {"default/ttft-cost-scorer": 2}, {"ttft-cost-scorer.decodeWeight": 1},
        {"ttft-cost-scorer.decodeWeight": 1, "default/ttft-cost-scorer": 2}]
    base_params = {"weighVictimsByOutput": True, "moveRatio": 0.5, "prefixHomes": True}  # what the profile sets
    assert candidates[0].config is config and config["plugins"][1]["parameters"] == base_params  # left alone
    last = candidates[-1].config
    assert last["plugins"][1]["parameters"] == {**base_params, "decodeWeight": 1}
    assert last["schedulingProfiles"][0]["plugins"][0] == {"pluginRef": "ttft-cost-scorer", "weight": 2}
    # a parameter already set is merged into, not replaced
    assert grid(config, [parse_axis("approx-prefix-cache-producer.blockSizeTokens=32")])[1].config["plugins"][0][
        "parameters"] == {"maxPrefixBlocksToMatch": 2048, "blockSizeTokens": 32}


def test_a_name_the_base_lacks_is_refused_naming_what_it_has() -> None:
    with pytest.raises(TuneError, match=r"no plugin named 'queue-scorer' \(it has \['approx-prefix-cache-producer'"):
        grid(cost_model(), [parse_axis("queue-scorer.x=1")])
    with pytest.raises(TuneError, match="no scheduling profile named 'decode'"):
        grid(cost_model(), [parse_axis("decode/ttft-cost-scorer=1")])
    with pytest.raises(TuneError, match="has no pluginRef 'queue-scorer'"):
        grid(cost_model(), [parse_axis("default/queue-scorer=1")])


def test_a_trace_is_read_by_offset_and_sent_streamed_with_usage(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"offset": 0.5, "body": {"model": "m", "prompt": "b", "max_tokens": 3},
                                 "path": "/v1/completions"}) + "\n\n" +
                     json.dumps({"offset": 0.1, "body": {"model": "m", "messages": [], "stream": False}}) + "\n")
    requests = load_trace(trace)
    assert [(r.index, r.offset, r.path) for r in requests] == [(0, 0.1, "/v1/chat/completions"),
                                                               (1, 0.5, "/v1/completions")]
    assert json.loads(requests[0].body) == {"model": "m", "messages": [], "stream": True,
                                            "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("line, message", [
    ("not json", ":1: not a trace line"),
    ('{"body": {}}', ":1: not a trace line"),
    ('{"offset": -1, "body": {}}', ":1: needs a finite offset"),
    ('{"offset": 1, "body": []}', ":1: needs a finite offset"),
    ('{"offset": 1, "body": {}, "path": "/admin"}', ":1: needs a finite offset"),
])
def test_a_bad_trace_line_is_named_by_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(line + "\n")
    with pytest.raises(TuneError, match=message):
        load_trace(trace)


def _result(ttft_p90: float, e2e: float = 1000.0, tps: float = 500.0, failed: int = 0) -> Summary:
    return Summary("w", 1, "r", requests=100, failed=failed, ttft_ms=(1.0, ttft_p90, 3.0), e2e_p99_ms=e2e,
                   output_tok_s=tps)


def test_the_ranking_is_by_objective_among_what_the_guard_lets_through() -> None:
    cands = [Candidate({}, {}, _result(100)), Candidate({"a": 1}, {}, _result(50, e2e=1030)),
             Candidate({"a": 2}, {}, _result(60, tps=480)), Candidate({"a": 3}, {}, _result(70, failed=1)),
             Candidate({"a": 4}, {}, _result(80, e2e=1019, tps=491)),
             Candidate({"a": 5}, {}, Summary("w", 1, "r", note="error: x"))]
    ranked = rank(cands, "ttft_p90", 0.02)
    assert [c.changes.get("a") for c in ranked] == [4, None, 1, 2, 3, 5]
    assert [c.rejected for c in ranked] == ["", "", "E2E p99 1.030x the base's", "throughput 0.960x the base's",
                                            "1 failed", "did not run: error: x"]


def test_a_real_tuning_run_writes_a_loadable_winner(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["--config", str(CONFIGS / "cost-model.yaml"), "--vary", "ttft-cost-scorer.decodeWeight=1",
                 "--workload", "hot-prefix", "--qps", "6", "--duration", "1", "--servers", "2",
                 "--out", str(out)]) == 0
    report = (out / "tune.md").read_text()
    assert "(the base)" in report and "ttft-cost-scorer.decodeWeight=1" in report
    rows = [line for line in report.splitlines() if line[:3] in ("| 1", "| 2")]
    assert len(rows) == 2 and rows[0].endswith("| ok |")  # the base always passes its own guard
    tuned = (out / "tuned.yaml").read_text()
    assert tuned.startswith("# Tuned by python -m bench.routing.tune on hot-prefix at 6 QPS")
    # the file holds the first row's profile
    assert ("decodeWeight: 1" in tuned) == ("decodeWeight=1" in rows[0])
    tuned_path = out / "tuned.yaml"
    assert load_config(tuned_path, default_registry()).scheduler.profiles
    assert sorted(p.name for p in (out / "candidates").iterdir()) == ["c00.yaml", "c01.yaml"]


def test_an_invalid_value_is_refused_before_anything_runs_naming_plugin_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(CONFIGS / "cost-model.yaml"), "--vary", "ttft-cost-scorer.decodeWeight=-1",
                 "--workload", "random", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "candidate ttft-cost-scorer.decodeWeight=-1" in err and "decodeWeight" in err and "ttft-cost-scorer" in err
    assert not (tmp_path / "logs").exists()


def test_a_recorded_trace_is_tuned_on_uniform_servers(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    shared = "you are a helpful assistant " * 40
    trace.write_text("".join(json.dumps({"offset": i * 0.2, "body": {
        "model": "sim-llama-8b", "messages": [{"role": "user", "content": f"{shared} question {i}"}],
        "max_tokens": 8}}) + "\n" for i in range(6)))
    out = tmp_path / "out"
    assert main(["--config", str(CONFIGS / "default.yaml"), "--trace", str(trace), "--servers", "2",
                 "--vary", "default/prefix-cache-scorer=1", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["servers"] == 2
    report = (out / "tune.md").read_text()
    assert report.startswith("**trace at 6 QPS (6 requests, seed 1, 2 servers)**")
    assert "| 0 / 6 |" in report and "default/prefix-cache-scorer=1" in report
    assert "weight: 1" in (out / "candidates" / "c01.yaml").read_text()


def test_a_trace_keeps_its_offsets_so_qps_is_refused_with_it(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--config", "x.yaml", "--vary", "a.b=1", "--trace", "t.jsonl", "--qps", "5", "--out", str(tmp_path)])
    assert info.value.code == 2 and "--qps is for --workload" in capsys.readouterr().err


def test_a_base_that_does_not_load_is_refused_naming_file_and_line(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- not-a-mapping\n")
    assert main(["--config", str(base), "--vary", "x.y=1", "--workload", "random", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the base profile: ") and f"{base}:4" in err
