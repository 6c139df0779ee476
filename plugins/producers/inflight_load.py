"""``inflight-load-producer``: what a routed request weighs in EPP's in-flight counters, and when it is given back.

EPP keeps one pair of in-flight counters per endpoint (:attr:`Endpoint.inflight_requests`,
:attr:`Endpoint.inflight_tokens`), read by ``token-load-scorer``, ``active-request-scorer``, ``concurrency-detector``,
``prefix-cache-affinity-filter`` and flow control. The Director books every routed request through this plugin
(:meth:`InFlightLoadProducer.book`); EPP always has exactly one (declared, else added with the defaults)::

    every profile that chose an endpoint charges its first endpoint 1 request and
        tokens = prompt + output
        prompt = request bytes / 4 (at least 1)        # minus the cached prefix with prefixMatchInfoProducerName
        output = round(prompt x outputRatio), at most maxEstimatedOutputTokens   # 0 if addEstimatedOutputTokens off
    first response byte: the prefill profile's charge is released whole;
                         with addEstimatedOutputTokens off, every other charge's tokens too (the requests stay)
    end of the request (answered, failed or abandoned): everything still held is released

YAML::

    - type: inflight-load-producer
      parameters:
        addEstimatedOutputTokens: true     # false: prompt only, its tokens freed at the first response byte
        outputRatio: 1.5
        maxEstimatedOutputTokens: 4096     # unset: no cap
        prefixMatchInfoProducerName: approx-prefix-cache-producer   # unset: no prefix discount
    - type: token-load-scorer
      parameters: {inFlightLoadProducerName: inflight-load-producer}
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import Field

from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import Handle, InFlightAccounting, LoadBooking, SchedulingResult
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import CHARS_PER_TOKEN, InferenceRequest

from .approx_prefix_cache import DEFAULT_PREFILL_PROFILE, PrefixMatch, find_prefix_producer
from .approx_prefix_cache import PRODUCER_TYPE as PREFIX_PRODUCER_TYPE

__all__ = ["InFlightLoadProducer", "InFlightBooking", "LOAD_PRODUCER_TYPE", "LOAD_PRODUCER_NAME_FIELD",
           "check_load_producer_name"]

LOAD_PRODUCER_TYPE = "inflight-load-producer"
LOAD_PRODUCER_NAME_FIELD = "inFlightLoadProducerName"
"""The consumers' parameter naming the producer whose in-flight load they read (llm-d-router)."""


class _Charge:
    """One endpoint's share of a request: the requests and tokens still held on it."""

    __slots__ = ("endpoint", "tokens", "requests", "early")

    def __init__(self, endpoint: Endpoint, tokens: int, early: bool) -> None:
        self.endpoint, self.tokens, self.requests, self.early = endpoint, tokens, 1, early

    def release(self) -> None:
        if self.requests or self.tokens:
            self.endpoint.release_inflight(self.tokens, self.requests)
            self.tokens = self.requests = 0

    def release_tokens(self) -> None:
        if self.tokens:
            self.endpoint.release_inflight(self.tokens, 0)
            self.tokens = 0


class InFlightBooking:
    """A request's charges, added to the endpoints' counters when built; each is given back exactly once.

    Event-loop only (no locks), like the counters themselves.
    """

    __slots__ = ("_charges", "_primary", "_prompt_only")

    def __init__(self, charges: list[_Charge], primary: _Charge, prompt_only: bool) -> None:
        self._charges, self._primary, self._prompt_only = charges, primary, prompt_only
        for charge in charges:
            charge.endpoint.add_inflight(charge.tokens)

    @property
    def tokens(self) -> int:
        """Tokens the request still holds on its primary target."""
        return self._primary.tokens

    def move(self, endpoint: Endpoint) -> None:
        """Move the primary target's charge to ``endpoint``."""
        charge = self._primary
        charge.endpoint.release_inflight(charge.tokens, charge.requests)
        endpoint.add_inflight(charge.tokens, charge.requests)
        charge.endpoint = endpoint

    def started(self) -> None:
        """First response byte: the prefill charge goes; prompt-only charges give back their tokens."""
        for charge in self._charges:
            if charge.early:
                charge.release()
            elif self._prompt_only:
                charge.release_tokens()

    def finish(self) -> None:
        """The request ended: give back everything still held (idempotent)."""
        for charge in self._charges:
            charge.release()


class InFlightLoadProducer:
    """Estimates a request's in-flight load per chosen endpoint and books it (see the module doc for the formula).

    Contract: :meth:`book` adds to the counters of every endpoint the result chose and returns the
    :class:`InFlightBooking` that gives them back; ``ValueError`` if the primary profile chose nothing (the
    scheduler never returns such a result).
    """

    type_name: ClassVar[str] = LOAD_PRODUCER_TYPE

    class Params(PluginParams):
        add_estimated_output_tokens: bool = Field(True, alias="addEstimatedOutputTokens")
        output_ratio: float = Field(1.5, alias="outputRatio", ge=0)
        max_estimated_output_tokens: int | None = Field(None, alias="maxEstimatedOutputTokens", ge=0)
        prefix_match_info_producer_name: str | None = Field(None, alias="prefixMatchInfoProducerName")
        sync_cross_replica_state: bool = Field(True, alias="syncCrossReplicaState", description="accepted, no effect")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        # A named prefix producer is read, so the loader creates a missing approximate one as for other readers.
        self.consumes = (PREFIX_PRODUCER_TYPE,) if params.prefix_match_info_producer_name else ()
        self._prefix_key: str | None = None
        # Plain attributes for the per-request path (read once per request, not through the pydantic model).
        self._add_output = params.add_estimated_output_tokens
        self._ratio = params.output_ratio
        self._cap = params.max_estimated_output_tokens

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """No prefix-producer parameters of its own: an auto-created producer uses the defaults."""
        return {}

    def bind(self, handle: Handle) -> None:
        """Refuse a second producer of this type; resolve the prefix producer ``prefixMatchInfoProducerName``
        names (ConfigError if it is not a prefix-match producer)."""
        first = handle.first_of_type(self.type_name)
        if first is not None and first is not self:
            raise ConfigError(f"plugin '{self.name}' (type: {self.type_name}): only one {self.type_name} may be "
                              f"configured ('{first.name}' is one): EPP keeps one in-flight load per endpoint",
                              plugin=self.name)
        named = self.params.prefix_match_info_producer_name
        if named:
            self._prefix_key = find_prefix_producer(self, handle, producer_name=named).state_key

    def prompt_tokens(self, request: InferenceRequest) -> int:
        """Request bytes / 4, at least 1 (the parsed prompt's estimate for a request built without a body)."""
        size = request.body_size
        return max(1, size // CHARS_PER_TOKEN) if size > 0 else request.input_tokens

    def output_tokens(self, prompt: int) -> int:
        """``round(prompt x outputRatio)`` (halves up, as Go's ``math.Round``), capped; 0 when not estimated."""
        if not self._add_output:
            return 0
        out = math.floor(prompt * self._ratio + 0.5)
        cap = self._cap
        return out if cap is None else min(out, cap)

    def tokens(self, request: InferenceRequest) -> int:
        """What one endpoint is charged for ``request`` without a prefix discount."""
        prompt = self.prompt_tokens(request)
        return prompt + self.output_tokens(prompt)

    def book(self, request: InferenceRequest, result: SchedulingResult) -> InFlightBooking:
        """Charge the first endpoint of every profile that chose one; the prefill profile's is released first."""
        prompt = self.prompt_tokens(request)
        output = self.output_tokens(prompt)
        primary_name = result.primary_profile
        if len(result.profile_results) == 1 and self._prefix_key is None:  # the common case: one profile
            charge = _Charge(result.target, prompt + output, early=False)
            return InFlightBooking([charge], charge, prompt_only=not self._add_output)
        match = result.cycle.get(self._prefix_key) if self._prefix_key else None
        prefill = result.prefill_profile or DEFAULT_PREFILL_PROFILE
        charges: list[_Charge] = []
        primary: _Charge | None = None
        for profile, res in result.profile_results.items():
            if res is None or not res.endpoints:
                continue
            endpoint = res.endpoints[0]
            charge = _Charge(endpoint, _uncached(match, endpoint.name, prompt) + output,
                             early=profile == prefill and profile != primary_name)
            charges.append(charge)
            if profile == primary_name:
                primary = charge
        if primary is None:
            raise ValueError(f"the scheduling result has no target in its primary profile '{primary_name}'")
        return InFlightBooking(charges, primary, prompt_only=not self._add_output)


def _uncached(match: object, endpoint_name: str, prompt: int) -> int:
    """The prompt tokens ``endpoint_name`` must compute: the unmatched indexed blocks plus the prompt beyond them
    (llm-d ``uncachedInputTokens``); the whole prompt without match information."""
    if not isinstance(match, PrefixMatch) or not match.hashes:
        return prompt
    chars = match.block_chars
    indexed = match.total_blocks * chars // CHARS_PER_TOKEN
    unmatched = (match.total_blocks - match.match_blocks(endpoint_name)) * chars // CHARS_PER_TOKEN
    return max(0, unmatched) + max(0, prompt - indexed)


def check_load_producer_name(owner: Any, handle: Handle, name: str | None) -> None:
    """A consumer's ``inFlightLoadProducerName`` (None: not set, nothing to check) must name a configured
    ``inflight-load-producer``; ConfigError naming ``owner`` and the field otherwise."""
    if not name:
        return
    named = handle.plugin(name)
    if isinstance(named, InFlightLoadProducer):
        return
    what = "is not configured" if named is None else f"is a {named.type_name}, not an {LOAD_PRODUCER_TYPE}"
    raise ConfigError(f"plugin '{owner.name}' (type: {owner.type_name}): {LOAD_PRODUCER_NAME_FIELD} names plugin "
                      f"'{name}', which {what}", plugin=owner.name, field=LOAD_PRODUCER_NAME_FIELD)


_check: type[InFlightAccounting] = InFlightLoadProducer
_check_booking: type[LoadBooking] = InFlightBooking
