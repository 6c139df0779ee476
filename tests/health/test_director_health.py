"""The Director's side of passive health: the default plugin is on, ejected endpoints leave the candidates (never
all of them), and every way a request ends reaches the plugin once: the final status, a retried attempt, the
endpoints Envoy skipped, a prefill step and an overdue first byte. Also the config (``check-config``) and metrics
views."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.errors import ConfigError
from epp.framework.endpoint import EndpointSpec
from epp.framework.plugins import Outcome, ResponseInfo
from epp.metrics.families import EppMetrics
from epp.plugins.health.outlier_detector import CONSECUTIVE, OutlierDetector
from epp.runtime.builtins import default_registry
from epp.scheduling.director import Director, RequestContext

from ..conftest import eventually

RANDOM = """
plugins:
- type: random-picker
  parameters: {maxNumOfEndpoints: %d}
- type: outlier-detector
  parameters: %s
schedulingProfiles:
- name: default
  plugins: [{pluginRef: random-picker}]
"""


def director(params: str = "{consecutiveFailures: 2}", picks: int = 1, n: int = 4,
             metrics: EppMetrics | None = None) -> tuple[Director, OutlierDetector]:
    pipeline = build_pipeline(*load_raw(RANDOM % (picks, params)), default_registry(entry_points=False))
    store = Datastore("pool")
    store.replace_all([EndpointSpec(name=f"ep{i}", address=f"10.0.0.{i + 1}", port=8000) for i in range(n)])
    store.mark_synced()
    d = Director(pipeline, store, metrics=metrics)
    assert isinstance(d.health, OutlierDetector)
    return d, d.health


async def routed(d: Director, stream: bool = False) -> RequestContext:
    body = b'{"model": "m", "prompt": "hi", "stream": %s}' % (b"true" if stream else b"false")
    return await d.route(d.parse("/v1/completions", body, {}))


def test_the_default_config_has_an_outlier_detector_and_check_config_shows_it() -> None:
    pipeline = build_pipeline(*load_raw(""), default_registry(entry_points=False))
    assert isinstance(pipeline.health, OutlierDetector)
    text = pipeline.describe()
    assert "passiveHealth: outlier-detector" in text
    assert '- outlier-detector {"consecutiveFailures":5,' in text


def test_a_configured_detector_replaces_the_default_and_two_are_an_error() -> None:
    pipeline = build_pipeline(*load_raw(RANDOM % (1, "{consecutiveFailures: 0}")),
                              default_registry(entry_points=False))
    detectors = [p for p in pipeline.handle.plugins() if isinstance(p, OutlierDetector)]
    assert detectors == [pipeline.health] and detectors[0].params.consecutive_failures == 0
    two = "plugins:\n- type: outlier-detector\n  name: a\n- type: outlier-detector\n  name: b\n"
    with pytest.raises(ConfigError, match="only one passive-health plugin is allowed, found 'a', 'b'"):
        build_pipeline(*load_raw(two), default_registry(entry_points=False))


def test_a_bad_parameter_names_the_plugin_field_and_line() -> None:
    text = "plugins:\n- type: queue-scorer\n- type: outlier-detector\n  parameters:\n    maxEjectionPercent: 120\n"
    with pytest.raises(ConfigError) as err:
        build_pipeline(*load_raw(text, "cfg.yaml"), default_registry(entry_points=False))
    assert (err.value.plugin, err.value.field, err.value.line) == ("outlier-detector", "maxEjectionPercent", 5)


async def test_ejected_endpoints_leave_the_candidates_but_never_all_of_them() -> None:
    d, health = director("{consecutiveFailures: 1, maxEjectionPercent: 50}")
    eps = d.datastore.endpoints()
    d.candidates()
    health.observe(eps[0], Outcome.ERROR_STATUS, "m")
    assert d.candidates() == eps[1:]
    assert d.candidates(["10.0.0.1"]) == [eps[0]]  # a subset of ejected endpoints only: routed there anyway
    for _ in range(20):
        ctx = await routed(d)
        assert ctx.target is not eps[0]
        d.response_complete(ctx, ResponseInfo(status=200))


async def test_completion_reports_the_final_status_once_and_a_429_or_a_client_gone_not_at_all() -> None:
    d, health = director("{consecutiveFailures: 2}")
    seen: list[tuple[str, Outcome]] = []
    health.observe = lambda ep, outcome, model, started=None: seen.append((ep.name, outcome))  # type: ignore[method-assign]
    for status, error in ((200, False), (503, True), (429, True), (499, True), (404, True)):
        ctx = await routed(d)
        d.response_complete(ctx, ResponseInfo(status=status, error=error))
        d.response_complete(ctx, ResponseInfo(status=500, error=True))  # idempotent: not reported again
    assert [o for _, o in seen] == [Outcome.SUCCESS, Outcome.ERROR_STATUS, Outcome.SUCCESS]


async def test_a_retried_attempt_is_reported_against_the_endpoint_it_failed_on() -> None:
    d, health = director("{consecutiveFailures: 2}")
    seen: list[tuple[str, Outcome]] = []
    health.observe = lambda ep, outcome, model, started=None: seen.append((ep.name, outcome))  # type: ignore[method-assign]
    ctx = await routed(d)
    first = ctx.target
    moved = d.retry(ctx, [first], Outcome.CONNECT_FAILURE)
    assert moved is not None and moved is not first
    d.response_complete(ctx, ResponseInfo(status=200))
    assert seen == [(first.name, Outcome.CONNECT_FAILURE), (moved.name, Outcome.SUCCESS)]


async def test_the_endpoints_envoy_skipped_before_the_one_that_served_are_reported_as_failed() -> None:
    d, health = director("{consecutiveFailures: 2}", picks=3)
    seen: list[tuple[str, Outcome]] = []
    health.observe = lambda ep, outcome, model, started=None: seen.append((ep.name, outcome))  # type: ignore[method-assign]
    ctx = await routed(d)
    order = [ctx.target, *ctx.fallbacks]
    assert d.served_by(ctx, order[2].hostport)
    d.response_complete(ctx, ResponseInfo(status=200))
    assert seen == [(order[0].name, Outcome.PROXY_RETRIED), (order[1].name, Outcome.PROXY_RETRIED),
                    (order[2].name, Outcome.SUCCESS)]


async def test_an_overdue_first_byte_counts_once_and_an_early_one_not_at_all() -> None:
    d, health = director("{consecutiveFailures: 5, firstByteTimeout: 20ms}")
    seen: list[tuple[str, Outcome]] = []
    health.observe = lambda ep, outcome, model, started=None: seen.append((ep.name, outcome))  # type: ignore[method-assign]
    slow = await routed(d, stream=True)
    await eventually(lambda: seen, "the first-byte deadline")
    assert seen == [(slow.target.name, Outcome.FIRST_BYTE_TIMEOUT)]
    d.response_complete(slow, ResponseInfo(status=200))  # it ended after all: already judged
    fast = await routed(d, stream=True)
    d.response_started(fast)
    d.response_complete(fast, ResponseInfo(status=200))
    unseen = await routed(d, stream=True)  # ext_proc without the response body: never a first byte to see
    d.first_byte_unseen(unseen)
    whole = await routed(d, stream=False)  # a non-streamed answer's first byte is its last: no deadline
    assert fast.overdue is None and unseen.overdue is None and whole.overdue is None
    await asyncio.sleep(0.05)  # past the deadlines they would have had: nothing more is reported
    assert seen == [(slow.target.name, Outcome.FIRST_BYTE_TIMEOUT), (fast.target.name, Outcome.SUCCESS)]


async def test_a_prefill_step_is_reported_against_its_own_endpoint() -> None:
    d, health = director("{consecutiveFailures: 1}")
    ctx = await routed(d)
    other = next(ep for ep in d.datastore.endpoints() if ep is not ctx.target)
    d.upstream_outcome(ctx, other, Outcome.TIMEOUT)
    assert health.ejected() == [other.name]


async def test_ejections_are_counted_by_endpoint_and_reason_and_the_gauge_follows() -> None:
    registry = CollectorRegistry()
    d, health = director("{consecutiveFailures: 1, baseEjectionTime: 10ms}", metrics=EppMetrics(registry))
    ep = d.datastore.endpoints()[0]
    d.candidates()
    text = generate_latest(registry).decode()
    assert 'llm_d_epp_ejected_endpoints{name="pool"} 0.0' in text
    health.observe(ep, Outcome.ERROR_STATUS, "m")
    text = generate_latest(registry).decode()
    assert f'llm_d_epp_endpoint_ejections_total{{endpoint_name="ep0",reason="{CONSECUTIVE}"}} 1.0' in text
    assert 'llm_d_epp_ejected_endpoints{name="pool"} 1.0' in text
    await eventually(lambda: d.candidates() == d.datastore.endpoints(), "the ejection to run out")
    assert 'llm_d_epp_ejected_endpoints{name="pool"} 0.0' in generate_latest(registry).decode()
