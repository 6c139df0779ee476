"""``bench.routing.workloads``: every schedule is seeded (the same arguments give the same bytes, another seed other
bytes), Poisson over the window, made of streamed chat bodies with a fixed output length, and each workload has the
shape its name promises (prefix demand beyond the pool, a hot prefix, long prompts, resent history, its pool)."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from bench.routing.pool import server_config
from bench.routing.runs import schedule_digest
from bench.routing.workloads import KV_TOKENS_PER_SERVER, WORKLOADS, generate
from epp_sim import SimConfig, TimeModel

NAMES = list(WORKLOADS)


@pytest.mark.parametrize("name", NAMES)
def test_a_schedule_is_byte_identical_for_the_same_seed_and_differs_for_another(name: str) -> None:
    workload = WORKLOADS[name]
    first, again = generate(workload, 20, 4.0, 7), generate(workload, 20, 4.0, 7)
    other = generate(workload, 20, 4.0, 8)
    assert first == again and schedule_digest(first) == schedule_digest(again)
    assert [r.body for r in first] != [r.body for r in other]


@pytest.mark.parametrize("name", NAMES)
def test_requests_are_streamed_chats_with_a_fixed_output_in_send_order_within_the_window(name: str) -> None:
    requests = generate(WORKLOADS[name], 20, 4.0, 1)
    assert requests, "a 4 s window at 20 QPS has arrivals"
    assert [r.index for r in requests] == list(range(len(requests)))
    offsets = [r.offset for r in requests]
    assert offsets == sorted(offsets) and 0 <= offsets[0] and offsets[-1] < 4.0
    for request in requests:
        body = orjson.loads(request.body)
        assert request.path == "/v1/chat/completions"
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert isinstance(body["max_tokens"], int) and body["max_tokens"] >= 1


def test_arrivals_are_poisson_at_the_rate_asked() -> None:
    requests = generate(WORKLOADS["random"], 50, 40.0, 3)
    assert 1800 < len(requests) < 2200  # 2,000 expected; the Poisson standard deviation is about 45


def _system_prompts(name: str, qps: float, duration: float, servers: int = 4) -> dict[int, int]:
    """Group -> characters of its system prompt, over a schedule."""
    out = {}
    for request in generate(WORKLOADS[name], qps, duration, 1, servers):
        out[request.group] = len(orjson.loads(request.body)["messages"][0]["content"])
    return out


def test_cache_pressure_demands_more_prefix_than_all_servers_hold() -> None:
    systems = _system_prompts("cache-pressure", 40, 30.0)
    assert len(systems) == 48  # 12 groups per server, each reached in 1,200 requests
    assert sum(systems.values()) / 4 > 1.4 * 4 * KV_TOKENS_PER_SERVER


def test_shared_prefix_recurs_whole_prompts_five_questions_per_group() -> None:
    requests = generate(WORKLOADS["shared-prefix"], 40, 30.0, 1)
    questions: dict[int, set[str]] = {}
    for request in requests:
        messages = orjson.loads(request.body)["messages"]
        questions.setdefault(request.group, set()).add(messages[1]["content"])
    assert len(questions) == 16 and all(len(q) == 5 for q in questions.values())


def test_hot_prefix_sends_the_hottest_group_more_than_one_servers_share() -> None:
    counts = Counter(r.group for r in generate(WORKLOADS["hot-prefix"], 40, 30.0, 1))
    top = counts.most_common(1)[0][1] / sum(counts.values())
    assert 0.47 < top < 0.57  # Zipf 1.5 over 8 groups: 51.9%, twice a 4-server pool's even share


def test_long_short_mixes_a_tenth_of_16k_prompts() -> None:
    requests = generate(WORKLOADS["long-short"], 40, 30.0, 1)
    long = [r for r in requests if r.group == 1]
    assert 0.07 < len(long) / len(requests) < 0.13
    assert all(len(orjson.loads(r.body)["messages"][0]["content"]) == 4 * 16000 for r in long)


def test_multi_turn_resends_each_sessions_history() -> None:
    sessions: dict[int, list[list[dict[str, str]]]] = {}
    for request in generate(WORKLOADS["multi-turn"], 20, 30.0, 1):
        sessions.setdefault(request.group, []).append(orjson.loads(request.body)["messages"])
    longest = max(sessions.values(), key=len)
    assert len(longest) == 5
    for before, after in zip(longest, longest[1:]):
        assert after[: len(before)] == before  # the history is resent unchanged
        assert [m["role"] for m in after[len(before):]] == ["assistant", "user"]


def test_pools_have_the_roles_and_speeds_their_workloads_need() -> None:
    assert [s.role for s in WORKLOADS["pd"].pool(4)] == ["prefill", "prefill", "decode", "decode"]
    assert WORKLOADS["pd"].pd and not WORKLOADS["shared-prefix"].pd
    assert [s.slowdown for s in WORKLOADS["heterogeneous"].pool(4)] == [2.0, 1.0, 1.0, 1.0]
    assert [s.slowdown for s in WORKLOADS["heterogeneous"].pool(8)] == [2.0, 2.0] + [1.0] * 6


def test_a_slow_servers_config_doubles_every_term_of_the_time_model() -> None:
    slow = SimConfig(**server_config(WORKLOADS["heterogeneous"].pool(4)[0], seed=0, kv_events=None))
    base = TimeModel()
    assert slow.time_model.step_overhead_s == 2 * base.step_overhead_s
    assert slow.time_model.prefill_s_per_token == 2 * base.prefill_s_per_token
    assert slow.time_model.attn_s_per_kv_token == 2 * base.attn_s_per_kv_token
    assert slow.time_model.kv_transfer_s_per_token == base.kv_transfer_s_per_token  # the network is not slower
