"""``bench.routing.floor``: the TTFT floor is the simulator's time model applied to the uncached part of a prompt, the
E2E floor adds the answer's decode steps alone, and the throughput ceiling divides the schedule's answer tokens by
the latest E2E floor's end; checked by hand on small cases and against the simulator's own engine in simulated
time."""

from __future__ import annotations

import math
from array import array

import orjson
import pytest

from bench.routing.floor import (
    Floor,
    cacheable_prefixes,
    decode_seconds,
    prefill_seconds,
    prompt_ids,
    request_floors,
    throughput_ceiling,
)
from bench.routing.workloads import Request
from epp_sim import Engine, SimConfig, TimeModel

TM = TimeModel()


@pytest.mark.parametrize(("prompt", "cached", "expected"), [
    # 5.5 ms + 30 us x 1,000 + 1 ns x 1,000 x (0 + 1,001 / 2): docs/simulator.md's "about 36 ms"
    (1000, 0, 0.0055 + 0.030 + 1000 * 500.5e-9),
    # 992 cached: 8 tokens left, attending to 992 + 4.5 keys on average
    (1000, 992, 0.0055 + 8 * 30e-6 + 8 * 996.5e-9),
    # 20,000 tokens in chunks of 8,192, 8,192 and 3,616: (query, key) pairs 33,558,528 + 100,667,392 + 65,784,080
    (20000, 0, 3 * 0.0055 + 20000 * 30e-6 + 200_010_000e-9),
    (1000, 1000, 0.0),
], ids=["cold", "cached-but-a-block", "chunked", "nothing-left"])
def test_prefill_seconds_by_hand(prompt: int, cached: int, expected: float) -> None:
    assert math.isclose(prefill_seconds(TM, prompt, cached, 8192), expected, rel_tol=1e-12)


def _ids(tokens: list[int]) -> bytes:
    return array("I", tokens).tobytes()


def test_cacheable_prefix_is_whole_blocks_seen_before_and_at_most_prompt_minus_one() -> None:
    first = list(range(40))
    prompts = [
        first,                                    # nothing before it
        first[:35] + [999] * 5,                   # shares 35 tokens: 2 whole blocks of 16
        first,                                    # all 40 seen: 2 whole blocks (the last 8 tokens are no block)
        first[:32],                               # 32 seen, but at most 31 tokens: 1 block
        [7] + first[1:40],                        # differs in block 0: nothing
    ]
    assert cacheable_prefixes([_ids(p) for p in prompts], 16) == [(40, 0), (40, 32), (40, 32), (32, 16), (40, 0)]


def test_decode_seconds_by_hand() -> None:
    # 3 tokens after the first, attending to 100, 101 and 102 KV tokens: 3 x (5.5 ms + 15 us) + 45 ns x 303
    assert math.isclose(decode_seconds(TM, 100, 4), 3 * (0.0055 + 15e-6) + 303 * 45e-9, rel_tol=1e-12)
    assert decode_seconds(TM, 100, 1) == decode_seconds(TM, 100, 0) == 0.0  # the first token ends the prefill


def test_the_ceiling_is_every_answer_token_over_the_latest_end_of_an_e2e_floor() -> None:
    floors = [Floor(0.0, 0.01, 2.0, 300), Floor(1.0, 0.01, 4.0, 500), Floor(3.5, 0.01, 1.0, 200)]
    assert throughput_ceiling(floors) == pytest.approx(1000 / 5.0)  # the second one ends last, at 5 s
    assert math.isnan(throughput_ceiling([]))


def _chat(index: int, offset: float, system: str, question: str, max_tokens: int = 1) -> Request:
    body = {"model": "m", "max_tokens": max_tokens, "messages": [{"role": "system", "content": system},
                                                        {"role": "user", "content": question}]}
    return Request(index, offset, "/v1/chat/completions", orjson.dumps(body))


def test_the_floors_equal_the_engines_ttft_and_e2e_on_an_idle_server_holding_the_prefix() -> None:
    system = "s" * 4 * 2000  # 2,000 tokens of system prompt
    requests = [_chat(0, 0.0, system, "q" * 4 * 300, max_tokens=40),
                _chat(1, 1.0, system, "r" * 4 * 700, max_tokens=300)]
    floors = request_floors(requests)
    engine = Engine(SimConfig())
    now = 0.0
    for request, floor in zip(requests, floors):
        max_tokens = orjson.loads(request.body)["max_tokens"]
        seq = engine.add(str(request.index), array("I", prompt_ids(request)), now, max_tokens=max_tokens)
        now = engine.run_until_idle(now)
        assert (floor.offset, floor.output, seq.num_output) == (request.offset, max_tokens, max_tokens)
        assert math.isclose(seq.first_token - seq.arrival, floor.ttft, rel_tol=1e-12)
        assert math.isclose(seq.finish_time - seq.arrival, floor.e2e, rel_tol=1e-9)
    assert floors[1].ttft < floors[0].ttft / 2  # the second one finds the system prompt cached


def test_the_floor_reads_the_simulators_tokenizer_and_chat_template() -> None:
    request = _chat(0, 0.0, "abcd", "efgh")
    # "<|system|>\nabcd\n<|user|>\nefgh\n<|assistant|>\n" is 43 bytes: 11 tokens, the last one zero-padded
    assert len(prompt_ids(request)) == 4 * 11
