"""The Admitter extension point: the reference's probabilistic-admitter example config loads (apiVersion
llm-d.ai/v1, the detector named in flowControl.saturationDetector), and the Director asks admitters in config
order after admission control and the data producers (whose cycle state they read) and before scheduling, failing
the request as the reference does."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Callable, ClassVar, Sequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import Field

from epp.config.loader import API_VERSIONS, build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.errors import ConfigError, ErrorCode, InternalError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Params
from epp.framework.registry import Registry
from epp.framework.request import InferenceRequest
from epp.metrics.families import EppMetrics
from epp.plugins.requestcontrol.probabilistic_admitter import ProbabilisticAdmitter
from epp.runtime.builtins import default_registry
from epp.scheduling.director import Director

from .helpers import endpoint, request

README_SNIPPET = Path(__file__).parent.parent / "fixtures/configs/llmd/HEAD_probabilistic-admitter-readme-snippet.yaml"
"""The "key snippet" of llm-d-router's probabilistic-admitter README, verbatim."""
README_EXAMPLE = README_SNIPPET.read_text()


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = default_registry(entry_points=False)
    reg.register(Gate)
    reg.register(OtherDetector)
    reg.register(Stamp)
    reg.register(StampReader)
    return reg


class Gate:
    """A test Admitter: records what it was asked and denies when told to."""

    type_name: ClassVar[str] = "test-gate"

    class Params(Params):
        deny: bool = False

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name, self.params = name, params
        self.asked: list[tuple[str, list[str]]] = []
        self.cycles: list[CycleState] = []

    def admit_request(self, request: InferenceRequest, endpoints: Sequence[Endpoint],
                      cycle: CycleState) -> str | None:
        self.asked.append((request.request_id, [e.name for e in endpoints]))
        self.cycles.append(cycle)
        return f"{self.name} says no" if self.params.deny else None


class Stamp:
    """A test DataProducer: stamps the cycle state with the request id and the candidates it saw."""

    type_name: ClassVar[str] = "test-stamp"
    Params = Params

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name, self.params = name, params

    def produce(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        cycle["stamp"] = (request.request_id, [e.name for e in endpoints])


class StampReader(Stamp):
    """A test DataProducer consuming ``test-stamp``: copies its stamp, so it must run after it."""

    type_name: ClassVar[str] = "test-stamp-reader"
    consumes: ClassVar[tuple[str, ...]] = ("test-stamp",)

    def produce(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        cycle["copied"] = cycle.get("stamp")


class OtherDetector:
    """A second saturation detector, to tell which one the loader picked."""

    type_name: ClassVar[str] = "other-detector"

    class Params(Params):
        level: float = Field(0.0, ge=0)

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name, self.params = name, params

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return self.params.level


# -- loading --------------------------------------------------------------------------------------------------------

def test_the_reference_readme_example_loads(registry: Registry) -> None:
    pipeline = build_pipeline(*load_raw(README_EXAMPLE, "probabilistic-admitter-epp-config.yaml"), registry)
    assert pipeline.config.api_version == "llm-d.ai/v1"
    [admitter] = pipeline.admitters
    assert isinstance(admitter, ProbabilisticAdmitter) and admitter.name == "probabilistic-admitter"
    detector = pipeline.saturation_detector
    assert detector.name == "utilization-detector"
    assert (detector.params.queue_depth_threshold, detector.params.kv_cache_util_threshold) == (999999999, 1.0)
    profile = pipeline.scheduler.profiles["default"]
    assert profile.filters == [] and profile.scorers == [] and profile.picker.name == "random-picker"
    assert "admitters: probabilistic-admitter\n" in pipeline.describe()


def test_the_earlier_readme_form_loads(registry: Registry) -> None:
    """The README's first revision: v1alpha1 and the (now deprecated) top-level saturationDetector."""
    text = README_EXAMPLE.replace("llm-d.ai/v1", "llm-d.ai/v1alpha1", 1).replace(
        "flowControl:\n  saturationDetector:\n    pluginRef", "saturationDetector:\n  pluginRef")
    assert "flowControl" not in text
    pipeline = build_pipeline(*load_raw(text), registry)
    assert pipeline.saturation_detector.params.queue_depth_threshold == 999999999 and len(pipeline.admitters) == 1


def test_the_module_docstring_example_loads(registry: Registry) -> None:
    import epp.plugins.requestcontrol.probabilistic_admitter as module

    text = textwrap.dedent((module.__doc__ or "").split("YAML::", 1)[1])
    pipeline = build_pipeline(*load_raw(text), registry)
    assert [a.type_name for a in pipeline.admitters] == ["probabilistic-admitter"]
    assert pipeline.saturation_detector.params.queue_depth_threshold == 999999999


@pytest.mark.parametrize("version", API_VERSIONS)
def test_every_api_version_loads(registry: Registry, version: str) -> None:
    pipeline = build_pipeline(*load_raw(README_EXAMPLE.replace("llm-d.ai/v1", version, 1)), registry)
    assert pipeline.config.api_version == version and len(pipeline.admitters) == 1


def test_an_unknown_api_version_is_still_refused() -> None:
    with pytest.raises(ConfigError, match="apiVersion"):
        load_raw(README_EXAMPLE.replace("llm-d.ai/v1", "llm-d.ai/v2", 1))


DETECTORS = """\
plugins:
- type: utilization-detector
- type: other-detector
- type: random-picker
"""


@pytest.mark.parametrize("extra, expected", [
    ("", "utilization-detector"),
    ("saturationDetector: {pluginRef: other-detector}\n", "other-detector"),
    ("flowControl: {saturationDetector: {pluginRef: other-detector}}\n", "other-detector"),
    ("saturationDetector: {pluginRef: utilization-detector}\n"
     "flowControl: {saturationDetector: {pluginRef: other-detector}}\n", "other-detector"),
    ("saturationDetector: {pluginRef: other-detector}\nflowControl: {saturationDetector: {}}\n", "other-detector"),
    ("featureGates: [flowControl]\nflowControl: {saturationDetector: {pluginRef: other-detector}}\n",
     "other-detector"),
], ids=["default", "top-level", "flowControl", "flowControl-wins", "empty-ref-falls-back", "with-gate"])
def test_flow_control_saturation_detector_takes_precedence(registry: Registry, extra: str, expected: str) -> None:
    pipeline = build_pipeline(*load_raw(DETECTORS + extra), registry)
    assert pipeline.saturation_detector.name == expected


@pytest.mark.parametrize("ref, message", [
    ("nowhere", "flowControl.saturationDetector.pluginRef references unknown plugin 'nowhere'"),
    ("random-picker", "cannot use plugin 'random-picker' (type: random-picker): it is not a saturation detector"),
], ids=["unknown", "not-a-detector"])
def test_a_bad_flow_control_detector_ref_names_the_field_and_line(registry: Registry, ref: str,
                                                                   message: str) -> None:
    text = DETECTORS + f"flowControl:\n  saturationDetector:\n    pluginRef: {ref}\n"
    with pytest.raises(ConfigError) as info:
        build_pipeline(*load_raw(text, "d.yaml"), registry)
    assert message in str(info.value) and info.value.line == 7


# -- the Director ---------------------------------------------------------------------------------------------------

GATES = """\
plugins:
- {type: test-gate, name: first}
- {type: test-gate, name: second, parameters: {deny: %s}}
- {type: test-gate, name: third}
- type: random-picker
"""


class CountingAdmission:
    """An admission controller that counts the slots it gave and got back."""

    def __init__(self) -> None:
        self.given = self.released = 0

    async def admit(self, request: InferenceRequest, candidates: Callable[[], list[Endpoint]]) -> "CountingAdmission":
        self.given += 1
        return self

    def release(self) -> None:
        self.released += 1


def director(registry: Registry, deny: bool, metrics: EppMetrics | None = None) -> tuple[Director, CountingAdmission]:
    pipeline = build_pipeline(*load_raw(GATES % ("true" if deny else "false")), registry)
    store = Datastore()
    for name in ("a", "b"):
        store.upsert(endpoint(name).spec)
    admission = CountingAdmission()
    return Director(pipeline, store, admission, metrics), admission


def asked(d: Director) -> list[list[tuple[str, list[str]]]]:
    return [g.asked for g in d.admitters]  # type: ignore[attr-defined]


async def test_admitters_are_asked_in_config_order_with_the_candidates(registry: Registry) -> None:
    d, admission = director(registry, deny=False)
    assert [a.name for a in d.admitters] == ["first", "second", "third"]
    ctx = await d.route(request())
    rid = ctx.request.request_id
    assert asked(d) == [[(rid, ["a", "b"])]] * 3
    await d.route(request(), subset=[d.datastore.get("b").hostport])  # type: ignore[union-attr]
    assert [calls[-1][1] for calls in asked(d)] == [["b"]] * 3  # the subset hint applies before them
    assert admission.given == 2 and admission.released == 0


async def test_the_first_denial_fails_the_request_as_the_reference_does(registry: Registry) -> None:
    metrics_registry = CollectorRegistry()
    d, admission = director(registry, deny=True, metrics=EppMetrics(metrics_registry))
    with pytest.raises(InternalError) as info:
        await d.route(request())
    assert info.value.message == "request cannot be admitted: second says no"
    assert info.value.status == 500 and info.value.code is ErrorCode.INTERNAL
    assert [len(calls) for calls in asked(d)] == [1, 1, 0]  # the third is not asked
    assert admission.given == admission.released == 1  # the admission slot is given back
    text = generate_latest(metrics_registry).decode()
    assert 'error_code="Internal"' in text and "inference_objective_request_error_total" in text
    assert all(e.inflight_requests == 0 for e in d.datastore.endpoints())  # nothing was booked


async def test_without_admitters_the_pipeline_has_none(registry: Registry) -> None:
    pipeline = build_pipeline(*load_raw("plugins: [{type: random-picker}]\n"), registry)
    store = Datastore()
    store.upsert(endpoint("a").spec)
    d = Director(pipeline, store)
    assert d.admitters == [] and (await d.route(request())).target.name == "a"


async def test_admitters_read_the_state_the_producers_filled_and_the_cycle_runs_on(registry: Registry) -> None:
    """The reference's order is PrepareData, admitters, scheduling: an admitter sees what the producers made for
    the same candidates, and the scheduling cycle runs on that same state (the producers run once)."""
    text = GATES % "false" + "- type: test-stamp-reader\n- type: test-stamp\n"
    pipeline = build_pipeline(*load_raw(text), registry)
    assert [p.type_name for p in pipeline.scheduler.producers][:2] == ["test-stamp", "test-stamp-reader"]
    store = Datastore()
    for name in ("a", "b"):
        store.upsert(endpoint(name).spec)
    d = Director(pipeline, store, CountingAdmission())
    ctx = await d.route(request())
    stamp = (ctx.request.request_id, ["a", "b"])
    first = d.admitters[0]
    [cycle] = first.cycles  # type: ignore[attr-defined]
    assert cycle["stamp"] == stamp and cycle["copied"] == stamp  # the consumer ran after what it consumes
    assert ctx.result.cycle is cycle
