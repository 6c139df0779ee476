"""Plugin contracts: the Protocols every filter, scorer, picker, profile handler and hook implements.

A plugin is a small class with ``type_name: ClassVar[str]`` (the reference's kebab-case type), an instance
``name``, a nested pydantic ``Params`` model (``extra="forbid"``) and ``__init__(self, name, params, handle)``.
Its slot in the pipeline is decided by which Protocol methods it has, so one object may fill several slots
(as in the reference, where the slot is decided by Go type assertions).

Scheduling-cycle contract: ``filter``/``score``/``pick`` are synchronous and must not block; they read
:class:`~epp.framework.endpoint.Endpoint` state, which cannot change during a cycle (see :mod:`epp.framework.endpoint`).
Passive health (:class:`PassiveHealth`) is told how each upstream attempt ended (:class:`Outcome`) and decides which
endpoints the Director leaves out of a request's candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

from pydantic import BaseModel, ConfigDict

from epp.framework.endpoint import Endpoint
from epp.framework.pool import EndpointPool
from epp.framework.request import InferenceRequest

__all__ = [
    "Params", "NoParams", "Plugin", "Filter", "Scorer", "Picker", "ProfileHandler", "DataProducer",
    "PreRequest", "ResponseHeaderProcessor", "ResponseStarted", "ResponseChunk", "ResponseComplete", "PdDecider",
    "SaturationDetector", "CycleState", "Outcome", "PassiveHealth", "EjectionListener", "outcome_of_status",
    "CLIENT_GONE",
    "RequestPreparer", "PluginService", "InFlightAccounting", "LoadBooking",
    "ScoredEndpoint", "ProfileRunResult", "SchedulingResult", "ResponseHeaders", "ResponseInfo", "Handle",
    "Admitter", "Profile", "SharedBlockIndex", "BlockListener", "SharedLoad", "PrefixIndexMetrics",
    "KVIndexMetrics",
]


class Params(BaseModel):
    """Base for plugin parameter models: unknown keys are errors; field aliases are the YAML names."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class NoParams(Params):
    """For plugins without parameters."""


@runtime_checkable
class Plugin(Protocol):
    """Anything in the registry: it has a type name and an instance name."""

    type_name: ClassVar[str]
    name: str


@runtime_checkable
class Filter(Plugin, Protocol):
    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        """Return the subset of ``endpoints`` to keep, in order. Returning [] fails the profile."""
        ...


@runtime_checkable
class Scorer(Plugin, Protocol):
    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        """Return one score per endpoint, same order. The scheduler clamps each to [0, 1]."""
        ...


@runtime_checkable
class Picker(Plugin, Protocol):
    def pick(self, cycle: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]) -> ProfileRunResult:
        """Choose endpoints from the scored candidates (non-empty); the first is the target, the rest fallbacks."""
        ...


class Profile(Protocol):
    """What a profile handler reads of a scheduling profile (the engine runs its filters, scorers and picker)."""

    @property
    def name(self) -> str: ...


@runtime_checkable
class ProfileHandler(Plugin, Protocol):
    def pick_profiles(self, cycle: CycleState, request: InferenceRequest, profiles: Mapping[str, Profile],
                      results: Mapping[str, ProfileRunResult | None]) -> list[str]:
        """Names of the profiles to run next, given the results so far; [] ends the loop."""
        ...

    def process_results(self, cycle: CycleState, request: InferenceRequest,
                        results: Mapping[str, ProfileRunResult | None]) -> SchedulingResult:
        """Build the final result (naming the primary profile); raise ``SchedulingFailed`` if there is none."""
        ...


@runtime_checkable
class DataProducer(Plugin, Protocol):
    def produce(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        """Compute per-request data (e.g. prefix matches) into ``cycle`` before any profile runs."""
        ...


@runtime_checkable
class RequestPreparer(Plugin, Protocol):
    async def prepare(self, request: InferenceRequest) -> None:
        """Fill request data that takes I/O (e.g. prompt token ids from a tokenizer service) after admission and
        before the scheduling cycle. Must not raise for a failure to get the data: leave it unset (consumers then
        fall back), as the reference's director logs and continues."""
        ...


@runtime_checkable
class PluginService(Plugin, Protocol):
    """A plugin with background work (sockets, sessions): started once the endpoint source has started, stopped
    with EPP."""

    async def start(self, pool: EndpointPool) -> None:
        """Start; ``pool`` is the live endpoint set (subscribe to it for changes)."""
        ...

    async def stop(self) -> None:
        """Stop and release everything; idempotent."""
        ...


@runtime_checkable
class PreRequest(Plugin, Protocol):
    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """Called once after a successful pick, before the request is sent upstream."""
        ...


@runtime_checkable
class ResponseHeaderProcessor(Plugin, Protocol):
    def response_header(self, request: InferenceRequest, response: ResponseHeaders, endpoint: Endpoint) -> None:
        """Called once when the answer's headers arrive from ``endpoint`` (the served one), before they reach the
        client; may add headers for the client to ``response.headers``."""
        ...


@runtime_checkable
class ResponseStarted(Plugin, Protocol):
    def response_started(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        """Called when the first response byte arrives from ``endpoint``."""
        ...


@runtime_checkable
class ResponseChunk(Plugin, Protocol):
    def response_chunk(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        """Called for each streamed chunk after the first that reaches the client from ``endpoint``: about one per
        decode step (vLLM streams each step's token as it comes; chunks coalesced on the way count once), so their
        count tracks the answer's progress. It runs once per chunk: keep it O(1)."""
        ...


@runtime_checkable
class ResponseComplete(Plugin, Protocol):
    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, info: ResponseInfo) -> None:
        """Called exactly once when the request ends: completed, failed, or the client went away."""
        ...


@runtime_checkable
class PdDecider(Plugin, Protocol):
    def disaggregate(self, cycle: CycleState, request: InferenceRequest, decode_endpoint: Endpoint) -> bool:
        """True if the request should run a separate prefill step before decoding on ``decode_endpoint``."""
        ...


@runtime_checkable
class Admitter(Plugin, Protocol):
    def admit_request(self, request: InferenceRequest, endpoints: Sequence[Endpoint],
                      cycle: CycleState) -> str | None:
        """None to admit ``request``, else the reason it is denied (the reference's ``Admitter``).

        The Director calls every admitter, in config order, once per request: after admission control (the
        saturation gate or flow control), the request preparers and the data producers, before the scheduling
        cycle, with the candidate ``endpoints`` the cycle will see (read them, never change the sequence) and the
        ``cycle`` state the producers filled for them (read only; the cycle then runs on it). The first denial ends
        the request with the reference's answer, ``InternalError`` (500) ``request cannot be admitted: <reason>``;
        later admitters do not run. Synchronous and must not block, like the scheduling cycle.
        """
        ...


class LoadBooking(Protocol):
    """One request's in-flight charges on the endpoints it was routed to; each charge is released once."""

    @property
    def tokens(self) -> int:
        """Tokens the request currently holds on its primary target."""
        ...

    def move(self, endpoint: Endpoint) -> None:
        """Move the primary target's charge to ``endpoint`` (a fallback, before any response byte)."""
        ...

    def started(self) -> None:
        """The first response byte arrived: release what is held only until then (the prefill endpoint's)."""
        ...

    def finish(self) -> None:
        """The request ended, however it ended: release everything still held."""
        ...


@runtime_checkable
class InFlightAccounting(Plugin, Protocol):
    def book(self, request: InferenceRequest, result: SchedulingResult) -> LoadBooking:
        """Charge ``request`` to the endpoints ``result`` chose (their in-flight counters) and return the booking
        that gives the charges back. The Director calls it once per routed request, after PreRequest."""
        ...


@runtime_checkable
class SaturationDetector(Plugin, Protocol):
    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        """Pool saturation: 0 idle, ≥ 1 saturated."""
        ...


class Outcome(StrEnum):
    """How one upstream attempt on an endpoint ended, as the front ends report it to passive health. A 429, a client
    that went away and an answer cut short for a reason nobody saw are no outcome at all (not reported)."""

    SUCCESS = "success"
    """The model server answered (2xx, 3xx, or a 4xx: the client's fault, not the server's)."""
    ERROR_STATUS = "error_status"
    """A 5xx from the model server, or from the proxy in front of it (Envoy's local reply for a failed upstream)."""
    CONNECT_FAILURE = "connect_failure"
    """No connection, or the connection broke before any answer."""
    TIMEOUT = "timeout"
    """No answer within the upstream timeout."""
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"
    """No first response byte within the passive-health plugin's ``first_byte_timeout``."""
    PROXY_RETRIED = "proxy_retried"
    """Envoy served the request from a later endpoint of EPP's list: the ones before it failed (connect failure,
    reset or a retried 503; which one Envoy does not say)."""

    @property
    def failed(self) -> bool:
        """Everything but :attr:`SUCCESS` counts against the endpoint."""
        return self is not Outcome.SUCCESS


CLIENT_GONE = 499
"""The status a front end records (never sends) for a client that went away before its answer was complete
(nginx's 499)."""


def outcome_of_status(status: int, cut: bool = False) -> Outcome | None:
    """What an answer with ``status`` says of the endpoint that gave it: a 5xx is a failure (504: a timeout), any
    other answer a success, a 4xx included (the client's fault); None for a 429 (load, which admission handles:
    ejecting a busy server pushes its load onto the rest), a client that went away, no status, or (``cut``) an
    answer cut short for a cause the front end did not see."""
    if status >= 500:
        return Outcome.TIMEOUT if status == 504 else Outcome.ERROR_STATUS
    if status in (0, 429, CLIENT_GONE) or (cut and status < 400):
        return None
    return Outcome.SUCCESS


EjectionListener = Callable[[Endpoint, str | None], None]
"""``listener(endpoint, reason)``: ``endpoint`` was ejected for ``reason`` (``consecutive_failures``,
``failure_rate``, ``probe_failed``), or readmitted or forgotten when ``reason`` is None."""


@runtime_checkable
class PassiveHealth(Plugin, Protocol):
    """Outlier detection fed by real traffic: at most one per pipeline (EPP adds a default one).

    The Director reports every upstream attempt's :class:`Outcome` with :meth:`observe` and asks
    :meth:`admissible` for each request's candidates (and a retry's); ejecting and readmitting are the plugin's. An
    ejection never empties a candidate list: when every candidate is ejected, all of them are admissible.
    """

    @property
    def first_byte_timeout(self) -> float | None:
        """Seconds after which a streamed request still waiting for its first response byte counts as a failure of
        its endpoint (:attr:`Outcome.FIRST_BYTE_TIMEOUT`; a non-streamed answer's first byte is its last); None:
        never."""
        ...

    def observe(self, endpoint: Endpoint, outcome: Outcome, model: str, started: float | None = None) -> None:
        """One attempt on ``endpoint`` (for ``model``, the name sent upstream) ended with ``outcome``; ``started``
        is when its request began (``time.monotonic()``), None if unknown. Synchronous, on the request path: must
        not block."""
        ...

    def admissible(self, endpoints: list[Endpoint]) -> list[Endpoint]:
        """``endpoints`` without the ejected ones, in order; ``endpoints`` itself when that would leave none."""
        ...

    def on_ejection(self, listener: EjectionListener) -> None:
        """Call ``listener`` after every ejection and readmission (EPP's metrics count them)."""
        ...


BlockListener = Callable[[list[int], Endpoint], None]
"""``listener(hashes, endpoint)``: ``endpoint`` now caches the prompt blocks ``hashes`` (most recent last)."""


@runtime_checkable
class SharedBlockIndex(Plugin, Protocol):
    """A plugin's index of which endpoint caches which prompt blocks, kept in step across EPP's worker processes
    (``--workers``): the engine sends the blocks this process indexes to the other workers and replays theirs."""

    def on_blocks_added(self, listener: BlockListener) -> None:
        """Call ``listener`` after each addition this process makes (not after :meth:`add_peer_blocks`)."""
        ...

    def add_peer_blocks(self, hashes: list[int], endpoint: Endpoint) -> None:
        """Index ``hashes`` on ``endpoint`` as another worker did, without calling the listeners."""
        ...


@runtime_checkable
class SharedLoad(Plugin, Protocol):
    """A plugin's per-endpoint bookkeeping of the requests this process sent, summed across EPP's worker processes
    (``--workers``): the engine sends :meth:`local_load` to the other workers within 2 ms of a change the plugin
    reports (and every period, 20 ms, in case a datagram was lost) and gives each worker's latest to
    :meth:`set_peer_load`, which replaces what that worker sent before."""

    def on_load_changed(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each change of :meth:`local_load` (a booking made, started or given back)."""
        ...

    def local_load(self) -> dict[str, tuple[float, ...]]:
        """This process's own figures by endpoint name (only endpoints with any)."""
        ...

    def set_peer_load(self, peer: int, load: dict[str, tuple[float, ...]]) -> None:
        """Worker ``peer``'s latest figures; an endpoint it leaves out has none from it."""
        ...


@runtime_checkable
class PrefixIndexMetrics(Protocol):
    """A prefix-cache index EPP's metrics read: its size, and each routed request's prefix match."""

    observer: Callable[[int, int], None] | None
    """Set by the engine: called with (matched, total) prefix bytes of each routed request."""

    def index_size(self) -> int:
        """Entries the index holds over all endpoints."""
        ...


@runtime_checkable
class KVIndexMetrics(Protocol):
    """A KV-block index whose counters EPP exports (the ``kvcache_index_*`` families) when ``enable_metrics``."""

    enable_metrics: bool

    def index_metrics(self) -> dict[str, float]:
        """Counter and gauge values by family suffix (e.g. ``lookup_requests_total``)."""
        ...


class CycleState(dict[str, Any]):
    """Per-request scratch space shared by the plugins of one scheduling cycle (keys are plugin-chosen)."""


@dataclass(slots=True)
class ScoredEndpoint:
    endpoint: Endpoint
    score: float


@dataclass(slots=True)
class ProfileRunResult:
    """A profile's answer: endpoints in preference order (first = target, rest = fallbacks). ``scored``: the
    candidates the profile's picker chose from, with their weighted score sums (set by the scheduler)."""

    endpoints: list[Endpoint]
    scored: list[ScoredEndpoint] | None = None


@dataclass(slots=True)
class SchedulingResult:
    """The outcome of one scheduling cycle: results per profile, and which one is primary.

    ``headers`` are set on the upstream request by the front end (PreRequest plugins add to it, e.g. the
    disaggregation handler's ``x-prefiller-host-port``); ``response_headers`` go back to the client.
    """

    profile_results: dict[str, ProfileRunResult | None]
    primary_profile: str
    prefill_profile: str | None = None
    cycle: CycleState = field(default_factory=CycleState)
    headers: dict[str, str] = field(default_factory=dict)
    response_headers: dict[str, str] = field(default_factory=dict)

    @property
    def endpoints(self) -> list[Endpoint]:
        """The primary profile's endpoints: target first, then fallbacks."""
        res = self.profile_results.get(self.primary_profile)
        return res.endpoints if res is not None else []

    def endpoint_scores(self) -> dict[str, float]:
        """``ip:port`` -> weighted score of every candidate the primary profile scored, picked or not (empty when
        it has none, e.g. a profile that did not run its scorers)."""
        res = self.profile_results.get(self.primary_profile)
        scored = res.scored if res is not None else None
        return {se.endpoint.hostport: se.score for se in scored} if scored else {}

    @property
    def target(self) -> Endpoint:
        """The endpoint the request goes to."""
        return self.endpoints[0]

    @property
    def prefill(self) -> Endpoint | None:
        """The prefill endpoint chosen by a disaggregation profile, if any."""
        if self.prefill_profile is None:
            return None
        res = self.profile_results.get(self.prefill_profile)
        return res.endpoints[0] if res is not None and res.endpoints else None


@dataclass(slots=True)
class ResponseHeaders:
    """The answer's head as the proxy reported it, for :class:`ResponseHeaderProcessor` hooks.

    ``served`` is the ``host:port`` the proxy says it sent the request to ("" when it did not say): behind Envoy,
    the ``envoy.lb`` served-endpoint metadata, else the ``upstream.address`` attribute; in the HTTP gateway,
    the endpoint it proxied to. ``metadata`` is the proxy's filter metadata (namespace -> key -> value; empty in
    the HTTP gateway). ``headers`` collects what the hooks add to the client's answer.
    """

    status: int
    served: str = ""
    metadata: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ResponseInfo:
    """What EPP learned from a response: status, token usage, and whether it ended in error."""

    status: int = 200
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    error: bool = False
    streamed: bool = False
    response_bytes: int | None = None
    """Bytes of the answer's body the client got, when it got all of it (else None: not observed)."""
    stream_chunks: int | None = None
    """Body chunks of a streamed answer that reached the client (set by the Director; None when none did). A
    token count where the answer carried no usage (the reference counts chunks as tokens)."""
    dynamic_metadata: dict[str, dict[str, float]] | None = None
    """Namespace -> key -> number, filled by ``ResponseComplete`` hooks (:meth:`set_metadata`); the ext_proc front
    end sends it to Envoy with the stream's last response reply, as the reference does."""

    def set_metadata(self, namespace: str, key: str, value: float) -> None:
        """Report ``value`` under ``namespace``/``key`` in the response's dynamic metadata."""
        if self.dynamic_metadata is None:
            self.dynamic_metadata = {}
        self.dynamic_metadata.setdefault(namespace, {})[key] = value


class Handle:
    """Given to plugin constructors: lets a plugin find others by name once all are built.

    Look-ups must be done in ``bind(handle)`` (called after every plugin exists), not in ``__init__``.
    """

    def __init__(self) -> None:
        self._plugins: dict[str, Plugin] = {}

    def add(self, plugin: Plugin) -> None:
        self._plugins[plugin.name] = plugin

    def plugin(self, name: str) -> Plugin | None:
        """The plugin instance called ``name``, or None."""
        return self._plugins.get(name)

    def plugins(self) -> list[Plugin]:
        """All plugin instances, in declaration order."""
        return list(self._plugins.values())

    def first_of_type(self, type_name: str) -> Plugin | None:
        """The first plugin whose type is ``type_name``, or None."""
        return next((p for p in self._plugins.values() if p.type_name == type_name), None)
