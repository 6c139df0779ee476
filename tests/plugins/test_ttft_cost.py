"""ttft-cost-scorer: the predicted time to first token per endpoint, through the real config loader, Director and
scheduler with the shipped config/cost-model.yaml (prefix reuse, queued work, spilling a hot prefix, the learnt
speed of a slow server, the bookkeeping from dispatch to the end) and its parameter errors."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.errors import ConfigError
from epp.framework.endpoint import EndpointSpec, Metrics
from epp.framework.plugins import CycleState, ResponseInfo
from epp.plugins.scorers.ttft_cost import METRICS_MAX_AGE, EndpointLoad, TtftCostScorer
from epp.scheduling.director import Director, RequestContext

from .helpers import registry, req

PROFILE = Path(__file__).resolve().parents[2] / "config" / "cost-model.yaml"
HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def scorer_only(params: str = "") -> str:
    """A config whose one profile is this scorer (with the flow-style ``params``, e.g. ``{decodeWeight: 1}``)."""
    parameters = f"  parameters: {params}\n" if params else ""
    return ("plugins:\n- type: ttft-cost-scorer\n" + parameters + "- type: max-score-picker\nschedulingProfiles:\n"
            "- name: default\n  plugins: [{pluginRef: ttft-cost-scorer}, {pluginRef: max-score-picker}]\n")


def director(n: int, text: str | None = None, *, raw: str | None = None) -> tuple[Director, TtftCostScorer, Clock]:
    """A Director over the shipped profile (or the plugins and profiles ``text``, or the whole config ``raw``) and
    ``n`` idle, freshly scraped endpoints e0, e1, ..."""
    store = Datastore()
    store.replace_all([EndpointSpec(f"e{i}", f"10.0.0.{i + 1}", 8000) for i in range(n)])
    for e in store.endpoints():
        e.metrics = Metrics(update_time=1e12)
    store.mark_synced()
    if raw is None:
        raw = PROFILE.read_text() if text is None else HEAD + text
    pipeline = build_pipeline(*load_raw(raw, "<test>"), registry())
    scorer = pipeline.handle.first_of_type("ttft-cost-scorer")
    assert isinstance(scorer, TtftCostScorer)
    clock = scorer.clock = Clock()
    return Director(pipeline, store), scorer, clock


def words(tag: str, tokens: int) -> str:
    """About ``tokens`` estimated tokens (4 characters each) of text unique to ``tag``."""
    unit = f"{tag} "
    return (unit * (tokens * 4 // len(unit) + 1))[: tokens * 4]


def start(d: Director, *ctxs: RequestContext, slower: float = 1.0) -> None:
    """The first byte of each request, ``slower`` x its prediction after it was sent (the clock is put back)."""
    scorer = d.pipeline.handle.first_of_type("ttft-cost-scorer")
    assert isinstance(scorer, TtftCostScorer) and isinstance(scorer.clock, Clock)
    for ctx in ctxs:
        predicted = scorer.predicted(ctx.request)
        assert predicted is not None
        now = scorer.clock.now
        scorer.clock.now += predicted * slower
        d.response_started(ctx)
        scorer.clock.now = now


async def finish(d: Director, *ctxs: RequestContext, slower: float = 1.0) -> None:
    """Answer each request (first byte as :func:`start` says, then the end)."""
    for ctx in ctxs:
        start(d, ctx, slower=slower)
        d.response_complete(ctx, ResponseInfo())


async def where_the_next_goes(text: str, queued: float, gpu_blocks: int | None = 2048, *, raw: str | None = None,
                              before: int = 1) -> str:
    """Where ("holder" or "other", of 2 endpoints reporting ``gpu_blocks`` KV blocks of 16 tokens) the next request
    of a 2,000-token system prompt goes under the config ``text`` (or the whole config ``raw``), after ``before``
    requests of it, all but the first on one endpoint (the holder), which then has ``queued`` tokens of prefill
    queued."""
    d, scorer, _ = director(2, text, raw=raw)
    for e in d.datastore.endpoints():
        e.metrics = Metrics(update_time=1e12, num_gpu_blocks=gpu_blocks, block_size=16)
    system = words("system", 2000)
    targets = []
    for i in range(before):
        ctx = await d.route(req(system + words(f"q{i}", 100)))
        targets.append(ctx.target.name)
        await finish(d, ctx)
    holder = targets[-1]
    assert set(targets[1:]) <= {holder}  # the prefix's home from its second request on (prefixHomes), or its holder
    scorer.load(holder).pending_tokens = queued
    ctx = await d.route(req(system + words(f"q{before}", 100)))
    await finish(d, ctx)
    return "holder" if ctx.target.name == holder else "other"


def test_the_prediction_is_prefill_time_plus_steps_of_the_running_batch() -> None:
    scorer = TtftCostScorer("s", TtftCostScorer.Params(), handle=None)
    load = EndpointLoad()
    load.pending_tokens, load.running, load.context_tokens = 10_000, 8, 40_000
    step = 0.0055 + 1.5e-5 * 8 + 4.5e-8 * 40_000
    work = 10_000 + 7_000
    assert scorer.predict(load, 7_000) == pytest.approx(3e-5 * work + math.ceil(work / 8192) * step)
    assert scorer.predict(EndpointLoad(), 1) == pytest.approx(3e-5 + 0.0055)   # one step for one token


def test_queued_work_can_count_in_steps_of_its_own_and_more_than_once() -> None:
    load = EndpointLoad()
    load.pending_tokens, load.running, load.context_tokens = 500, 8, 40_000
    step = 0.0055 + 1.5e-5 * 8 + 4.5e-8 * 40_000
    plain = TtftCostScorer("s", TtftCostScorer.Params(), handle=None)
    apart = TtftCostScorer("s", TtftCostScorer.Params.model_validate({"pendingSteps": True, "pendingWeight": 3}),
                           handle=None)
    assert plain.predict(load, 500) == pytest.approx(3e-5 * 1000 + step)  # both prompts fit one step
    assert apart.predict(load, 500) == pytest.approx(3e-5 * (3 * 500 + 500) + 2 * step)
    assert apart.predict(EndpointLoad(), 500) == pytest.approx(plain.predict(EndpointLoad(), 500))  # nothing queued


@pytest.mark.parametrize("params, queued, chosen", [
    ("{}", 500, "holder"),                              # 2,000 missing tokens cost more than the holder's queue
    ("{spill: true}", 500, "other"),                    # the holder is computing a prefill: the idle one gets a copy
    ("{spill: true}", 0, "holder"),                     # an idle holder: nothing to spill
    ("{spill: true, spillTokens: 1000}", 500, "holder"),  # the copy would be larger than spillTokens
    ("{spill: true, moveRatio: 0.5}", 100, "other"),    # the copy's target is not charged as a move (else: holder)
    ("{moveRatio: 0.5}", 100, "holder"),
], ids=["no-spill", "spill", "idle-holder", "copy-too-large", "spill-uncharged", "no-spill-charged"])
async def test_spill_copies_a_shared_prefix_to_an_idle_endpoint_while_its_holders_compute(
        params: str, queued: int, chosen: str) -> None:
    assert await where_the_next_goes(scorer_only(params), queued, gpu_blocks=None) == chosen


async def test_with_spill_shares_a_prefix_spills_only_once_that_many_requests_matched_it() -> None:
    d, scorer, _ = director(2, scorer_only("{spill: true, spillShares: 3}"))
    system = words("system", 2000)
    first = await d.route(req(system + words("q0", 100)))   # nobody holds it yet: not a sighting
    await finish(d, first)
    holder = first.target.name
    chosen = []
    for i in range(1, 4):
        scorer.load(holder).pending_tokens = 500          # the holder is computing another prompt each time
        ctx = await d.route(req(system + words(f"q{i}", 100)))
        chosen.append(ctx.target.name == holder)
        await finish(d, ctx)
        scorer.load(holder).pending_tokens = 0
    assert chosen == [True, True, False]                  # the third request to match the holder spills


@pytest.mark.parametrize("room, gpu_blocks, chosen", [
    (1.0, 200, "other"),    # 2,000 tokens of shared prefix fit in 3,200 of KV: the copy evicts none of them
    (0.5, 200, "holder"),   # they do not fit in half of it
    (1.0, None, "holder"),  # a server that does not say its size has no room
], ids=["room", "no-room", "size-unknown"])
async def test_with_spill_room_a_prefix_spills_only_where_every_shared_prefix_fits(
        room: float, gpu_blocks: int | None, chosen: str) -> None:
    params = scorer_only(f"{{spill: true, spillRoom: {room}}}")
    assert await where_the_next_goes(params, 500, gpu_blocks=gpu_blocks) == chosen


@pytest.mark.parametrize("room, chosen", [
    (None, "holder"),   # 2,000 missing tokens cost more than the holder's queue
    (1.0, "other"),     # the shared prefix fits: it no longer steers, and the holder has work queued
    (0.05, "holder"),   # 1,638 tokens of room: it does not fit, so the cache steers again
], ids=["off", "fits", "does-not-fit"])
async def test_with_fit_placement_a_shared_prefix_that_fits_does_not_steer_placement(
        room: float | None, chosen: str) -> None:
    params = scorer_only(f"{{spillRoom: {room}, fitPlacement: true}}" if room else "")
    assert await where_the_next_goes(params, 100) == chosen


@pytest.mark.parametrize("profile, chosen", [
    ("cost-model.yaml", "holder"),      # 2,000 missing tokens cost more than the holder's queue
    ("cost-model-fit.yaml", "other"),   # the 4th to match it: shared, with room elsewhere: where nothing waits
])
async def test_the_fit_profile_sends_a_shared_prompt_where_nothing_is_queued(profile: str, chosen: str) -> None:
    # Before it: the first request has no holder to match; the next three match it, before it is shared.
    raw = (PROFILE.parent / profile).read_text()
    assert await where_the_next_goes("", 500, raw=raw, before=4) == chosen


def test_fit_placement_needs_a_room_share() -> None:
    with pytest.raises(ConfigError, match="fitPlacement needs spillRoom"):
        director(2, scorer_only("{fitPlacement: true}"))


@pytest.mark.parametrize("whole", [False, True])
async def test_book_whole_prompt_books_the_prompt_not_its_uncached_part(whole: bool) -> None:
    d, scorer, _ = director(2, scorer_only("{bookWholePrompt: true}" if whole else ""))
    system = words("system", 2000)
    first = await d.route(req(system + words("q0", 100)))
    await finish(d, first)
    ctx = await d.route(req(system + words("q1", 100)))
    booked = scorer.snapshot()[ctx.target.name]["pending_tokens"]
    if whole:
        assert booked == pytest.approx(ctx.request.input_tokens)
    else:
        assert booked < ctx.request.input_tokens / 2  # the system prompt is cached there
    await finish(d, ctx)
    assert scorer.snapshot()[ctx.target.name]["pending_tokens"] == 0


async def test_an_idle_pool_ties_and_a_request_in_flight_makes_its_endpoint_costlier() -> None:
    d, scorer, _ = director(3)
    first = await d.route(req(words("a", 4000)))
    second = await d.route(req(words("b", 4000)))
    third = await d.route(req(words("c", 4000)))
    assert len({first.target.name, second.target.name, third.target.name}) == 3
    assert scorer.snapshot()[first.target.name]["pending_tokens"] == pytest.approx(first.request.input_tokens)
    await finish(d, first, second, third)


async def test_a_request_goes_where_its_prefix_is_cached() -> None:
    d, _, _ = director(4)
    system = words("system", 3000)
    first = await d.route(req(system + words("q1", 200)))
    await finish(d, first)
    for i in range(5):
        ctx = await d.route(req(system + words(f"q{i + 2}", 200)))
        assert ctx.target.name == first.target.name
        await finish(d, ctx)


async def first_spill(raw: str) -> int:
    """How many requests of one hot prefix queue on its holder before one goes to the other endpoint (of 2)."""
    d, scorer, _ = director(2, raw=raw)
    system = words("hot", 3000)
    ctxs = [await d.route(req(system + words(f"q{i}", 300), max_tokens=150)) for i in range(40)]
    holder = ctxs[0].target.name
    spilled = [i for i, c in enumerate(ctxs) if c.target.name != holder]
    assert spilled, "every request queued behind the holder"
    await finish(d, *ctxs)
    assert all(v["pending_tokens"] == 0 and v["running"] == 0 for v in scorer.snapshot().values())
    return spilled[0]


async def test_a_hot_prefix_spills_to_a_second_endpoint_once_queueing_costs_more_than_recomputing_it() -> None:
    # Without the move charge it spills once the holder's queued uncached work costs more than the whole prompt
    # elsewhere, not before; the shipped profile's charge (moveRatio) holds it there longer, but not for ever.
    shipped = PROFILE.read_text()
    uncharged = await first_spill(re.sub(r"\n +(moveRatio|prefixHomes):[^\n]*", "", shipped))
    queued = 3300 + 300 * (uncharged - 1)  # the first request's whole prompt, then each later one's question
    assert queued + 300 >= 3000
    assert await first_spill(shipped) > uncharged


@pytest.mark.parametrize("miss_weight, queued_elsewhere, chosen", [
    (None, 8192, "holder"),  # every endpoint has a step's work queued: the miss is charged again, the prefix stays
    (0, 8192, "other"),      # without that charge the shorter queue wins
    (None, 0, "other"),      # an idle endpoint: no pressure, only this request's TTFT counts
], ids=["pressure-keeps-prefix", "no-miss-weight", "idle-endpoint"])
async def test_under_pressure_a_miss_costs_the_pool_its_work(miss_weight: int | None, queued_elsewhere: int,
                                                              chosen: str) -> None:
    d, scorer, _ = director(2, scorer_only("" if miss_weight is None else f"{{missWeight: {miss_weight}}}"))
    system = words("system", 2000)
    first = await d.route(req(system + words("q0", 100)))
    await finish(d, first)
    names = {"holder": first.target.name, "other": ({"e0", "e1"} - {first.target.name}).pop()}
    scorer.load(names["holder"]).pending_tokens = queued_elsewhere + 3000   # it has more work queued
    scorer.load(names["other"]).pending_tokens = queued_elsewhere
    ctx = await d.route(req(system + words("q1", 100)))
    assert ctx.target.name == names[chosen]


@pytest.mark.parametrize("move, queued, prompt, chosen", [
    (None, 2000, "turn", "other"),    # without the charge 2,000 queued tokens outweigh re-prefilling 1,400
    (0.1, 2000, "turn", "holder"),    # charged 0.1 s, the other endpoint costs more: the session stays
    (0.1, 6000, "turn", "other"),     # the holder's queue costs more than the charge: it moves after all
    (0.1, 2000, "new", "other"),      # a prompt nobody holds is charged nowhere: the shorter queue wins
], ids=["no-charge-moves", "charge-keeps", "queue-beyond-charge-moves", "new-prefix-uncharged"])
async def test_move_seconds_keeps_a_session_where_its_history_is_until_queueing_there_costs_more(
        move: float | None, queued: int, prompt: str, chosen: str) -> None:
    d, scorer, _ = director(2, scorer_only("" if move is None else f"{{moveSeconds: {move}}}"))
    turn = words("system", 1000) + words("t1", 200)
    first = await d.route(req(turn))
    await finish(d, first)
    names = {"holder": first.target.name, "other": ({"e0", "e1"} - {first.target.name}).pop()}
    scorer.load(names["holder"]).pending_tokens = queued
    text = turn + words("t2", 200) if prompt == "turn" else words("unrelated", 1400)
    ctx = await d.route(req(text))
    assert ctx.target.name == names[chosen]


@pytest.mark.parametrize("homes, b_home", [(True, "other"), (False, "first")], ids=["homes", "no-homes"])
async def test_prefix_homes_give_each_repeated_prefix_its_own_endpoint(homes: bool, b_home: str) -> None:
    d, _, _ = director(2, scorer_only(f"{{moveSeconds: 0.1, prefixHomes: {str(homes).lower()}}}"))
    a, b = words("appa", 1000), words("appb", 1000)
    a1 = await d.route(req(a + words("a1", 100)))
    await finish(d, a1)
    a2 = await d.route(req(a + words("a2", 100)))     # a's second request: a gets its home where it is
    await finish(d, a2)
    b1 = await d.route(req(b + words("b1", 100)))     # a new prefix, held nowhere: the cheapest (tied) endpoint
    await finish(d, b1)
    b2 = await d.route(req(b + words("b2", 100)))     # b's second request gives b a home: the one without any
    await finish(d, b2)
    assert a2.target.name == a1.target.name
    expected = {"other": ({"e0", "e1"} - {a1.target.name}).pop(), "first": b1.target.name}[b_home]
    assert b2.target.name == expected


async def test_every_endpoint_holding_a_prefix_keeps_it_so_its_copies_balance_by_queue() -> None:
    # Once a hot prefix has spilt, its home is not charged less than the copy: sending it to either evicts nothing.
    d, scorer, _ = director(2, scorer_only("{moveSeconds: 0.1, prefixHomes: true}"))
    hot = words("hot", 2000)
    first = await d.route(req(hot + words("q0", 100)))
    await finish(d, first)
    second = await d.route(req(hot + words("q1", 100)))  # the second request: the prefix's home, where it is
    await finish(d, second)
    home = second.target.name
    copy = ({"e0", "e1"} - {home}).pop()
    assert home == first.target.name
    scorer.load(home).pending_tokens = 10_000   # 0.3 s queued: worth the 0.1 s charge and a re-prefill elsewhere
    spilt = await d.route(req(hot + words("q2", 100)))
    await finish(d, spilt)
    assert spilt.target.name == copy
    for busy, chosen in [(home, copy), (copy, home)]:  # 1,000 queued tokens (30 ms) are less than the charge
        scorer.load(home).pending_tokens = scorer.load(copy).pending_tokens = 0
        scorer.load(busy).pending_tokens = 1000
        ctx = await d.route(req(hot + words(f"q-{busy}", 100)))
        assert ctx.target.name == chosen
        await finish(d, ctx)


async def test_a_slow_endpoint_is_learnt_and_avoided() -> None:
    d, scorer, clock = director(2)
    for i in range(20):  # two at a time, so each endpoint gets one; e1 answers 3x slower than predicted
        pair = [await d.route(req(words(f"r{i}x{j}", 500))) for j in range(2)]
        for ctx in pair:
            await finish(d, ctx, slower=3.0 if ctx.target.name == "e1" else 1.0)
    speeds = {name: v["speed"] for name, v in scorer.snapshot().items()}
    assert speeds["e0"] == pytest.approx(1.0) and speeds["e1"] > 1.5
    # e0 takes requests until its queue makes it slower than the idle e1: not at once, and exactly then.
    busy: list[RequestContext] = []
    while not busy or busy[-1].target.name == "e0":
        queued = scorer.load("e0").pending_tokens
        busy.append(await d.route(req(words(f"busy{len(busy)}", 500))))
    assert len(busy) >= 3
    n = busy[-1].request.input_tokens
    assert speeds["e0"] * scorer.predict(scorer.load("e0"), n) > speeds["e1"] * scorer.predict(EndpointLoad(), n)
    assert queued == pytest.approx(sum(c.request.input_tokens for c in busy[:-1]))
    await finish(d, *busy)


async def test_the_speed_prior_holds_back_a_servers_first_answers_not_its_later_ones() -> None:
    """speedPriorSeconds: one answer 3x slower than predicted swings a server's speed by half under the default
    50 ms prior and hardly under a 2 s one; a hundred such answers convince both (the prior decays with them)."""
    speeds = []
    for prior in ("0.05", "2.0"):
        d, scorer, _ = director(1, scorer_only(f"{{speedPriorSeconds: {prior}}}"))
        learnt = []
        for i in range(100):
            await finish(d, await d.route(req(words(f"r{i}", 500))), slower=3.0)
            learnt.append(scorer.snapshot()["e0"]["speed"])
        speeds.append((learnt[0], learnt[-1]))
    (default_first, default_last), (held_first, held_last) = speeds
    assert default_first > 1.5 and held_first < 1.05
    assert default_last == pytest.approx(3.0, rel=0.01) and held_last == pytest.approx(3.0, rel=0.05)


async def test_bookkeeping_from_dispatch_to_the_end() -> None:
    d, scorer, clock = director(1)
    prompt = words("x", 1000)
    ctx = await d.route(req(prompt, max_tokens=100))
    n = ctx.request.input_tokens
    assert scorer.snapshot()["e0"] == {"pending_tokens": n, "running": 0, "context_tokens": 0, "speed": 1.0,
                                        "decode_speed": 1.0}
    clock.now += 0.5
    d.response_started(ctx)
    state = scorer.snapshot()["e0"]
    assert (state["pending_tokens"], state["running"], state["context_tokens"]) == (0, 1, n + 50)
    assert state["speed"] > 1.0                      # 0.5 s for a 40 ms prediction
    d.response_complete(ctx, ResponseInfo())
    d.response_complete(ctx, ResponseInfo())         # idempotent
    state = scorer.snapshot()["e0"]
    assert (state["pending_tokens"], state["running"], state["context_tokens"]) == (0, 0, 0)
    abandoned = await d.route(req(prompt))           # ended before its first byte: its pending work goes
    d.response_complete(abandoned, ResponseInfo(status=499, error=True))
    assert scorer.snapshot()["e0"]["pending_tokens"] == 0


async def test_decode_weight_prefers_the_endpoint_with_the_lighter_batch_for_a_long_answer() -> None:
    d, scorer, _ = director(2, scorer_only("{decodeWeight: 1}"))
    running = [await d.route(req(words(f"long{i}", 2000), max_tokens=2000)) for i in range(2)]
    heavy = await d.route(req(words("heavy", 8000), max_tokens=500))
    start(d, *running, heavy)                        # all three decode now
    lighter = {"e0", "e1"} - {heavy.target.name}
    ctx = await d.route(req(words("answer", 10), max_tokens=4000))
    assert {ctx.target.name} == lighter
    await finish(d, *running, heavy, ctx)


@pytest.mark.parametrize("learn", [False, True], ids=["first-byte-speed", "decode-speed"])
async def test_learn_decode_speed_tells_a_slow_decoder_from_its_first_bytes(learn: bool) -> None:
    """e0 gives its first bytes when predicted but decodes 3x slower than its steps predict (its answers end 2x the
    time after e1's, which end as predicted). Learnt from the answers' decode times, e0's decode speed is 3 after one
    answer, and the next goes to e1; without it nothing tells them apart."""
    d, scorer, clock = director(2, scorer_only(f"{{learnDecodeSpeed: {str(learn).lower()}}}"))
    pair = [await d.route(req(words(f"r{j}", 100), max_tokens=200)) for j in range(2)]  # one on each
    start(d, *pair)
    for ctx in sorted(pair, key=lambda c: c.target.name, reverse=True):  # e1's answer ends first
        clock.now += 199 * 0.00558 * (2 if ctx.target.name == "e0" else 1)  # 199 steps of about 5.58 ms
        d.response_complete(ctx, ResponseInfo(completion_tokens=200))
    state = scorer.snapshot()
    assert state["e0"]["speed"] == pytest.approx(1.0) and state["e1"]["speed"] == pytest.approx(1.0)
    if learn:
        assert state["e0"]["decode_speed"] == pytest.approx(3.0, rel=0.05)  # the 50 ms prior holds it a little
        assert state["e1"]["decode_speed"] == pytest.approx(1.0, rel=0.02)
        assert (await d.route(req(words("long", 100), max_tokens=2000))).target.name == "e1"
    else:
        assert state["e0"]["decode_speed"] == state["e1"]["decode_speed"] == 1.0


async def test_a_long_prompt_computed_during_an_answer_does_not_make_its_decoder_look_slow() -> None:
    """While a 200-token answer decodes on the only endpoint, an 8,000-token prompt is computed there; the answer ends
    that prompt's prefill (8,000 x 30 us) later than its steps alone predict. Its decoder's steps shared that work, so
    the decode speed stays 1; counted as slowness (1.2 here) the endpoint would look slow for the next ~20 answers."""
    d, scorer, clock = director(1, scorer_only("{learnDecodeSpeed: true}"))
    answer = await d.route(req(words("answer", 100), max_tokens=200))
    start(d, answer)
    prompt = await d.route(req(words("long", 8000), max_tokens=2))
    start(d, prompt)
    clock.now += 199 * 0.00558 + 8000 * 3.0e-5
    d.response_complete(answer, ResponseInfo(completion_tokens=200))
    assert scorer.snapshot()["e0"]["decode_speed"] == pytest.approx(1.0, rel=0.02)
    await finish(d, prompt)


@pytest.mark.parametrize("remaining, chosen", [(False, "fewer"), (True, "ending")], ids=["now", "remaining"])
async def test_decode_remaining_counts_a_running_answer_only_for_the_steps_it_has_left(remaining: bool,
                                                                                       chosen: str) -> None:
    """One endpoint runs two answers of 2,000 tokens begun 10.5 s ago (about 135 steps left), the other one just
    begun. A 1,000-token answer shares every step with the fresh one but only the last ~135 of the old ones: counted
    as the batch is now it goes where fewer run; counted by the steps they have left, where they end."""
    d, scorer, clock = director(2, scorer_only(f"{{decodeWeight: 1, decodeRemaining: {str(remaining).lower()}}}"))
    old = []
    for i in range(3):
        old.append(await d.route(req(words(f"old{i}", 100), max_tokens=2000)))
        start(d, old[-1])
    ending = max(("e0", "e1"), key=[ctx.target.name for ctx in old].count)
    clock.now += 10.5
    await finish(d, *(ctx for ctx in old if ctx.target.name != ending))
    fresh = await d.route(req(words("fresh", 100), max_tokens=2000))
    assert fresh.target.name != ending                # nothing runs there: cheapest either way
    start(d, fresh)
    ctx = await d.route(req(words("answer", 100), max_tokens=1000))
    assert ctx.target.name == (ending if chosen == "ending" else fresh.target.name)
    await finish(d, ctx, fresh, *(c for c in old if c.target.name == ending))
    assert scorer.snapshot()[ending]["running"] == 0 and not scorer.load(ending).decoding


@pytest.mark.parametrize("stream, chosen", [(False, "overrun"), (True, "ending")], ids=["steps", "chunks"])
async def test_decode_remaining_reads_a_streamed_answers_progress_from_its_chunks(stream: bool, chosen: str) -> None:
    """Two 2,000-token answers: one began 2,000 steps ago but has streamed only 1,000 chunks (prompts computed beside
    it slowed it), the other began 1,500 steps ago and streamed 1,500. By the steps they had time for, the first is
    over, and a 1,000-token answer goes beside it; by their chunks it has 1,000 left, so the answer goes beside the
    one that ends within 500. Not streamed, no chunks come, and the steps decide as before."""
    d, scorer, clock = director(2, scorer_only("{decodeWeight: 1, decodeRemaining: true}"))
    step = 0.0055 + 1.5e-5 + 4.5e-8 * (100 + 1000)  # one 2,000-token answer's step (prompt plus half its output)
    overrun = await d.route(req(words("overrun", 100), max_tokens=2000, stream=stream))
    start(d, overrun)
    clock.now += 500 * step
    ending = await d.route(req(words("ending", 100), max_tokens=2000, stream=stream))
    assert ending.target.name != overrun.target.name
    start(d, ending)
    clock.now += 1500 * step
    for ctx, chunks in ((overrun, 999), (ending, 1499)):
        for _ in range(chunks if stream else 0):
            d.stream_chunk(ctx)
    ctx = await d.route(req(words("answer", 100), max_tokens=1000, stream=stream))
    assert ctx.target.name == (ending if chosen == "ending" else overrun).target.name
    await finish(d, ctx, overrun, ending)
    assert not scorer.load("e0").decoding and not scorer.load("e1").decoding


@pytest.mark.parametrize("params, field", [
    ("{prefillSecondsPerToken: 0}", "prefillSecondsPerToken"),
    ("{maxBatchedTokens: -1}", "maxBatchedTokens"),
    ("{learningRate: 2}", "learningRate"),
    ("{decodeWeight: -1}", "decodeWeight"),
    ("{weighVictimsByOutput: often}", "weighVictimsByOutput"),
    ("{prefilSecondsPerToken: 1}", "prefilSecondsPerToken"),
    ("{prefixMatchInfoProducerName: nope}", "prefixMatchInfoProducerName"),
    ("{moveSeconds: -0.1}", "moveSeconds"),
    ("{moveRatio: -1}", "moveRatio"),
    ("{prefixHomes: sometimes}", "prefixHomes"),
], ids=["zero-rate", "negative-budget", "rate-above-one", "negative-weight", "not-a-bool",
        "misspelt", "missing-producer", "negative-move", "negative-ratio", "homes-not-a-bool"])
def test_bad_parameters_are_errors_naming_the_plugin_and_field(params: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_pipeline(*load_raw(HEAD + f"plugins:\n- type: ttft-cost-scorer\n  parameters: {params}\n", "<t>"),
                       registry())
    assert info.value.plugin == "ttft-cost-scorer" and info.value.field == field


async def test_requests_whose_end_is_never_reported_are_dropped_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PreRequest hook after this one may raise, leaving no request context and so no end: the tracked requests
    are capped (here at 3), the oldest dropped and its pending work given back."""
    from epp.plugins.scorers import ttft_cost

    monkeypatch.setattr(ttft_cost, "MAX_JOBS", 3)
    d, scorer, _ = director(1)
    ctxs = [await d.route(req(words(f"lost{i}", 100))) for i in range(5)]
    assert [scorer.predicted(c.request) is not None for c in ctxs] == [False, False, True, True, True]
    assert scorer.snapshot()["e0"]["pending_tokens"] == pytest.approx(sum(c.request.input_tokens for c in ctxs[2:]))
    await finish(d, *ctxs[2:])
    for ctx in ctxs[:2]:
        d.response_complete(ctx, ResponseInfo())     # an end for a dropped request changes nothing
    assert scorer.snapshot()["e0"]["pending_tokens"] == 0 and scorer.snapshot()["e0"]["running"] == 0


@pytest.mark.parametrize("window, chosen", [(0, "other"), (5, "holder")], ids=["instant", "averaged"])
async def test_a_pressure_window_remembers_queues_past_an_idle_instant(window: float, chosen: str) -> None:
    """Every endpoint had a step's work queued; at this instant the other one is idle. With the pressure taken at the
    instant the miss costs nothing extra and the request leaves its prefix; averaged over 5 s it stays."""
    d, scorer, clock = director(2, scorer_only(f"{{pressureWindow: {window}}}"))
    system = words("system", 2000)
    first = await d.route(req(system + words("q0", 100)))
    await finish(d, first)
    names = {"holder": first.target.name, "other": ({"e0", "e1"} - {first.target.name}).pop()}
    for name in names.values():
        scorer.load(name).pending_tokens = 8192
    clock.now += 10
    busy = await d.route(req(words("busy", 10)))      # scored after 10 s of both busy: the average has the queues
    d.response_complete(busy, ResponseInfo())
    clock.now += 0.5
    scorer.load(names["holder"]).pending_tokens = 3000
    scorer.load(names["other"]).pending_tokens = 0
    ctx = await d.route(req(system + words("q1", 100)))
    assert ctx.target.name == names[chosen]


@pytest.mark.parametrize("weight, chosen", [(0, "crowded"), (None, "quiet")], ids=["off", "default"])
async def test_interference_weight_sends_a_long_prefill_where_it_stalls_fewest_decodes(weight: float | None,
                                                                                        chosen: str) -> None:
    """A 16k-token prefill stalls every decode running beside it for its whole length. Without the charge the endpoint
    with 20 running decodes and no queue wins (its own TTFT is shortest); with it (0.5 by default) the one with 1
    decode and a short queue does."""
    d, scorer, _ = director(2, scorer_only("" if weight is None else f"{{interferenceWeight: {weight}}}"))
    names = {"crowded": "e0", "quiet": "e1"}
    scorer.load("e0").running = 20
    scorer.load("e1").running, scorer.load("e1").pending_tokens = 1, 1000
    ctx = await d.route(req(words("long", 16_000), max_tokens=100))
    assert ctx.target.name == names[chosen]
    d.response_complete(ctx, ResponseInfo())


@pytest.mark.parametrize("weight, chosen", [(0, "crowded"), (0.25, "quiet")], ids=["off", "weighted"])
async def test_interference_weight_sends_a_long_answer_where_it_slows_fewest_decodes(weight: float,
                                                                                      chosen: str) -> None:
    """A 4,000-token answer adds its sequence to every step its neighbours take. Its own TTFT (decodeWeight 0) picks
    the endpoint with no queue and 20 decodes; the interference charge picks the one with 2 decodes and a short
    queue, with the exact cost the module doc gives."""
    d, scorer, _ = director(2, scorer_only(f"{{interferenceWeight: {weight}, decodeWeight: 0}}"))
    names = {"crowded": "e0", "quiet": "e1"}
    scorer.load("e0").running = 20
    scorer.load("e1").running, scorer.load("e1").pending_tokens = 2, 2000
    request = req(words("short", 10), max_tokens=4000)
    ctx = await d.route(request)
    assert ctx.target.name == names[chosen]
    d.response_complete(ctx, ResponseInfo())
    n = request.input_tokens
    shared_steps = 4000 * (1.5e-5 + 4.5e-8 * (n + 2000))
    e0, e1 = scorer.load("e0"), scorer.load("e1")
    endpoints = sorted(d.datastore.endpoints(), key=lambda ep: ep.name)
    assert scorer.costs(CycleState(), request, endpoints) == pytest.approx([
        scorer.predict(e0, n) + weight * 20 * (3e-5 * n + shared_steps),
        scorer.predict(e1, n) + weight * 2 * (3e-5 * n + shared_steps)])


@pytest.mark.parametrize("by_output, chosen", [(False, "few"), (True, "short")], ids=["count", "by-output"])
async def test_weighing_victims_by_output_keeps_a_long_prefill_off_long_answers(by_output: bool, chosen: str) -> None:
    """The E2E tail is the longest answers, and a 16k-token prefill stalls each decode beside it by the same time.
    Counted, 2 running answers of 1,000 tokens are fewer victims than 4 of 40; weighed by their output over the
    mean one (256 before any request) they are more."""
    d, scorer, _ = director(2, scorer_only(f"{{weighVictimsByOutput: {str(by_output).lower()}}}"))
    names = {"few": "e0", "short": "e1"}
    scorer.load("e0").running, scorer.load("e0").output_tokens = 2, 2000
    scorer.load("e1").running, scorer.load("e1").output_tokens = 4, 160
    ctx = await d.route(req(words("long", 16_000), max_tokens=100))
    assert ctx.target.name == names[chosen]
    d.response_complete(ctx, ResponseInfo())


async def test_running_outputs_are_booked_at_the_first_byte_and_given_back_at_the_end() -> None:
    d, scorer, _ = director(1, scorer_only("{weighVictimsByOutput: true}"))
    ctxs = [await d.route(req(words(f"a{i}", 10), max_tokens=n)) for i, n in enumerate((1000, 40))]
    assert scorer.load("e0").output_tokens == 0      # queued, not decoding yet
    start(d, *ctxs)
    assert scorer.load("e0").output_tokens == 1040
    await finish(d, ctxs[0])
    assert scorer.load("e0").output_tokens == 40
    d.response_complete(ctxs[1], ResponseInfo(status=499, error=True))
    assert scorer.load("e0").output_tokens == 0


PD_PROFILE = PROFILE.with_name("pd-cost-model.yaml")


def pd_director(prefill: int, decode: int) -> tuple[Director, TtftCostScorer, Clock]:
    """A Director over config/pd-cost-model.yaml and idle endpoints p0, p1, ... (prefill) and d0, d1, ... (decode)."""
    store = Datastore()
    store.replace_all([EndpointSpec(f"{role[0]}{i}", f"10.0.{n}.{i + 1}", 8000, labels={"llm-d.ai/role": role})
                       for n, (role, count) in enumerate((("prefill", prefill), ("decode", decode)))
                       for i in range(count)])
    for e in store.endpoints():
        e.metrics = Metrics(update_time=1e12)
    store.mark_synced()
    pipeline = build_pipeline(*load_raw(PD_PROFILE.read_text(), "<test>"), registry())
    scorer = pipeline.handle.first_of_type("ttft-cost-scorer")
    assert isinstance(scorer, TtftCostScorer)
    clock = scorer.clock = Clock()
    return Director(pipeline, store), scorer, clock


async def test_a_disaggregated_request_books_its_prefill_on_the_prefiller_and_its_decode_on_the_decoder() -> None:
    d, scorer, clock = pd_director(1, 1)
    ctx = await d.route(req(words("pd", 1000), max_tokens=100))
    assert ctx.result is not None and ctx.result.prefill is not None
    assert (ctx.result.prefill.name, ctx.target.name) == ("p0", "d0")
    n = ctx.request.input_tokens
    state = scorer.snapshot()
    assert (state["p0"]["pending_tokens"], state["d0"]["pending_tokens"]) == (n, 0)  # the decoder only pulls the KV
    clock.now += 2 * scorer.predicted(ctx.request)  # type: ignore[operator]
    d.response_started(ctx)                          # the decoder's first byte: the prefill is done
    state = scorer.snapshot()
    assert (state["p0"]["pending_tokens"], state["p0"]["running"]) == (0, 0)
    assert (state["d0"]["running"], state["d0"]["context_tokens"]) == (1, n + 50)
    assert state["p0"]["speed"] > 1.0 and state["d0"]["speed"] == 1.0  # the time to first byte was the prefiller's
    d.response_complete(ctx, ResponseInfo())
    assert scorer.snapshot()["d0"]["running"] == 0


async def test_prefills_queue_on_the_prefillers_and_decodes_spread_over_the_decoders() -> None:
    d, scorer, _ = pd_director(2, 2)
    first = await d.route(req(words("a", 3000), max_tokens=100))
    second = await d.route(req(words("b", 3000), max_tokens=100))  # another prompt: p0 is busy prefilling a
    assert first.result is not None and second.result is not None
    assert {first.result.prefill.name, second.result.prefill.name} == {"p0", "p1"}  # type: ignore[union-attr]
    start(d, first)
    third = await d.route(req(words("c", 3000), max_tokens=100))
    assert third.target.name != first.target.name    # first decodes there now
    await finish(d, second, third)
    d.response_complete(first, ResponseInfo())


@pytest.mark.parametrize("count_others", [False, True], ids=["own-bookings-only", "count-other-replicas"])
async def test_a_scrape_shows_the_requests_other_replicas_sent(count_others: bool) -> None:
    d, scorer, _ = director(2, scorer_only(f"{{countOtherReplicas: {str(count_others).lower()}}}"))
    endpoints = sorted(d.datastore.endpoints(), key=lambda e: e.name)
    endpoints[0].metrics = Metrics(waiting=3, running=5, update_time=time.monotonic())  # none of it this EPP's
    e0, e1 = scorer.costs(CycleState(), req(words("probe", 1000)), endpoints)
    assert (e0 > e1) if count_others else (e0 == e1)
    if count_others:  # the other replica's queue is avoided even with this EPP's own requests elsewhere
        ctxs = [await d.route(req(words(f"q{i}", 1000))) for i in range(2)]
        assert [c.target.name for c in ctxs] == ["e1", "e1"]
        await finish(d, *ctxs)


async def test_the_requests_of_this_epp_a_scrape_shows_are_not_counted_twice() -> None:
    d, scorer, _ = director(2, scorer_only("{countOtherReplicas: true}"))
    ctxs = [await d.route(req(words(f"q{i}", 1000))) for i in range(4)]
    start(d, ctxs[0])
    endpoints = list(d.datastore.endpoints())
    probe = req(words("probe", 1000))
    for e in endpoints:
        e.metrics = Metrics()  # never scraped: only this EPP's bookings count
    own = scorer.costs(CycleState(), probe, endpoints)
    for e in endpoints:  # the scrape shows exactly what this EPP sent: one started on its endpoint, the rest waiting
        mine = [c for c in ctxs if c.target.name == e.name]
        running = sum(1 for c in mine if c is ctxs[0])
        e.metrics = Metrics(waiting=len(mine) - running, running=running, update_time=time.monotonic())
    assert scorer.costs(CycleState(), probe, endpoints) == pytest.approx(own)
    for e in endpoints:  # a scrape older than the staleness bound is ignored
        e.metrics = Metrics(waiting=50, running=50, update_time=time.monotonic() - METRICS_MAX_AGE - 1)
    assert scorer.costs(CycleState(), probe, endpoints) == pytest.approx(own)
    await finish(d, *ctxs)


async def test_another_workers_bookings_count_as_if_this_process_had_made_them() -> None:
    worker0, scorer0, _ = director(2, scorer_only())
    worker1, scorer1, _ = director(2, scorer_only())
    ctxs = [await worker0.route(req(words(f"q{i}", 1000 * (i + 1)))) for i in range(3)]
    start(worker0, ctxs[0])
    endpoints = sorted(worker1.datastore.endpoints(), key=lambda e: e.name)
    probe = req(words("probe", 1000))
    alone = scorer1.costs(CycleState(), probe, endpoints)
    scorer1.set_peer_load(0, scorer0.local_load())
    # worker 1 now predicts what worker 0 predicts, although it booked nothing itself
    assert scorer1.costs(CycleState(), probe, endpoints) == pytest.approx(
        scorer0.costs(CycleState(), probe, sorted(worker0.datastore.endpoints(), key=lambda e: e.name)))
    assert scorer1.costs(CycleState(), probe, endpoints) != pytest.approx(alone)
    await finish(worker0, *ctxs)
    assert scorer0.local_load() == {}
    scorer1.set_peer_load(0, scorer0.local_load())  # a worker's latest replaces what it sent before
    assert scorer1.costs(CycleState(), probe, endpoints) == pytest.approx(alone)


def test_the_peers_bookings_are_summed_and_each_replaces_only_its_own() -> None:
    scorer = TtftCostScorer("s", TtftCostScorer.Params(), handle=None)
    scorer.set_peer_load(1, {"e0": (1, 500.0, 2, 3000.0, 200.0), "e1": (0, 0.0, 1, 1000.0, 50.0)})
    scorer.set_peer_load(2, {"e0": (2, 700.0, 0, 0.0, 0.0)})
    assert scorer.peer_totals == {"e0": (3.0, 1200.0, 2.0, 3000.0, 200.0), "e1": (0.0, 0.0, 1.0, 1000.0, 50.0)}
    scorer.set_peer_load(1, {"e0": (1, 100.0, 0, 0.0, 0.0)})  # peer 1's e1 is gone, its e0 shrank
    assert scorer.peer_totals == {"e0": (3.0, 800.0, 0.0, 0.0, 0.0)}
    scorer.set_peer_load(1, {})
    scorer.set_peer_load(2, {})
    assert scorer.peer_totals == {}
