"""latency-slo-admitter: denies only a sheddable request with an SLO when predictions exist, none is valid and no
candidate is idle or cold (the reference's plugin_test.go table), reads the SLO headers as the reference does
(current names over the deprecated aliases, Go's ParseFloat), and its parameters."""

from __future__ import annotations

import pytest

from epp.errors import ConfigError
from epp.framework.plugins import Admitter, CycleState, Handle
from epp.framework.request import InferenceRequest
from epp.latency import PRODUCER_TYPE, LatencyPredictionInfo
from epp.latency.slo import go_parse_float
from epp.plugins.requestcontrol.latency_slo_admitter import REJECTION_REASON, LatencySloAdmitter

from .helpers import ep, make, registry, req
from .latency import StandInLatencyProducer, cycle_with, info

SLO = {"x-llm-d-router-slo-ttft-ms": "100", "x-llm-d-router-slo-tpot-ms": "30"}
INVALID = info(-50, -10, ttft=150, tpot=40)
INVALID2 = info(-30, -5, ttft=130, tpot=35)
VALID = info(20, 5, ttft=80, tpot=25)


def request(headers: dict[str, str] | None = None, priority: int = -1) -> InferenceRequest:
    r = req(headers=SLO if headers is None else headers)
    r.priority = priority
    return r


def admit(r: InferenceRequest, endpoints: dict[str, tuple[float, int]],
          predictions: dict[str, LatencyPredictionInfo]) -> str | None:
    """The admitter's answer for candidates ``name -> (kv_usage, running)`` with these predictions."""
    candidates = [ep(n, kv=kv, running=running) for n, (kv, running) in endpoints.items()]
    return make(LatencySloAdmitter).admit_request(r, candidates, cycle_with(**predictions))


BUSY = {"pod1": (0.5, 5), "pod2": (0.4, 3)}


@pytest.mark.parametrize("r, endpoints, predictions, denied", [
    (request(priority=1), {"pod1": (0.5, 5)}, {"pod1": INVALID}, False),
    (request(priority=0), {"pod1": (0.5, 5)}, {"pod1": INVALID}, False),
    (request({}), {"pod1": (0.5, 5)}, {"pod1": INVALID}, False),
    (request({"x-llm-d-router-slo-ttft-ms": "", "x-llm-d-router-slo-tpot-ms": ""}), {"pod1": (0.5, 5)},
     {"pod1": INVALID}, False),
    (request(), BUSY, {"pod1": INVALID, "pod2": INVALID2}, True),
    (request({"x-slo-ttft-ms": "100", "x-slo-tpot-ms": "30"}), {"pod1": (0.5, 5)}, {"pod1": INVALID}, True),
    (request({"x-llm-d-router-slo-ttft-ms": "0", "x-slo-ttft-ms": "100", "x-llm-d-router-slo-tpot-ms": "0",
              "x-slo-tpot-ms": "30"}), {"pod1": (0.5, 5)}, {"pod1": INVALID}, False),
    (request({"x-llm-d-router-slo-tpot-ms": "30"}), {"pod1": (0.5, 5)}, {"pod1": INVALID}, True),
    (request(), {"pod1": (0.5, 5), "pod2": (0.4, 0)}, {"pod1": INVALID, "pod2": INVALID2}, False),
    (request(), {"pod1": (0.5, 5), "pod2": (0.01, 3)}, {"pod1": INVALID, "pod2": INVALID2}, False),
    (request(), {"pod1": (0.5, 5), "pod2": (0.02, 3)}, {"pod1": INVALID, "pod2": INVALID2}, True),
    (request(), BUSY, {"pod1": INVALID, "pod2": VALID}, False),
    (request(), BUSY, {"pod1": INVALID}, True),
    (request(), BUSY, {}, False),
    (request(), BUSY, {"elsewhere": INVALID}, False),
    (request(), {}, {}, False),
    (request(), BUSY, {"pod1": info(5, -1, valid=False), "pod2": info(-1, 5, valid=False)}, True),
    (request(), BUSY, {"pod1": info(-5, -1, valid=True)}, False),
], ids=["critical", "standard", "no-slo-headers", "empty-slo-headers", "all-invalid-busy-warm", "old-aliases",
        "new-names-win-over-aliases", "tpot-slo-alone", "one-idle", "one-cold", "kv-0.02-is-warm", "one-valid",
        "one-predicted-others-not", "no-predictions-fail-open", "predictions-of-others-only", "no-candidates",
        "headroom-positive-but-invalid", "valid-flag-decides"])
def test_the_reference_decision_table(r: InferenceRequest, endpoints: dict, predictions: dict, denied: bool) -> None:
    assert admit(r, endpoints, predictions) == (REJECTION_REASON if denied else None)


@pytest.mark.parametrize("value, has_slo", [
    ("100", True), ("0.5", True), ("1e2", True), ("+7", True), (".5", True), ("5.", True), ("1_000", True),
    ("0x1p3", True), ("0X1.8P1", True), ("inf", True), ("+Infinity", True),
    ("0", False), ("-5", False), ("abc", False), (" 100", False), ("100 ", False), ("1__0", False),
    ("_1", False), ("1e", False), ("0x10", False), ("1e400", False), ("0x1p2000", False), ("nan", False),
    ("-inf", False), ("", False),
])
def test_slo_values_are_read_as_go_parses_them(value: str, has_slo: bool) -> None:
    r = request({"x-llm-d-router-slo-ttft-ms": value})
    denied = admit(r, {"pod1": (0.5, 5)}, {"pod1": INVALID}) == REJECTION_REASON
    assert denied is has_slo


@pytest.mark.parametrize("text, value", [
    ("1_000.5", 1000.5), ("0x_1p-2", 0.25), ("-0x.8p1", -1.0), ("1e-400", 0.0), ("-Inf", float("-inf")),
    ("1.5e+3", 1500.0), ("0x1.8", None), ("1._5", None), ("", None), ("1e4_0", 1e40),
])
def test_go_parse_float(text: str, value: float | None) -> None:
    assert go_parse_float(text) == value


def test_the_cycle_is_only_read() -> None:
    cycle = cycle_with(pod1=INVALID)
    before = dict(cycle)
    make(LatencySloAdmitter).admit_request(request(), [ep("pod1", kv=0.5, running=5)], cycle)
    assert cycle == before


# -- parameters -----------------------------------------------------------------------------------------------------

def test_consumes_the_producer() -> None:
    assert LatencySloAdmitter.consumes == (PRODUCER_TYPE,)
    assert make(LatencySloAdmitter).params.latency_prediction_info_producer_name is None


def test_unknown_parameters_name_the_plugin_and_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        registry().create("latency-slo-admitter", "slo", {"coldKVUsage": 0.1}, Handle())
    assert err.value.field == "coldKVUsage" and "plugin 'slo' (type: latency-slo-admitter)" in str(err.value)


def test_the_named_producer_must_be_configured() -> None:
    handle = Handle()
    handle.add(StandInLatencyProducer("lp", None, handle))  # type: ignore[arg-type]
    make(LatencySloAdmitter, {"latencyPredictionInfoProducerName": "lp"}).bind(handle)
    with pytest.raises(ConfigError, match="names plugin 'other', which is not configured") as err:
        make(LatencySloAdmitter, {"latencyPredictionInfoProducerName": "other"}).bind(handle)
    assert err.value.field == "latencyPredictionInfoProducerName"


def test_an_empty_cycle_admits() -> None:
    assert make(LatencySloAdmitter).admit_request(request(), [ep("pod1", kv=0.5, running=5)], CycleState()) is None


_check: type[Admitter] = LatencySloAdmitter
