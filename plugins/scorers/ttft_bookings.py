"""The books ``ttft-cost-scorer`` keeps: what this EPP has in flight on each endpoint, and what its other workers have.

:class:`EndpointLoad` is one endpoint's record (queued prefill, running decodes, the learnt speeds); :class:`Job` is
one booked request and :func:`release` gives back what it holds. :class:`PeerBookings` keeps the latest figures each
other ``--workers`` process sent (per endpoint: pending requests and tokens, running requests, context, output) and
their totals; :func:`plus` adds such figures to a record. Everything here runs on the event loop only.
"""

from __future__ import annotations

__all__ = ["EndpointLoad", "Job", "PeerBookings", "PRIOR_SECONDS", "SPEED_BOUNDS", "plus", "release"]

SPEED_BOUNDS = (0.25, 8.0)
"""A learnt speed factor outside these is a measurement artefact (a stalled client, a clock jump), not a server."""
PRIOR_SECONDS = 0.05
"""The prior's default weight in the speed estimate: as if 50 ms of answers had matched the prediction exactly."""
_ZERO = (0.0, 0.0, 0.0, 0.0, 0.0)


class EndpointLoad:
    """What this EPP has in flight on one endpoint, and how fast the endpoint has turned out to be."""

    __slots__ = ("pending", "pending_tokens", "running", "context_tokens", "output_tokens", "observed", "predicted",
                 "decode_observed", "decode_predicted", "decoding", "prefilled")

    def __init__(self, prior: float = PRIOR_SECONDS) -> None:
        self.pending = 0  # requests sent and not yet started
        self.pending_tokens = 0.0
        self.running = 0
        self.context_tokens = 0.0
        self.output_tokens = 0.0  # the expected outputs of the running requests, summed
        self.observed = prior  # seconds of answers as if they had matched the prediction: one answer cannot swing
        self.predicted = prior  # the speed of a server that has given few
        self.decode_observed = prior  # the same for the answers' decode times (learnDecodeSpeed)
        self.decode_predicted = prior
        self.decoding: set[Job] = set()  # its started requests, when the scorer reads them (decodeRemaining)
        self.prefilled = 0.0  # prompt tokens it has computed, summed at each first byte (learnDecodeSpeed)

    @property
    def speed(self) -> float:
        """Observed / predicted time to first byte, decayed; 1 before any sample."""
        return _clamped(self.observed / self.predicted)

    @property
    def decode_speed(self) -> float:
        """Observed / predicted time from first byte to last, decayed; 1 before any sample."""
        return _clamped(self.decode_observed / self.decode_predicted)

    def relief(self, now: float, step: float, output: float, per_seq: float, per_token: float) -> float:
        """What the answers in :attr:`decoding` that end before ``output`` more steps take off the step time, averaged
        over those steps: each is gone for the steps beyond the ones it has left (its expected output less the
        chunks it has streamed, or, not streamed, the steps of ``step`` seconds it has had time for), and weighed
        ``per_seq + per_token x its context``."""
        gone = 0.0
        for job in self.decoding:
            # A streamed answer's chunks say how far it is; a step estimate runs ahead of an answer slowed by the
            # prompts computed beside it, and would count it gone while it still runs.
            left = job.output - (job.streamed or (now - job.begun) / step)
            if left < output:
                gone += (output - max(0.0, left)) * (per_seq + per_token * job.context)
        return gone / output


def _clamped(speed: float) -> float:
    lo, hi = SPEED_BOUNDS
    return min(hi, max(lo, speed))


class Job:
    """One booked request: where its prompt is computed (``load``) and where it decodes (``decode``: the same record
    unless a P/D profile sent the prefill elsewhere), what it weighs, and when it left."""

    __slots__ = ("load", "decode", "name", "uncached", "computes", "context", "output", "predicted", "sent", "started",
                 "begun", "step", "prefilled", "streamed")

    def __init__(self, load: EndpointLoad, decode: EndpointLoad, name: str, uncached: float, context: float,
                 output: float, predicted: float, sent: float, computes: float) -> None:
        self.load, self.decode, self.name, self.uncached, self.context = load, decode, name, uncached, context
        self.computes = computes  # its prompt tokens not cached there (``uncached`` may be booked at the whole prompt)
        self.output = output
        self.predicted, self.sent, self.started = predicted, sent, False
        self.begun = 0.0  # when its first byte came (set once started)
        self.step = 0.0  # the predicted seconds per output token then
        self.prefilled = 0.0  # its decoder's prefilled tokens then
        self.streamed = 0  # a streamed answer's chunks so far, when decodeRemaining reads them (0: not counted)


def release(job: Job) -> None:
    """Give back what ``job`` holds on its endpoint: its pending prefill, or its place in the running batch."""
    if job.started:
        decode = job.decode
        decode.running = max(0, decode.running - 1)
        decode.context_tokens = max(0.0, decode.context_tokens - job.context)
        decode.output_tokens = max(0.0, decode.output_tokens - job.output)
        decode.decoding.discard(job)
    else:
        load = job.load
        load.pending = max(0, load.pending - 1)
        load.pending_tokens = max(0.0, load.pending_tokens - job.uncached)


def plus(load: EndpointLoad, figures: tuple[float, ...]) -> EndpointLoad:
    """A copy of ``load`` with ``figures`` (pending, pending tokens, running, context, output) added; the learnt
    speed is ``load``'s."""
    seen = EndpointLoad()
    pending, pending_tokens, running, context, output = figures
    seen.pending, seen.running = load.pending + int(pending), load.running + int(running)
    seen.pending_tokens = load.pending_tokens + pending_tokens
    seen.context_tokens, seen.output_tokens = load.context_tokens + context, load.output_tokens + output
    seen.observed, seen.predicted = load.observed, load.predicted
    seen.decode_observed, seen.decode_predicted = load.decode_observed, load.decode_predicted
    seen.decoding = load.decoding  # the same answers: the figures added are known only in total
    return seen


class PeerBookings:
    """The other workers' latest figures, by worker, and their totals by endpoint name."""

    def __init__(self) -> None:
        self._by_peer: dict[int, dict[str, tuple[float, ...]]] = {}
        self.totals: dict[str, tuple[float, ...]] = {}

    def set(self, peer: int, load: dict[str, tuple[float, ...]]) -> None:
        """Worker ``peer``'s figures replace what it sent before, in the totals too (a malformed entry is ignored)."""
        new = {name: tuple(float(x) for x in figures[:5]) for name, figures in load.items() if len(figures) >= 5}
        old = self._by_peer.get(peer, {})
        self._by_peer[peer] = new
        totals = self.totals
        for name in old.keys() | new.keys():  # only the endpoints this peer had or has change
            before, after = old.get(name, _ZERO), new.get(name, _ZERO)
            total = tuple(t - b + a for t, b, a in zip(totals.get(name, _ZERO), before, after))
            if any(abs(x) > 1e-6 for x in total):
                totals[name] = total
            else:  # nothing left: drop it, so an endpoint no worker books costs nothing to look up
                totals.pop(name, None)
