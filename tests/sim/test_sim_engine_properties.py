"""Property tests of the engine under random workloads and tight KV caches.

- blocks are never over-allocated or leaked (reference counts equal holders, every
  block is free again at the end);
- every admitted request finishes, even under heavy preemption;
- a prefix-cache hit only ever returns a block written for the same token prefix
  (and LoRA / cache salt);
- token counts match: each request generated exactly what its usage reports.
Requests may also be P/D halves: prefiller blocks held until a timeout, decoder KV
pulled from a (virtual) prefiller.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp_sim import Engine, RequestTooLong, Seq, SimConfig

PREFIXES = ([], [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9, 9, 9], [5] * 12)

request = st.fixed_dictionaries(
    {
        "prefix": st.sampled_from(range(len(PREFIXES))),
        "suffix": st.lists(st.integers(0, 3), min_size=1, max_size=12),
        "max_tokens": st.one_of(st.none(), st.integers(1, 40)),
        "arrival_step": st.integers(0, 30),
        "priority": st.integers(0, 2),
        "lora": st.sampled_from([None, None, "a", "b"]),
        "salt": st.sampled_from([None, None, "s"]),
        "remote": st.sampled_from([None, None, None, "prefill", "decode"]),
    }
)
config = st.fixed_dictionaries(
    {
        "num_gpu_blocks": st.integers(6, 40),
        "block_size": st.sampled_from([1, 2, 4, 8]),
        "max_num_seqs": st.integers(1, 8),
        "max_num_batched_tokens": st.integers(4, 64),
        "batching": st.sampled_from(["continuous", "continuous", "static", "dynamic"]),
        "max_wait_time_s": st.sampled_from([0.0, 0.02]),
        "enable_chunked_prefill": st.booleans(),
        "enable_prefix_caching": st.booleans(),
        "max_loras": st.integers(1, 2),
        "output_len_mean": st.just(8),
        "kv_hold_timeout_s": st.sampled_from([0.0, 0.05]),
    }
)


def _key(seq: Seq, i: int, bs: int) -> tuple[Any, ...]:
    return (tuple(seq.all_ids[: (i + 1) * bs]), seq.lora, seq.salt_key)


def _watch_prefix_reuse(engine: Engine) -> None:
    """Wrap the allocator: remember which sequence wrote each fresh block, and check that
    every hit block was written for exactly the same prefix."""
    bm, bs = engine.bm, engine.cfg.block_size
    written: dict[int, tuple[Seq, int]] = {}
    allocate = bm.allocate

    def checked(seq: Seq, upto: int, hits: list[int] = []) -> bool:  # noqa: B006
        before = len(seq.blocks)
        if not allocate(seq, upto, hits):
            return False
        for i, b in enumerate(hits):
            src, j = written[b]
            assert j == before + i, "hit block sits at a different position"
            assert _key(src, j, bs) == _key(seq, before + i, bs), "hit of a different prefix"
        for i in range(before + len(hits), len(seq.blocks)):
            written[seq.blocks[i]] = (seq, i)
        return True

    bm.allocate = checked  # type: ignore[method-assign]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg_fields=config, requests=st.lists(request, min_size=1, max_size=14))
def test_engine_invariants(cfg_fields: dict[str, Any], requests: list[dict[str, Any]]) -> None:
    cfg = SimConfig(lora_adapters=["a", "b"], **cfg_fields)
    engine = Engine(cfg)
    _watch_prefix_reuse(engine)
    pending = sorted(enumerate(requests), key=lambda r: r[1]["arrival_step"])
    admitted: list[Seq] = []
    t, step = 0.0, 0
    while pending or engine.has_work() or engine.held:
        while pending and pending[0][1]["arrival_step"] <= step:
            i, r = pending.pop(0)
            prompt = PREFIXES[r["prefix"]] + r["suffix"]
            try:
                seq = engine.add(
                    str(i), prompt, t, max_tokens=r["max_tokens"], priority=r["priority"],
                    lora=r["lora"], cache_salt=r["salt"], remote_decode=r["remote"] == "decode",
                    remote_prefill=r["remote"] == "prefill",
                )
            except RequestTooLong:
                assert len(prompt) + (r["max_tokens"] or 1) > cfg.kv_capacity_tokens
                continue
            admitted.append(seq)
        duration = engine.step(t)
        engine.check()
        if duration is None:
            wakeup = engine.next_wakeup(t)
            t = wakeup if wakeup is not None else t + 0.01
        else:
            t += duration
        step += 1
        assert step < 20_000, "starvation: the workload did not drain"

    stats = engine.stats
    assert all(s.finished for s in admitted)
    assert engine.bm.num_free == cfg.num_gpu_blocks, "blocks leaked"
    for s in admitted:
        assert s.num_output == s.max_output
        assert s.num_tokens == s.num_prompt + s.num_output
        assert s.finish_reason == ("length" if s.stop_reason == "length" else "stop")
        assert 0 <= s.cached_tokens < s.num_prompt and not s.held
    assert stats.generation_tokens == sum(s.num_output for s in admitted)
    assert stats.prompt_tokens == sum(s.num_prompt for s in admitted)
    assert sum(stats.finished.values()) == len(admitted)
