"""``prefix-cache-affinity-filter``: narrows the candidates to "sticky" endpoints that hold most of the prompt.

Reads a prefix producer's match (``score = matchBlocks / totalBlocks``)::

    keep all   if len(endpoints) <= 1 or affinityThreshold <= 0
    keep all   with probability explorationProbability            # exploration
    sticky   = endpoints with score >= affinityThreshold
    keep all   if sticky is empty
    keep all   if maxTTFTPenaltyMs > 0 and others exist and (either side has no TTFT signal, or
                  best TTFT of sticky - best TTFT of the others > maxTTFTPenaltyMs)   # TTFT load gate
    keep all   if maxTokensInFlightPenalty > 0 and
                  min(inflight_tokens of sticky) - min(inflight_tokens of the others) > maxTokensInFlightPenalty
    keep sticky otherwise

An endpoint's TTFT for the gate is ``inFlightTokens / peakPrefillThroughput`` (``ttftSource: prefillThroughput``,
the default; the throughput may come from a calibration record, :mod:`epp.plugins.filters.prefill_calibration`) or
the predicted TTFT (``ttftSource: latencyPredictor``; no prediction on either side skips the gate).

YAML::

    - type: prefix-cache-affinity-filter
      parameters:
        affinityThreshold: 0.80
        explorationProbability: 0.01
        maxTTFTPenaltyMs: 5000
        ttftSource: prefillThroughput   # (the default) or latencyPredictor
        peakPrefillThroughput: 15928    # or prefillCalibrationFile + prefillCalibrationFingerprint
"""

from __future__ import annotations

import logging
import random
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest
from epp.latency import predictions_of

from ..producers.approx_prefix_cache import PRODUCER_TYPE, PrefixMatch, find_prefix_producer
from ..producers.inflight_load import check_load_producer_name
from .prefill_calibration import CalibrationSkipped, calibrated_throughput

__all__ = ["PrefixCacheAffinityFilter"]

log = logging.getLogger("epp.plugins")


class PrefixCacheAffinityFilter:
    """Keeps endpoints whose prefix score reaches ``affinityThreshold`` unless exploring or they are overloaded."""

    type_name: ClassVar[str] = "prefix-cache-affinity-filter"
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE,)

    class Params(PluginParams):
        affinity_threshold: float = Field(0.80, alias="affinityThreshold", ge=0.0, le=1.0)
        exploration_probability: float = Field(0.0, alias="explorationProbability", ge=0.0, le=1.0)
        max_ttft_penalty_ms: float = Field(18000, alias="maxTTFTPenaltyMs", ge=0)
        max_tokens_in_flight_penalty: int = Field(0, alias="maxTokensInFlightPenalty", ge=0)
        ttft_source: Literal["latencyPredictor", "prefillThroughput"] = Field("prefillThroughput",
                                                                             alias="ttftSource")
        peak_prefill_throughput: float = Field(15928, alias="peakPrefillThroughput", ge=0)
        prefill_calibration_file: str = Field("", alias="prefillCalibrationFile")
        prefill_calibration_fingerprint: str = Field("", alias="prefillCalibrationFingerprint")
        prefill_calibration_required: bool = Field(False, alias="prefillCalibrationRequired")
        penalty_source: Literal["constant", "sessionCost"] = Field("constant", alias="penaltySource")
        prefix_match_info_producer_name: str | None = Field(None, alias="prefixMatchInfoProducerName")
        in_flight_load_producer_name: str | None = Field(None, alias="inFlightLoadProducerName")
        latency_prediction_info_producer_name: str | None = Field(None, alias="latencyPredictionInfoProducerName")

        @field_validator("penalty_source")
        @classmethod
        def _constant_only(cls, value: str) -> str:
            if value == "sessionCost":
                raise ValueError("'sessionCost' needs llm-d-router's session-state producer, which EPP does not "
                                 "have; use 'constant'")
            return value


    def __init__(self, name: str, params: Params, handle: Handle, *, rng: random.Random | None = None) -> None:
        params, self.peak_prefill_source = _resolve_peak(name, self.type_name, params)
        if params.ttft_source == "prefillThroughput" and params.max_ttft_penalty_ms > 0 \
                and params.peak_prefill_throughput == 0:
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): peakPrefillThroughput must be > 0 when "
                              "ttftSource is prefillThroughput", plugin=name, field="peakPrefillThroughput")
        self.name = name
        self.params = params
        self.rng = rng or random.Random()
        self._threshold = params.affinity_threshold
        self._explore = params.exploration_probability
        self._token_penalty = params.max_tokens_in_flight_penalty
        self._ttft_penalty = params.max_ttft_penalty_ms
        self._predicted = params.ttft_source == "latencyPredictor"
        self._ms_per_token = 1000.0 / params.peak_prefill_throughput if params.peak_prefill_throughput else 0.0
        self._key = ""

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """No producer parameters of its own: an auto-created producer uses the defaults."""
        return {}

    def bind(self, handle: Handle) -> None:
        name = self.params.prefix_match_info_producer_name
        self._key = find_prefix_producer(self, handle, producer_name=name).state_key
        check_load_producer_name(self, handle, self.params.in_flight_load_producer_name)

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        threshold = self._threshold
        if len(endpoints) <= 1 or threshold <= 0:
            return endpoints
        if self._explore > 0 and self.rng.random() < self._explore:
            return endpoints
        state = cycle.get(self._key)
        if not isinstance(state, PrefixMatch) or not state.hashes:
            return endpoints
        sticky: list[Endpoint] = []
        others: list[Endpoint] = []
        for ep in endpoints:
            (sticky if state.score(ep.name) >= threshold else others).append(ep)
        if not sticky:
            return endpoints
        if self._ttft_penalty > 0 and others:
            best_sticky, best_other = self._best_ttft(cycle, sticky), self._best_ttft(cycle, others)
            if best_sticky is None or best_other is None or best_sticky - best_other > self._ttft_penalty:
                return endpoints  # a side without any TTFT signal skips the gate: keep all (missing_signal)
        if self._token_penalty > 0 and others:
            best_sticky = min(ep.inflight_tokens for ep in sticky)
            best_other = min(ep.inflight_tokens for ep in others)
            if best_sticky - best_other > self._token_penalty:
                return endpoints
        return sticky

    def _best_ttft(self, cycle: CycleState, endpoints: list[Endpoint]) -> float | None:
        """The lowest TTFT (ms) among ``endpoints`` from ``ttftSource`` (module docstring); ``None`` when no
        endpoint has a prediction (the in-flight tokens EPP books are always there)."""
        if not self._predicted:
            return min(ep.inflight_tokens for ep in endpoints) * self._ms_per_token
        predictions = predictions_of(cycle)
        ttfts = [info.ttft for ep in endpoints if (info := predictions.get(ep.name)) is not None]
        return min(ttfts) if ttfts else None


_Params = PrefixCacheAffinityFilter.Params


def _resolve_peak(name: str, type_name: str, params: _Params) -> tuple[_Params, str]:
    """``params`` with a calibration record's ``peakPrefillThroughput`` applied (explicit value > fingerprint-matched
    record > default), and where the value came from: ``notUsed``, ``userConfigured``, ``calibrated`` or
    ``default``. A record that cannot be applied is a ConfigError only with ``prefillCalibrationRequired``."""
    if params.ttft_source == "latencyPredictor":
        return params, "notUsed"
    if "peak_prefill_throughput" in params.model_fields_set:
        return params, "userConfigured"
    try:
        value = calibrated_throughput(params.prefill_calibration_file, params.prefill_calibration_fingerprint,
                                      params.prefill_calibration_required)
    except CalibrationSkipped as exc:
        if params.prefill_calibration_required:
            raise ConfigError(f"plugin '{name}' (type: {type_name}): calibration not applied: {exc}", plugin=name,
                              field="prefillCalibrationFile") from exc
        log.warning("plugin '%s' (type: %s): calibration skipped, keeping peakPrefillThroughput %s: %s", name,
                    type_name, params.peak_prefill_throughput, exc)
        return params, "default"
    if value is None:
        return params, "default"
    return params.model_copy(update={"peak_prefill_throughput": value}), "calibrated"


_check: type[Filter] = PrefixCacheAffinityFilter
