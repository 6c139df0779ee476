"""Builders for the latency readers' tests: predictions, cycle states holding them, and a stand-in
``predicted-latency-producer`` that fills the cycle state from a table (registered in place of the real one)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Params
from epp.framework.registry import Registry
from epp.framework.request import InferenceRequest
from epp.latency import LATENCY_PREDICTIONS_KEY, PRODUCER_TYPE, LatencyPredictionInfo


def info(ttft_headroom: float, tpot_headroom: float, dispatched: int = 0, *, valid: bool | None = None,
         ttft: float = 100.0, tpot: float = 10.0) -> LatencyPredictionInfo:
    """A prediction with these headrooms; each validity flag follows its headroom's sign unless ``valid`` says."""
    ttft_ok = ttft_headroom >= 0 if valid is None else valid
    tpot_ok = tpot_headroom >= 0 if valid is None else valid
    return LatencyPredictionInfo(ttft_ok, tpot_ok, ttft_headroom, tpot_headroom, ttft, tpot, dispatched)


def cycle_with(**predictions: LatencyPredictionInfo) -> CycleState:
    """A cycle state holding ``predictions`` (endpoint name -> prediction) where the producer puts them."""
    cycle = CycleState()
    cycle[LATENCY_PREDICTIONS_KEY] = dict(predictions)
    return cycle


class StandInLatencyProducer:
    """Stands in for ``predicted-latency-producer``: stores ``table``'s prediction of each candidate it has one
    for, as the real producer does. Accepts (and ignores) any parameters, so configs written for the real one
    load."""

    type_name: ClassVar[str] = PRODUCER_TYPE

    class Params(Params):
        model_config = ConfigDict(extra="allow")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name, self.params = name, params
        self.table: dict[str, LatencyPredictionInfo] = {}

    def produce(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        cycle[LATENCY_PREDICTIONS_KEY] = {ep.name: self.table[ep.name] for ep in endpoints if ep.name in self.table}


class _Registry(Registry):
    """Drops any other class registered under the producer's type, so the stand-in is the one built."""

    def register(self, cls: type, *, aliases: tuple[str, ...] = ()) -> type:
        if getattr(cls, "type_name", None) == PRODUCER_TYPE and cls is not StandInLatencyProducer:
            return cls
        return super().register(cls, aliases=aliases)


def latency_registry() -> Registry:
    """Every built-in plugin, with :class:`StandInLatencyProducer` as ``predicted-latency-producer``."""
    from epp.runtime.builtins import register_builtins

    registry = _Registry()
    registry.register(StandInLatencyProducer)
    register_builtins(registry)
    return registry


def stand_in(handle: Any) -> StandInLatencyProducer:
    """The stand-in producer among a built pipeline's plugins (``handle``: its ``Handle``)."""
    producer = handle.first_of_type(PRODUCER_TYPE)
    assert isinstance(producer, StandInLatencyProducer)
    return producer
