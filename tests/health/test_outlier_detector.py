"""The ``outlier-detector`` state machine: what counts, when an endpoint is ejected, for how long, how many at once,
and how a probe readmits it. A fake clock drives time; probes go to real simulated servers."""

from __future__ import annotations

from typing import Any

import pytest

from epp.datalayer.datastore import Datastore
from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint, EndpointSpec
from epp.framework.plugins import Outcome, PassiveHealth, PluginService, outcome_of_status
from epp.plugins.health.outlier_detector import CONSECUTIVE, PROBE_FAILED, RATE, OutlierDetector
from epp.runtime.builtins import default_registry
from epp_sim import SimConfig, SimServer

from ..conftest import Servers, eventually

FAIL, OK = Outcome.ERROR_STATUS, Outcome.SUCCESS


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def detector(clock: Clock | None = None, **params: Any) -> tuple[OutlierDetector, list[tuple[str, str | None]]]:
    """A detector built from YAML-style ``params`` (as the config loader builds it), and the ejection events."""
    plugin = default_registry().create("outlier-detector", "health", params, None)  # type: ignore[arg-type]
    assert isinstance(plugin, OutlierDetector)
    if clock is not None:
        plugin.clock = clock
    events: list[tuple[str, str | None]] = []
    plugin.on_ejection(lambda ep, reason: events.append((ep.name, reason)))
    return plugin, events


def pool(n: int) -> list[Endpoint]:
    return [Endpoint(EndpointSpec(name=f"ep{i}", address="127.0.0.1", port=9000 + i)) for i in range(n)]


def test_it_fills_the_passive_health_and_service_slots() -> None:
    plugin, _ = detector()
    assert isinstance(plugin, PassiveHealth) and isinstance(plugin, PluginService)


@pytest.mark.parametrize(("status", "cut", "outcome"), [
    (200, False, Outcome.SUCCESS),
    (400, True, Outcome.SUCCESS),   # the client's fault: the server answered
    (404, True, Outcome.SUCCESS),
    (429, True, None),              # load, not a broken server
    (499, True, None),              # the client went away
    (0, True, None),                # no answer head at all
    (200, True, None),              # cut short, cause unseen
    (500, True, Outcome.ERROR_STATUS),
    (503, True, Outcome.ERROR_STATUS),
    (504, True, Outcome.TIMEOUT),
], ids=["200", "400", "404", "429", "client-gone", "no-status", "200-cut", "500", "503", "504"])
def test_what_an_answer_says_of_its_endpoint(status: int, cut: bool, outcome: Outcome | None) -> None:
    assert outcome_of_status(status, cut) is outcome


def test_consecutive_failures_eject_and_a_success_resets_the_streak() -> None:
    plugin, events = detector(Clock(), consecutiveFailures=3)
    eps = pool(4)
    plugin.admissible(eps)
    a = eps[0]
    for outcome in (FAIL, FAIL, OK, FAIL, FAIL):
        plugin.observe(a, outcome, "m")
    assert plugin.ejected() == [] and plugin.admissible(eps) == eps
    plugin.observe(a, Outcome.CONNECT_FAILURE, "m")
    assert plugin.ejected() == ["ep0"] and events == [("ep0", CONSECUTIVE)]
    assert plugin.admissible(eps) == eps[1:]


def test_a_failing_streak_holds_back_new_requests_while_its_in_flight_ones_could_end_it() -> None:
    """At most ``consecutiveFailures`` requests meet a server that has started failing: once its streak plus its
    requests in flight reach the threshold it gets no more until one of them ends the streak or ejects it."""
    plugin, _ = detector(Clock(), consecutiveFailures=3)
    eps = pool(3)
    a = eps[0]
    plugin.observe(a, FAIL, "m")
    a.add_inflight(0)
    assert plugin.admissible(eps) == eps  # streak 1 + 1 in flight < 3
    a.add_inflight(0)
    assert plugin.admissible(eps) == eps[1:]  # streak 1 + 2 in flight: both could fail
    assert plugin.admissible([a]) == [a]  # never without an endpoint
    a.release_inflight(0)
    plugin.observe(a, OK, "m")  # the streak ends: back in, whatever is in flight
    a.add_inflight(0, requests=5)
    assert plugin.admissible(eps) == eps and plugin.ejected() == []


def test_a_success_of_a_request_older_than_the_streak_does_not_end_it() -> None:
    """Streams that began before a server wedged still finish: their successes say nothing of it now, so they do
    not reset the streak; a success of a request that began after the streak's first failure does."""
    clock = Clock()
    plugin, events = detector(clock, consecutiveFailures=3)
    eps = pool(3)
    plugin.admissible(eps)
    a = eps[0]
    before = clock.now
    clock.now += 1
    plugin.observe(a, FAIL, "m", clock.now)
    plugin.observe(a, OK, "m", before)  # a long stream routed before the wedge
    plugin.observe(a, FAIL, "m", clock.now)
    assert plugin.ejected() == []
    plugin.observe(a, OK, "m", clock.now + 0.5)  # routed after the streak began: the server answers again
    plugin.observe(a, FAIL, "m", clock.now + 1)
    plugin.observe(a, FAIL, "m", clock.now + 1)
    assert plugin.ejected() == []
    plugin.observe(a, OK, "m", before)
    plugin.observe(a, FAIL, "m", clock.now + 1)
    assert plugin.ejected() == ["ep0"] and events == [("ep0", CONSECUTIVE)]


def test_a_4xx_never_counts_against_an_endpoint() -> None:
    plugin, _ = detector(Clock(), consecutiveFailures=2)
    eps = pool(3)
    plugin.admissible(eps)
    for status in (500, 400, 500, 404, 500, 429, 422):
        outcome = outcome_of_status(status, cut=status >= 400)
        if outcome is not None:
            plugin.observe(eps[0], outcome, "m")
    assert plugin.ejected() == []


def test_a_failure_percentage_over_the_window_ejects_once_the_volume_is_reached() -> None:
    clock = Clock()
    plugin, events = detector(clock, consecutiveFailures=0, failurePercentageThreshold=50,
                              failurePercentageRequestVolume=10, interval="10s")
    eps = pool(4)
    plugin.admissible(eps)
    a = eps[0]
    for _ in range(8):  # 8 failures, then more successes than failures: never 50%
        plugin.observe(a, FAIL, "m")
        clock.now += 0.1
    clock.now += 11  # the window forgets them
    for outcome in [OK] * 6 + [FAIL] * 3:
        plugin.observe(a, outcome, "m")
    assert plugin.ejected() == []  # 3 of 9: under the volume and under 50%
    for _ in range(3):
        plugin.observe(a, FAIL, "m")
    assert events == [("ep0", RATE)]  # 6 of 12 failed


def test_the_ejection_grows_with_each_ejection_up_to_the_cap_and_lapses_without_the_probe_service() -> None:
    clock = Clock()
    plugin, events = detector(clock, consecutiveFailures=1, baseEjectionTime="10s", maxEjectionTime="25s")
    eps = pool(2)
    plugin.admissible(eps)
    lengths = []
    for _ in range(4):
        plugin.observe(eps[0], FAIL, "m")
        start = clock.now
        while plugin.admissible(eps) != eps:  # not started: the ejection simply runs out
            clock.now += 1
        lengths.append(clock.now - start)
    assert lengths == [10, 20, 25, 25]
    assert [r for _, r in events] == [CONSECUTIVE, None] * 4


def test_a_quiet_stretch_as_long_as_the_longest_ejection_forgives_the_past_ones() -> None:
    clock = Clock()
    plugin, _ = detector(clock, consecutiveFailures=1, baseEjectionTime="10s", maxEjectionTime="30s")
    eps = pool(2)
    plugin.admissible(eps)
    plugin.observe(eps[0], FAIL, "m")
    clock.now += 10
    plugin.admissible(eps)  # readmitted
    clock.now += 30
    plugin.observe(eps[0], FAIL, "m")
    clock.now += 10
    assert plugin.admissible(eps) == eps  # 10 s again, not 20


@pytest.mark.parametrize(("size", "percent", "room"), [(1, 100, 0), (2, 10, 1), (4, 50, 2), (4, 100, 3),
                                                         (10, 25, 2), (4, 0, 0)],
                         ids=["alone", "at-least-one", "half", "never-all", "rounded-down", "off"])
def test_at_most_max_ejection_percent_of_the_pool_is_ejected(size: int, percent: int, room: int) -> None:
    plugin, _ = detector(Clock(), consecutiveFailures=1, maxEjectionPercent=percent)
    eps = pool(size)
    plugin.admissible(eps)
    for ep in eps:
        plugin.observe(ep, FAIL, "m")
    assert len(plugin.ejected()) == room
    assert plugin.admissible(eps) == eps[room:]


def test_candidates_that_are_all_ejected_are_all_admissible() -> None:
    plugin, _ = detector(Clock(), consecutiveFailures=1)
    eps = pool(4)
    plugin.admissible(eps)
    plugin.observe(eps[0], FAIL, "m")
    plugin.observe(eps[1], FAIL, "m")
    assert plugin.admissible(eps[:2]) == eps[:2]  # e.g. a subset hint naming only ejected endpoints
    assert plugin.admissible(eps) == eps[2:]


def test_an_ejected_endpoint_ignores_late_outcomes_and_a_removed_one_is_forgotten() -> None:
    plugin, events = detector(Clock(), consecutiveFailures=1)
    eps = pool(3)
    store = Datastore()
    store.replace_all([ep.spec for ep in eps])
    live = store.endpoints()
    plugin._pool = store  # what start() keeps: the pool sizes the cap
    store.subscribe(plugin._forget)
    plugin.observe(live[0], FAIL, "m")
    plugin.observe(live[0], OK, "m")  # a request already on its way when it was ejected
    assert plugin.ejected() == ["ep0"]
    store.remove("ep0")
    assert plugin.ejected() == [] and events == [("ep0", CONSECUTIVE), ("ep0", None)]


def test_parameters_are_checked_and_errors_name_the_plugin_and_field() -> None:
    registry = default_registry()
    with pytest.raises(ConfigError, match="maxEjectionTime must not be below baseEjectionTime") as err:
        registry.create("outlier-detector", "h", {"baseEjectionTime": "60s", "maxEjectionTime": "30s"},
                        None)  # type: ignore[arg-type]
    assert (err.value.plugin, err.value.field) == ("h", "maxEjectionTime")
    with pytest.raises(ConfigError, match="'consecutive' is not a known parameter"):
        registry.create("outlier-detector", "h", {"consecutive": 3}, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="maxEjectionPercent"):
        registry.create("outlier-detector", "h", {"maxEjectionPercent": 101}, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="positive duration"):
        registry.create("outlier-detector", "h", {"firstByteTimeout": "0s"}, None)  # type: ignore[arg-type]


# -- probes, against real simulated servers -------------------------------------------------------------------

async def test_a_probe_readmits_a_recovered_endpoint_and_a_failed_probe_ejects_it_again_for_longer(
        servers: Servers) -> None:
    sims = [await servers.start(SimServer(SimConfig(model="m", time_scale=0.01, seed=i))) for i in range(3)]
    wedged = sims[0]
    wedged.set_fault("fail", 500)
    store = Datastore()
    store.replace_all([EndpointSpec(name=f"sim{i}", address="127.0.0.1", port=s.port) for i, s in enumerate(sims)])
    plugin, events = detector(consecutiveFailures=2, baseEjectionTime="100ms", maxEjectionTime="1s",
                              probeTimeout="2s")
    await servers.start(plugin, store)
    target = store.get("sim0")
    assert target is not None
    plugin.observe(target, FAIL, "m")
    plugin.observe(target, FAIL, "m")
    assert plugin.ejected() == ["sim0"]
    await eventually(lambda: [r for _, r in events].count(PROBE_FAILED) >= 2, "two failed probes")
    probes = wedged.inference_requests
    assert probes >= 2  # the probes are real inference requests
    wedged.set_fault("ok")
    await eventually(lambda: events[-1] == ("sim0", None), "the readmission")
    assert plugin.ejected() == [] and plugin.admissible(store.endpoints()) == store.endpoints()
    assert wedged.inference_requests > probes


async def test_a_hung_endpoint_fails_its_probe_by_timeout(servers: Servers) -> None:
    sims = [await servers.start(SimServer(SimConfig(model="m", time_scale=0.01, seed=i))) for i in range(2)]
    sims[0].set_fault("hang")
    store = Datastore()
    store.replace_all([EndpointSpec(name=f"sim{i}", address="127.0.0.1", port=s.port) for i, s in enumerate(sims)])
    plugin, events = detector(consecutiveFailures=1, baseEjectionTime="50ms", probeTimeout="200ms")
    await servers.start(plugin, store)
    target = store.get("sim0")
    assert target is not None
    plugin.observe(target, Outcome.FIRST_BYTE_TIMEOUT, "m")
    await eventually(lambda: ("sim0", PROBE_FAILED) in events, "a probe that timed out")
    sims[0].set_fault("ok")
    await eventually(lambda: plugin.ejected() == [], "the readmission")


def test_an_endpoint_whose_name_moved_to_another_address_starts_afresh() -> None:
    plugin, events = detector(Clock(), consecutiveFailures=1)
    eps = pool(3)
    plugin.admissible(eps)
    plugin.observe(eps[0], FAIL, "m")
    moved = Endpoint(EndpointSpec(name="ep0", address="127.0.0.2", port=9000))
    plugin.observe(moved, OK, "m")
    assert plugin.ejected() == [] and events == [("ep0", CONSECUTIVE), ("ep0", None)]
