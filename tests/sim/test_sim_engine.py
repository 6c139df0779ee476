"""Engine scheduling in simulated time: batching regimes, chunked prefill, preemption,
prefix caching, LoRA slots, P/D hand-off and the time model."""

from __future__ import annotations

from typing import Any

import pytest

from epp_sim import (
    ByteTokenizer,
    Engine,
    QueueFull,
    RequestTooLong,
    SimConfig,
    TimeModel,
)

TOK = ByteTokenizer()


def _engine(**fields: Any) -> Engine:
    return Engine(SimConfig(**fields))


def _prompt(n_tokens: int, seed: str = "x") -> list[int]:
    return list(TOK.encode((seed * 4 * n_tokens)[: 4 * n_tokens]))


def test_request_runs_prefill_then_one_token_per_step() -> None:
    e = _engine(block_size=4)
    seq = e.add("a", _prompt(10), 0.0, max_tokens=5)
    end = e.run_until_idle(check=True)
    assert seq.finished and seq.finish_reason == "length"
    assert seq.num_output == 5
    assert e.stats.steps == 5  # 1 prefill step (samples token 1) + 4 decode steps
    assert e.stats.generation_tokens == 5 and e.stats.prompt_tokens == 10
    assert seq.first_token > 0 and end == pytest.approx(seq.finish_time)
    assert e.bm.num_free == e.cfg.num_gpu_blocks


def test_identical_prompt_hits_prefix_cache_and_prefills_faster() -> None:
    e = _engine(block_size=4)
    first = e.add("a", _prompt(41), 0.0, max_tokens=1)
    t = e.run_until_idle()
    second = e.add("b", _prompt(41), t, max_tokens=1)
    e.run_until_idle(t)
    assert first.cached_tokens == 0
    assert second.cached_tokens == 40
    assert second.first_token - second.arrival < first.first_token - first.arrival
    assert e.stats.prefix_cache_hits == 40 and e.stats.prefix_cache_queries == 82


def test_chunked_prefill_spreads_a_long_prompt_over_steps() -> None:
    e = _engine(block_size=4, max_num_batched_tokens=32)
    e.add("a", _prompt(100), 0.0, max_tokens=1)
    e.run_until_idle(check=True)
    assert e.stats.steps == 4  # ceil(100 / 32)


def test_without_chunked_prefill_a_long_prompt_runs_alone() -> None:
    e = _engine(block_size=4, max_num_batched_tokens=32, enable_chunked_prefill=False)
    a = e.add("a", _prompt(100, "a"), 0.0, max_tokens=1)
    b = e.add("b", _prompt(8, "b"), 0.0, max_tokens=1)
    e.step(0.0)
    assert e.scheduled == [a]
    e.run_until_idle(check=True)
    assert a.finished and b.finished and e.stats.steps == 2


def test_max_num_seqs_bounds_the_batch() -> None:
    e = _engine(max_num_seqs=3)
    seqs = [e.add(str(i), _prompt(8, str(i)), 0.0, max_tokens=4) for i in range(7)]
    e.step(0.0)
    assert e.num_running == 3 and e.num_waiting == 4
    e.run_until_idle(check=True)
    assert all(s.finished for s in seqs)


def test_kv_pressure_preempts_latest_arrival_and_everyone_finishes() -> None:
    e = _engine(num_gpu_blocks=10, block_size=4)
    early = e.add("early", _prompt(8, "a"), 0.0, max_tokens=24)
    late = e.add("late", _prompt(8, "b"), 0.001, max_tokens=24)
    e.run_until_idle(check=True)
    assert e.stats.num_preemptions >= 1
    assert early.num_preemptions == 0 and late.num_preemptions >= 1
    assert early.finished and late.finished and late.num_output == 24


def test_preemption_victim_is_lowest_priority_first() -> None:
    e = _engine(num_gpu_blocks=10, block_size=4)
    low = e.add("low", _prompt(8, "a"), 0.0, max_tokens=24, priority=1)
    high = e.add("high", _prompt(8, "b"), 0.001, max_tokens=24, priority=0)
    e.run_until_idle(check=True)
    assert low.num_preemptions >= 1 and high.num_preemptions == 0


def test_lora_beyond_max_loras_is_skipped_not_blocking() -> None:
    e = _engine(max_loras=1, lora_adapters=["a", "b"])
    first = e.add("1", _prompt(8, "1"), 0.0, max_tokens=3, lora="a")
    other = e.add("2", _prompt(8, "2"), 0.0, max_tokens=3, lora="b")
    base = e.add("3", _prompt(8, "3"), 0.0, max_tokens=3)
    e.step(0.0)
    assert set(e.running) == {first, base}
    assert list(e.waiting) == [other]
    e.run_until_idle(check=True)
    assert other.finished


def test_static_batching_admits_only_when_the_batch_is_done() -> None:
    e = _engine(batching="static")
    a = e.add("a", _prompt(8, "a"), 0.0, max_tokens=2)
    b = e.add("b", _prompt(8, "b"), 0.0, max_tokens=6)
    t = e.step(0.0) or 0.0
    c = e.add("c", _prompt(8, "c"), t, max_tokens=2)
    while not b.finished:
        e.step(t)
        assert c.status == 0 or b.finished  # c waits while the batch runs
        t += 0.01
    e.run_until_idle(t)
    assert a.finished and c.finished and c.first_sched >= b.finish_time


def test_dynamic_batching_waits_for_a_full_batch_or_the_timeout() -> None:
    e = _engine(batching="dynamic", max_batch_size=2, max_wait_time_s=0.5)
    a = e.add("a", _prompt(8, "a"), 0.0, max_tokens=1)
    assert e.step(0.0) is None  # one request, batch of two: wait
    assert e.next_wakeup(0.0) == pytest.approx(0.5)
    b = e.add("b", _prompt(8, "b"), 0.1, max_tokens=1)
    assert e.step(0.1) is not None  # full batch
    e.run_until_idle(0.1)
    c = e.add("c", _prompt(8, "c"), 1.0, max_tokens=1)
    assert e.step(1.2) is None
    assert e.step(1.5) is not None  # timeout reached
    e.run_until_idle(1.5)
    assert a.finished and b.finished and c.finished


def test_step_duration_follows_the_time_model() -> None:
    tm = TimeModel(step_overhead_s=0.01, prefill_s_per_token=0.001, prefill_attn_s_per_pair=0.0,
                   decode_s_per_seq=0.002, attn_s_per_kv_token=0.0001)
    e = _engine(time_model=tm, block_size=4)
    e.add("a", _prompt(10), 0.0, max_tokens=3)
    assert e.step(0.0) == pytest.approx(0.01 + 10 * 0.001)
    assert e.step(1.0) == pytest.approx(0.01 + 0.002 + 10 * 0.0001)  # attends 10 KV tokens


def test_p_d_prefiller_holds_blocks_until_released() -> None:
    e = _engine(block_size=4)
    seq = e.add("p", _prompt(20), 0.0, max_tokens=1, remote_decode=True)
    t = 0.0
    while e.has_work():
        t += e.step(t) or 0.0
    assert seq.held and seq.finish_reason == "length" and len(seq.blocks) == 5
    assert e.bm.num_free == e.cfg.num_gpu_blocks - 5
    assert e.release_kv("p") and not e.release_kv("p")
    assert e.bm.num_free == e.cfg.num_gpu_blocks


def test_p_d_prefiller_hold_times_out() -> None:
    e = _engine(block_size=4, kv_hold_timeout_s=2.0)
    e.add("p", _prompt(20), 0.0, max_tokens=1, remote_decode=True)
    end = e.run_until_idle(check=True)
    assert end >= 2.0 and not e.held
    assert e.bm.num_free == e.cfg.num_gpu_blocks


def test_p_d_decoder_pays_transfer_time_instead_of_prefill() -> None:
    tm = TimeModel(kv_transfer_latency_s=0.5, kv_transfer_s_per_token=0.01)
    e = _engine(block_size=4, time_model=tm)
    seq = e.add("d", _prompt(21), 0.0, max_tokens=3, remote_prefill=True)
    e.step(0.0)
    assert seq.status == 2 and seq.kv_ready_at == pytest.approx(0.5 + 20 * 0.01)
    e.run_until_idle(0.0, check=True)
    assert seq.num_output == 3 and seq.cached_tokens == 20
    assert seq.first_token > 0.7
    assert e.stats.iteration_tokens.sum == 3  # one computed prompt token + two decodes


def test_abort_frees_blocks() -> None:
    e = _engine(block_size=4)
    seq = e.add("a", _prompt(20), 0.0, max_tokens=50)
    e.step(0.0)
    e.step(0.1)
    e.abort(seq, 0.2)
    assert seq.finish_reason == "abort" and e.num_running == 0
    e.run_until_idle(0.2, check=True)
    assert e.bm.num_free == e.cfg.num_gpu_blocks


def test_admission_errors() -> None:
    e = _engine(max_waiting=1, num_gpu_blocks=4, block_size=4)  # max_model_len fits the cache: 16
    e.add("a", _prompt(4), 0.0, max_tokens=1)
    with pytest.raises(QueueFull):
        e.add("b", _prompt(4), 0.0, max_tokens=1)
    e.run_until_idle()
    with pytest.raises(RequestTooLong):
        e.add("c", _prompt(10), 0.0, max_tokens=10)  # 20 tokens > 16


def test_without_max_tokens_the_length_is_sampled_and_ends_with_stop() -> None:
    e = _engine(output_len_mean=20)
    seqs = [e.add(str(i), _prompt(4, str(i)), 0.0) for i in range(20)]
    e.run_until_idle()
    assert {s.finish_reason for s in seqs} == {"stop"}
    assert len({s.num_output for s in seqs}) > 1


def test_embedding_requests_finish_after_prefill() -> None:
    e = _engine()
    seq = e.add("e", _prompt(30), 0.0, pooling=True)
    e.run_until_idle()
    assert seq.finished and seq.num_output == 0 and e.stats.steps == 1


def test_same_seed_same_run() -> None:
    def run() -> list[tuple[float, int]]:
        e = _engine(seed=7, num_gpu_blocks=20, block_size=4, time_model=TimeModel(jitter=0.2))
        seqs = [e.add(str(i), _prompt(6 + i, str(i % 3)), i * 0.01) for i in range(12)]
        e.run_until_idle()
        return [(s.finish_time, s.num_output) for s in seqs]

    assert run() == run()
