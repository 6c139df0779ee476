"""``ttft-cost-scorer``: scores each endpoint by what sending this request there would cost, in seconds.

EPP only (the reference has none). From its own bookkeeping of what it sent each endpoint ``e`` (fresher than a
scrape) it predicts, instead of a weighted sum of unrelated signals::

    cost_e = speed_e x (ttft_e + missWeight x pressure x prefill(u_e) + interferenceWeight x victims_e x prefill(u_e))
             + decode_speed_e x (decodeWeight x output x step_e + interferenceWeight x victims_e x shared_steps)
    score  = min cost / cost_e                     # 1 for the cheapest endpoint

``ttft_e`` is e's queued prefill and this request's uncached tokens ``u_e`` in steps of its running batch; the
speeds are learnt (observed over predicted, from first bytes and, with ``learnDecodeSpeed``, whole answers); moving
a prompt off its keeper costs ``moveRatio``/``moveSeconds`` more; ``spill``/``fitPlacement`` reprice shared prefixes
(:mod:`.shared_placement`). Every term and parameter, and the runs behind them: docs/routing.md, "The cost model in
full". State is per endpoint name and per in-flight request (at most ``MAX_JOBS``), on the event loop only.

YAML::

    - type: ttft-cost-scorer
      parameters: {prefillSecondsPerToken: 3.0e-5, stepOverheadSeconds: 0.0055, missWeight: 10, decodeWeight: 0.25}
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import (
    CycleState,
    Handle,
    PreRequest,
    ResponseChunk,
    ResponseComplete,
    ResponseInfo,
    ResponseStarted,
    SchedulingResult,
    Scorer,
    SharedLoad,
)
from epp.framework.request import InferenceRequest

from ..producers.approx_prefix_cache import PRODUCER_TYPE, PrefixMatch, find_prefix_producer
from .prefix_homes import PrefixHomes
from .shared_placement import SharedPlacement
from .shared_prefixes import SharedPrefixes
from .ttft_bookings import EndpointLoad, Job, PeerBookings, plus, release
from .ttft_params import TtftCostParams

__all__ = ["TtftCostScorer", "EndpointLoad"]  # EndpointLoad: the record predict() reads (ttft_bookings)

_PRIOR_OUTPUT = 256.0
_PRIOR_UNCACHED = 512.0
_PRIOR_CONTEXT = 1024.0
_MEAN_RATE = 0.02
"""Each booked request's weight in the mean expected output, uncached prompt and context (about the last 50)."""
METRICS_MAX_AGE = 2.0
"""Seconds: a scrape older than this (the reference's default staleness threshold) says nothing of the queue now."""
MAX_JOBS = 65_536
"""In-flight requests tracked at most: a request whose end is never reported (a later PreRequest hook raised, so no
request context exists) is dropped, oldest first, once this many are tracked, so such leaks stay bounded."""


class TtftCostScorer:
    """Predicted time to first token (plus, weighted, the request's own decode time) per endpoint; see the module
    doc. State is per endpoint name and per in-flight request, on the event loop only."""

    type_name: ClassVar[str] = "ttft-cost-scorer"
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE,)

    Params = TtftCostParams  # the registry validates a config's parameters with the class's Params (ttft_params)

    def __init__(self, name: str, params: TtftCostParams, handle: Handle,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.params = params
        self.clock = clock  # replaceable: tests drive time by hand
        self._key = ""
        self._loads: dict[str, EndpointLoad] = {}
        self._jobs: dict[int, Job] = {}  # id(request): the Director passes the same object to every hook
        p = params
        self._p, self._c, self._budget = p.prefill_seconds_per_token, p.step_overhead_seconds, p.max_batched_tokens
        self._d_seq, self._d_ctx = p.decode_seconds_per_sequence, p.decode_seconds_per_context_token
        self._keep = 1.0 - p.learning_rate
        self._queued = 0.0       # the least queued work, time-averaged over pressureWindow
        self._queued_at = 0.0
        self._mean_output = _PRIOR_OUTPUT  # tokens, moving averages over booked requests
        self._mean_uncached = _PRIOR_UNCACHED
        self._mean_context = _PRIOR_CONTEXT
        self._peers = PeerBookings()  # the other --workers' bookings
        self._changed: Callable[[], None] | None = None  # called after each change of this process's bookings
        self._homes = PrefixHomes() if p.prefix_homes else None
        self._priced: tuple[int, float | None] = (0, None)  # id(request) last priced, its pendingWeight if not default
        self._placement = self._shared_placement(p)

    def _shared_placement(self, p: TtftCostParams) -> SharedPlacement | None:
        """The spill/fit repricing, with a registry of shared prefixes only when a setting reads it (None: neither
        ``spill`` nor ``fitPlacement``, so the request path does none of it)."""
        if not (p.spill or p.fit_placement):
            return None
        registry = SharedPrefixes(p.spill_shares, p.spill_window) \
            if p.fit_placement or p.spill_shares or p.spill_room else None
        return SharedPlacement(registry, spill=p.spill, spill_tokens=p.spill_tokens, shares=p.spill_shares,
                               room=p.spill_room, fit=p.fit_placement, clock=lambda: self.clock())

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """No prefix-producer parameters of its own: an auto-created producer uses the defaults."""
        return {}

    def bind(self, handle: Handle) -> None:
        self._key = find_prefix_producer(self, handle, producer_name=self.params.prefix_match_info_producer_name
                                         ).state_key

    def load(self, name: str) -> EndpointLoad:
        """The endpoint's load record (created empty)."""
        load = self._loads.get(name)
        if load is None:
            load = self._loads[name] = EndpointLoad(self.params.speed_prior_seconds)
        return load

    def remove_endpoint(self, name: str) -> None:
        """Forget a removed endpoint; requests still in flight on it finish against the detached record."""
        self._loads.pop(name, None)
        if self._homes is not None:
            self._homes.remove_endpoint(name)

    # -- prediction ------------------------------------------------------------------------------------------

    def _uncached(self, match: PrefixMatch | None, name: str, prompt: int) -> float:
        if match is None:
            return float(prompt)
        cached = match.match_blocks(name) * match.block_size_tokens
        return max(1.0, prompt - cached)  # at least the last token is computed, as vLLM's lookup leaves it

    def _step(self, load: EndpointLoad) -> float:
        return self._c + self._d_seq * load.running + self._d_ctx * load.context_tokens

    def predict(self, load: EndpointLoad, uncached: float, pending_weight: float | None = None) -> float:
        """Seconds to first token for ``uncached`` new prompt tokens behind ``load``, before the speed factor, the
        queued work counted ``pending_weight`` times (default: ``pendingWeight``)."""
        queued, budget = load.pending_tokens, self._budget
        weight = self.params.pending_weight if pending_weight is None else pending_weight
        if self.params.pending_steps:  # a request arriving while a prefill is computed cannot join that step
            steps = math.ceil(queued / budget) + math.ceil(uncached / budget)
        else:
            steps = math.ceil((queued + uncached) / budget)
        return self._p * (weight * queued + uncached) + steps * self._step(load)

    def _output(self, request: InferenceRequest) -> float:
        return request.max_tokens if request.max_tokens is not None else request.input_tokens * self.params.output_ratio

    def costs(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        """Each endpoint's predicted cost in seconds (the module doc's ``cost_e``)."""
        match = cycle.get(self._key)
        match = match if isinstance(match, PrefixMatch) else None
        prompt, output = request.input_tokens, self._output(request)
        decode = self.params.decode_weight * output
        loads = [self._seen(self.load(ep.name), ep) for ep in endpoints]
        uncached = [self._uncached(match, ep.name, prompt) for ep in endpoints]
        held = [match.match_blocks(ep.name) for ep in endpoints] if match is not None else []
        miss = self.params.miss_weight * min(1.0, self._pressure_tokens(loads) / self._budget) * self._p
        # What this request costs each decode already running there: its prefill's stall, then its own decode in
        # every step they share.
        shared_steps = output * (self._d_seq + self._d_ctx * (prompt + output / 2))
        stall = self.params.interference_weight
        spilt, fits = self._placement.repriced(match, held, endpoints, loads, uncached) \
            if self._placement is not None else ({}, False)
        weight = self.params.fit_pending_weight if fits else None
        self._priced = (id(request), weight)  # pre_request's prediction counts the queue as this pricing did
        out = []
        for i, (load, u) in enumerate(zip(loads, uncached)):
            u = spilt.get(i, u)
            victims = stall * self._victims(load)
            prefill = self.predict(load, u, weight) + miss * u + victims * self._p * u
            steps = victims * shared_steps  # decode work: its own steps, and its share of the others'
            if decode:
                steps += decode * (self._step(load) - self._relief(load, output))
            out.append(load.speed * prefill + self._decode_speed(load) * steps)
        if match is not None and (self.params.move_seconds or self.params.move_ratio):
            self._charge_moves(out, match, endpoints, held, {endpoints[i].name for i in spilt})
        return out

    def _decode_speed(self, load: EndpointLoad) -> float:
        """The factor decode time is predicted with: learnt from answers' decode times (``learnDecodeSpeed``), else the
        time-to-first-token speed."""
        return load.decode_speed if self.params.learn_decode_speed else load.speed

    def _relief(self, load: EndpointLoad, output: float) -> float:
        """(``decodeRemaining``) What the answers running there that end before this one's ``output`` tokens take off
        its step time (:meth:`EndpointLoad.relief`): the last long answer of a burst then goes where the running
        answers end soonest, not merely where fewest run now."""
        if not (self.params.decode_remaining and load.decoding and output > 0):
            return 0.0
        return load.relief(self.clock(), self._step(load), output, self._d_seq, self._d_ctx)

    def _charge_moves(self, costs: list[float], match: PrefixMatch, endpoints: list[Endpoint], held: list[int],
                      spilt: set[str]) -> None:
        """Charge every endpoint but the prompt's keepers (and the ``spilt`` targets) ``cost x moveRatio +
        moveSeconds``: moving a session or a prefix costs more than its re-prefill (the copy evicts other histories
        there, and later turns follow it), so a keeper keeps it until its own cost exceeds another's by the charge."""
        most = max(held, default=0)
        if most == 0:  # nobody holds any of it: a new prefix goes wherever it is cheapest
            return
        keepers = self._keepers(match, endpoints, held, most) | spilt
        ratio, seconds = 1.0 + self.params.move_ratio, self.params.move_seconds
        for i, ep in enumerate(endpoints):
            if ep.name not in keepers:
                costs[i] = costs[i] * ratio + seconds

    def _keepers(self, match: PrefixMatch, endpoints: list[Endpoint], held: list[int], most: int) -> set[str]:
        """The endpoints holding the most of the prompt; with ``prefixHomes``, the prefix's home instead at the
        request that gives it one (its second). Several holders of the most are all keepers: a hot prefix's copies
        balance by cost alone, since sending it to any of them evicts nothing (charging all but the home held a
        hot prefix's spill back and lengthened the E2E tail for no gain elsewhere: docs/routing.md)."""
        tops = {ep.name for ep, blocks in zip(endpoints, held) if blocks == most}
        if self._homes is None or not match.hashes:
            return tops
        home, new = self._homes.home(match.hashes[0], [ep.name for ep in endpoints])
        return {home} if home is not None and new else tops

    def _seen(self, load: EndpointLoad, endpoint: Endpoint) -> EndpointLoad:
        """``load`` plus the other ``--workers``' bookings on the endpoint (:meth:`set_peer_load`), plus
        (``countOtherReplicas``) the requests its fresh scrape shows beyond those (other replicas'): beyond the
        booked waiting count they queue at the mean uncached prompt, the rest decode at the mean context and output.
        A scrape lags by its interval, so requests that ended since it count for up to that long."""
        peers = self._peers.totals.get(endpoint.name)
        seen = load if peers is None else plus(load, peers)
        metrics = endpoint.metrics
        if not self.params.count_other_replicas or metrics.age() > METRICS_MAX_AGE:
            return seen
        others = metrics.waiting + metrics.running - seen.pending - seen.running
        if others <= 0:
            return seen
        waiting = min(others, max(0, metrics.waiting - seen.pending))
        running = others - waiting
        return plus(seen, (waiting, waiting * self._mean_uncached, running, running * self._mean_context,
                           running * self._mean_output))

    # -- sharing with the other --workers (epp.framework.plugins.SharedLoad) --------------------------------

    def local_load(self) -> dict[str, tuple[float, ...]]:
        """This process's bookings by endpoint: pending requests and tokens, running requests, context, output."""
        return {name: (ld.pending, ld.pending_tokens, ld.running, ld.context_tokens, ld.output_tokens)
                for name, ld in self._loads.items() if ld.pending or ld.running}

    def on_load_changed(self, listener: Callable[[], None]) -> None:
        """``listener`` is called after each booking, start and release (the worker link publishes then)."""
        self._changed = listener

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed()

    def set_peer_load(self, peer: int, load: dict[str, tuple[float, ...]]) -> None:
        """Worker ``peer``'s bookings replace what it sent before."""
        self._peers.set(peer, load)

    @property
    def peer_totals(self) -> dict[str, tuple[float, ...]]:
        """The other workers' bookings summed, by endpoint name (as :meth:`local_load` gives them)."""
        return self._peers.totals

    def _victims(self, load: EndpointLoad) -> float:
        """The running requests a prefill or decode there would slow: a count, or (``weighVictimsByOutput``) each
        weighed by its expected output over the mean one, since the longest answers make the E2E tail."""
        if not self.params.weigh_victims_by_output:
            return float(load.running)
        return load.output_tokens / self._mean_output

    def _pressure_tokens(self, loads: list[EndpointLoad]) -> float:
        """The least queued work over ``loads``, averaged with exponential decay over ``pressureWindow``."""
        now_queued = min((ld.pending_tokens for ld in loads), default=0.0)
        window = self.params.pressure_window
        if window <= 0:
            return now_queued
        now = self.clock()
        weight = 1.0 - math.exp(-(now - self._queued_at) / window) if self._queued_at else 1.0
        self._queued += (now_queued - self._queued) * weight
        self._queued_at = now
        return self._queued

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        costs = self.costs(cycle, request, endpoints)
        best = min(costs, default=0.0)
        return [best / c if c > 0 else 1.0 for c in costs]

    # -- bookkeeping -----------------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """Book the request as pending prefill work where its prompt is computed: the primary target, or the
        prefill endpoint when a P/D profile chose one (the decoder then only pulls the KV)."""
        target = result.target
        computes = result.prefill or target
        match = result.cycle.get(self._key)
        if self._homes is not None and isinstance(match, PrefixMatch) and match.hashes:
            self._homes.seen(match.hashes[0], target.name)
        if self._placement is not None and isinstance(match, PrefixMatch):
            self._placement.sighted(match)
        load = self.load(computes.name)
        fresh = uncached = self._uncached(match if isinstance(match, PrefixMatch) else None, computes.name,
                                          request.input_tokens)
        if self.params.book_whole_prompt:  # pessimistic about the queue, and speeds learnt against whole prompts
            uncached = float(request.input_tokens)
        priced, weight = self._priced
        predicted = self.predict(self._seen(load, computes), uncached, weight if priced == id(request) else None)
        load.pending += 1
        load.pending_tokens += uncached
        output = self._output(request)
        context = request.input_tokens + output / 2  # the mean context over its decode
        self._mean_output += (max(1.0, output) - self._mean_output) * _MEAN_RATE
        self._mean_uncached += (uncached - self._mean_uncached) * _MEAN_RATE
        self._mean_context += (context - self._mean_context) * _MEAN_RATE
        jobs = self._jobs
        if len(jobs) >= MAX_JOBS:
            release(jobs.pop(next(iter(jobs))))
        jobs[id(request)] = Job(load, self.load(target.name), target.name, uncached, context, output, predicted,
                                self.clock(), fresh)
        self._notify()

    def predicted(self, request: InferenceRequest) -> float | None:
        """The TTFT predicted when ``request`` was sent (seconds, before the speed factor); None if not booked."""
        job = self._jobs.get(id(request))
        return None if job is None else job.predicted

    def response_started(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        """First byte: the prefill is done; learn the computing endpoint's speed; the request now decodes."""
        job = self._jobs.get(id(request))
        if job is None or job.started:
            return
        job.started = True
        load = job.load
        load.pending = max(0, load.pending - 1)
        load.pending_tokens = max(0.0, load.pending_tokens - job.uncached)
        if endpoint.name == job.name and self._keep < 1:  # a retry elsewhere says nothing about this endpoint
            keep = self._keep
            load.observed = keep * load.observed + (self.clock() - job.sent)
            load.predicted = keep * load.predicted + job.predicted
        if self.params.learn_decode_speed and endpoint.name == job.name:  # a retry computed its prompt elsewhere
            load.prefilled += job.computes
        decode = job.decode
        decode.running += 1
        decode.context_tokens += job.context
        decode.output_tokens += job.output
        job.begun, job.step, job.prefilled = self.clock(), self._step(self._seen(decode, endpoint)), decode.prefilled
        if self.params.decode_remaining:
            job.streamed = 1 if request.stream else 0  # the first byte carried the first token
            decode.decoding.add(job)
        self._notify()

    def response_chunk(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        """(``decodeRemaining``) A streamed answer's progress: one more chunk, so one more token at least, which
        :meth:`EndpointLoad.relief` counts instead of the steps the answer had time for."""
        if self.params.decode_remaining:
            job = self._jobs.get(id(request))
            if job is not None and job.streamed:
                job.streamed += 1

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, info: ResponseInfo) -> None:
        """The request ended: give back whatever it still holds."""
        job = self._jobs.pop(id(request), None)
        if job is not None:
            if endpoint is not None and endpoint.name == job.name:  # a retry elsewhere says nothing about this one
                self._learn_decode(job, info)
            release(job)
            self._notify()

    def _learn_decode(self, job: Job, info: ResponseInfo) -> None:
        """(``learnDecodeSpeed``) A whole answer's decode time, first byte to last, against what was predicted for it:
        the steps for its tokens as they were when it began, plus the prompts its endpoint computed meanwhile (whose
        prefills its steps shared). The decode terms' speed, steadier than the first byte's on alike servers (an
        answer's time averages hundreds of steps) and still a slower server's; without the prompts, a server that
        happened to take a long one would look slow for the next ~20 answers."""
        tokens = info.completion_tokens if info.completion_tokens is not None else info.stream_chunks
        if not self.params.learn_decode_speed or not job.started or info.error or not tokens or tokens < 2:
            return
        load, keep = job.decode, self._keep
        meanwhile = self._p * (load.prefilled - job.prefilled)
        load.decode_observed = keep * load.decode_observed + (self.clock() - job.begun)
        load.decode_predicted = keep * load.decode_predicted + (tokens - 1) * job.step + meanwhile

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per endpoint: pending tokens, running requests, context tokens, speeds (for tests and debugging)."""
        return {name: {"pending_tokens": ld.pending_tokens, "running": ld.running, "context_tokens": ld.context_tokens,
                       "speed": ld.speed, "decode_speed": ld.decode_speed} for name, ld in self._loads.items()}


_check: type[Scorer] = TtftCostScorer
_check_pre: type[PreRequest] = TtftCostScorer
_check_started: type[ResponseStarted] = TtftCostScorer
_check_chunk: type[ResponseChunk] = TtftCostScorer
_check_complete: type[ResponseComplete] = TtftCostScorer
_check_shared: type[SharedLoad] = TtftCostScorer
