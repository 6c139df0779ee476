"""The current reference's flowControl fields: the two queue-wait budgets (``defaultRequestTTL`` while the candidate
pool has endpoints, ``noEndpointRequestTTL`` while it has none), ``defaultNegativePriorityBand`` and the 5000
default band ``maxRequests``; loaded from YAML, then driven with requests through the controller and through EPP."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import aiohttp
import orjson
import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError, NoCandidates, RequestExpired, Saturated
from epp.flowcontrol import FlowControlConfig, Reason
from epp.flowcontrol.budget import longest_queue_wait
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.builtins import default_registry

from .helpers import Clients, FakeClock, FakeDetector, controller, endpoint, settle


def _load(text: str, plugins: str = "") -> FlowControlConfig:
    doc = "featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n" + plugins + textwrap.dedent(text)
    return build_pipeline(*load_raw(doc, "t.yaml"), default_registry()).flow_control


# -- loading --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "default_ttl", "no_endpoint_ttl"), [
    ("flowControl: {}\n", 60.0, 60.0),
    ("flowControl: {defaultRequestTTL: 0s}\n", 0.0, 60.0),
    ("flowControl: {noEndpointRequestTTL: 10m}\n", 60.0, 600.0),
    ("flowControl: {noEndpointRequestTTL: 0s, defaultRequestTTL: 1m30s}\n", 90.0, 0.0),
    ("flowControl: {noEndpointRequestTTL: 2.5}\n", 60.0, 2.5),
], ids=["omitted", "default-off", "no-endpoint-10m", "no-endpoint-off", "number"])
def test_ttls_load_with_the_reference_defaults(section: str, default_ttl: float, no_endpoint_ttl: float) -> None:
    cfg = _load(section)
    assert (cfg.default_request_ttl, cfg.no_endpoint_request_ttl) == (default_ttl, no_endpoint_ttl)


@pytest.mark.parametrize("section", ["flowControl: {noEndpointRequestTTL: -1s}\n",
                                     "flowControl: {noEndpointRequestTTL: soon}\n"], ids=["negative", "text"])
def test_a_bad_no_endpoint_ttl_is_a_config_error_naming_it(section: str) -> None:
    with pytest.raises(ConfigError, match="noEndpointRequestTTL"):
        _load(section)


def test_bands_template_by_sign_and_default_to_5000_requests() -> None:
    cfg = _load("""\
        flowControl:
          defaultPriorityBand: {maxBytes: 1Mi}
          defaultNegativePriorityBand: {maxRequests: 2, orderingPolicyRef: edf-ordering-policy}
          priorityBands: [{priority: -5, maxRequests: 0}, {priority: 3}]
        """, "- type: edf-ordering-policy\n")
    assert (cfg.band(-1).request_limit, cfg.band(-1).ordering_policy_ref) == (2, "edf-ordering-policy")
    assert cfg.band(-1).priority == -1 and cfg.band(-1).byte_limit == 1_000_000_000  # not the positive template
    assert (cfg.band(0).request_limit, cfg.band(0).byte_limit) == (5000, 2**20)
    assert cfg.band(-5).request_limit == 5000 and cfg.band(3).request_limit == 5000  # listed: 0 or omitted = 5000
    assert _load("flowControl: {defaultPriorityBand: {maxRequests: 4}}\n").band(-2).request_limit == 4  # fallback


def test_a_negative_band_template_naming_an_undeclared_policy_fails_at_its_line() -> None:
    with pytest.raises(ConfigError) as info:
        _load("flowControl:\n  defaultNegativePriorityBand: {fairnessPolicyRef: nobody}\n")
    assert "nobody" in str(info.value) and info.value.line == 5


@pytest.mark.parametrize(("section", "wait"), [
    ({}, 60.0), ({"noEndpointRequestTTL": "5m"}, 300.0), ({"defaultRequestTTL": "2m"}, 120.0),
    ({"noEndpointRequestTTL": "0s"}, 0.0),
], ids=["defaults", "no-endpoint-longer", "default-longer", "unbounded"])
def test_longest_queue_wait_covers_both_regimes(section: dict, wait: float) -> None:
    assert longest_queue_wait(FlowControlConfig.model_validate(section)) == wait


# -- the controller -------------------------------------------------------------------------------------------

async def _queued(cfg: dict, clock: FakeClock, pool_empty: bool) -> tuple[Clients, str]:
    clients = Clients(controller(cfg, clock=clock, detector=FakeDetector(1.0)))
    if pool_empty:
        clients.pool = []
    return clients, await clients.send("a")


async def test_a_request_waiting_for_an_empty_pool_is_evicted_as_unavailable() -> None:
    clock = FakeClock()
    clients, rid = await _queued({"defaultRequestTTL": "1s", "noEndpointRequestTTL": "10s"}, clock, True)
    clock.advance(9.9)
    assert clients.ctrl.expire() == 0  # the short with-endpoints budget does not apply
    clock.advance(0.2)
    assert clients.ctrl.expire() == 1
    await settle()
    err = clients.error(rid)
    assert isinstance(err, RequestExpired) and err.status == 503 and err.reason == Reason.NO_ENDPOINTS
    assert err.dropped == "rejected-no-endpoints" and clients.ctrl.queued == 0


@pytest.mark.parametrize(("change_at", "evicted_at"), [(2.0, 6.0), (8.0, 10.0)], ids=["fresh-budget", "bounded"])
async def test_endpoints_appearing_start_a_fresh_budget_within_the_longer_one(change_at: float,
                                                                              evicted_at: float) -> None:
    clock = FakeClock()
    clients, rid = await _queued({"defaultRequestTTL": "4s", "noEndpointRequestTTL": "10s"}, clock, True)
    clock.advance(change_at)
    clients.pool = [endpoint("e1")]  # the pool scaled up, yet stays saturated
    assert clients.ctrl.reevaluate() == 1 and clients.ctrl.reevaluate() == 0
    clock.advance(evicted_at - change_at - 0.1)
    assert clients.ctrl.expire() == 0
    clock.advance(0.2)
    assert clients.ctrl.expire() == 1
    await settle()
    err = clients.error(rid)
    assert isinstance(err, Saturated) and err.status == 429 and err.dropped == "rejected-ttl-expired"


async def test_a_pool_emptying_at_the_deadline_gets_the_no_endpoint_budget_instead_of_429() -> None:
    clock = FakeClock()
    clients, rid = await _queued({"defaultRequestTTL": "2s", "noEndpointRequestTTL": "5s"}, clock, False)
    clock.advance(2.1)
    clients.pool = []
    assert clients.ctrl.expire() == 0  # re-read before evicting: the regime changed, fresh budget
    clock.advance(2.8)  # 4.9s after enqueue: inside the 5s bound
    assert clients.ctrl.expire() == 0
    clock.advance(0.2)
    assert clients.ctrl.expire() == 1
    await settle()
    assert isinstance(clients.error(rid), RequestExpired)


async def test_zero_no_endpoint_ttl_waits_for_endpoints_then_the_default_applies() -> None:
    clock = FakeClock()
    clients, rid = await _queued({"defaultRequestTTL": "3s", "noEndpointRequestTTL": "0s"}, clock, True)
    clock.advance(10_000)
    assert clients.ctrl.expire() == 0 and not clients.tasks[rid].done()
    clients.pool = [endpoint("e1")]
    assert clients.ctrl.reevaluate() == 1
    clock.advance(2.9)  # no bound (one regime has none): the fresh 3s runs from the change
    assert clients.ctrl.expire() == 0
    clock.advance(0.2)
    assert clients.ctrl.expire() == 1
    await settle()
    assert isinstance(clients.error(rid), Saturated)


async def test_a_full_queue_with_no_endpoints_is_unavailability() -> None:
    clock = FakeClock()
    clients, _ = await _queued({"priorityBands": [{"priority": 0, "maxRequests": 1}]}, clock, True)
    second = await clients.send("b")
    err = clients.error(second)
    assert isinstance(err, NoCandidates) and err.status == 503 and err.reason == Reason.BAND_REQUESTS
    clients.pool = [endpoint("e1")]
    third = await clients.send("c")
    assert isinstance(clients.error(third), Saturated)  # with endpoints: backpressure


async def test_negative_priorities_use_the_negative_band_template() -> None:
    cfg = {"defaultNegativePriorityBand": {"maxRequests": 1}, "defaultPriorityBand": {"maxRequests": 3}}
    clients = Clients(controller(cfg, detector=FakeDetector(1.0)))
    low = [await clients.send("a", priority=-1) for _ in range(2)]
    normal = [await clients.send("a", priority=1) for _ in range(3)]
    assert clients.error(low[0]) is None and getattr(clients.error(low[1]), "reason", None) == Reason.BAND_REQUESTS
    assert all(clients.error(rid) is None for rid in normal)
    assert clients.ctrl.snapshot()["bands"][-1] == {**clients.ctrl.snapshot()["bands"][-1], "priority": -1,
                                                     "maxRequests": 1}


async def test_no_endpoint_evictions_are_counted_under_their_own_reason() -> None:
    clock = FakeClock()
    clients, _ = await _queued({"noEndpointRequestTTL": "1s"}, clock, True)
    clock.advance(1.5)
    clients.ctrl.expire()
    await settle()
    assert clients.ctrl.tenants.get("a").snapshot(clock())["rejected"] == {Reason.NO_ENDPOINTS: 1}


# -- through EPP ----------------------------------------------------------------------------------------------

EMPTY_POOL_CONFIG = """\
featureGates: [flowControl=true]
plugins:
- type: queue-scorer
- type: concurrency-detector
saturationDetector: {pluginRef: concurrency-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
flowControl:
  defaultRequestTTL: 0s
  noEndpointRequestTTL: 300ms
"""


async def test_a_request_to_an_empty_pool_gets_503_no_endpoints_after_its_budget(tmp_path: Path) -> None:
    """No endpoint at all: EPP queues the request (a scale-from-zero waiting room) and answers 503 with the
    reference's no-endpoints drop reason once ``noEndpointRequestTTL`` is spent, although ``defaultRequestTTL``
    is off."""
    config = tmp_path / "epp.yaml"
    config.write_text(EMPTY_POOL_CONFIG)
    app = EppApp(ServeOptions(config=str(config), endpoints=[], host="127.0.0.1", grpc_port=None,
                              health_port=None, metrics_port=None, http_port=0))
    await app.start()
    try:
        body = orjson.dumps({"model": "m", "prompt": "hello"})
        async with aiohttp.ClientSession() as session:
            async with session.post(app.gateway.url + "/v1/completions", data=body,
                                    headers={"content-type": "application/json"}) as answer:
                assert answer.status == 503
                assert answer.headers["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"
                assert (await answer.json())["error"]["code"] == Reason.NO_ENDPOINTS
        assert app.admission is not None and app.admission.queued == 0  # type: ignore[union-attr]
    finally:
        await app.stop()
        await asyncio.sleep(0)
