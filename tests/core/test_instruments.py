"""epp.instruments against prometheus-client's own instruments: the same observations must give the same
exposition (text format and OpenMetrics), apart from prometheus-client's ``_created`` series."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from epp.instruments import counter, gauge, histogram

BUCKETS = (0.0, 0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 10.0)
LABELS = ("model_name", "target_model_name")
label_values = st.tuples(st.sampled_from(["a", "b", "m-1"]), st.sampled_from(["x", "y"]))


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(label_values, st.floats(min_value=0, max_value=20, allow_nan=False)), max_size=40))
def test_histogram_exposition_matches_prometheus_client(observations: list[tuple[tuple[str, str], float]]) -> None:
    ours_reg, theirs_reg = CollectorRegistry(), CollectorRegistry()
    ours = histogram("epp_test_seconds", "A test histogram.", LABELS, buckets=BUCKETS, registry=ours_reg)
    theirs = Histogram("epp_test_seconds", "A test histogram.", LABELS, buckets=BUCKETS, registry=theirs_reg)
    for labels, value in observations:
        ours.labels(*labels).observe(value)
        theirs.labels(*labels).observe(value)
    assert _without_created(generate_latest(ours_reg)) == _without_created(generate_latest(theirs_reg))
    assert _without_created(generate_openmetrics(ours_reg)) == _without_created(generate_openmetrics(theirs_reg))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(label_values, st.integers(min_value=0, max_value=1000)), max_size=40))
def test_counter_and_gauge_exposition_match_prometheus_client(steps: list[tuple[tuple[str, str], int]]) -> None:
    ours_reg, theirs_reg = CollectorRegistry(), CollectorRegistry()
    ours_c = counter("epp_test_requests", "A test counter.", LABELS, registry=ours_reg)
    theirs_c = Counter("epp_test_requests", "A test counter.", LABELS, registry=theirs_reg)
    ours_g = gauge("epp_test_running", "A test gauge.", ("model_name",), registry=ours_reg)
    theirs_g = Gauge("epp_test_running", "A test gauge.", ("model_name",), registry=theirs_reg)
    for (model, target), amount in steps:
        ours_c.labels(model, target).inc(amount)
        theirs_c.labels(model, target).inc(amount)
        for g in (ours_g, theirs_g):
            child = g.labels(model)
            child.inc(amount)
            child.dec(amount // 2)
    assert _without_created(generate_latest(ours_reg)) == _without_created(generate_latest(theirs_reg))
    assert _without_created(generate_openmetrics(ours_reg)) == _without_created(generate_openmetrics(theirs_reg))


def test_label_less_histogram_and_gauge_set() -> None:
    reg = CollectorRegistry()
    h = histogram("epp_test_ratio", "Ratios.", buckets=(0.0, 0.5, 1.0), registry=reg)
    g = gauge("epp_test_level", "Level.", registry=reg)
    h.labels().observe(0.0)
    h.labels().observe(0.7)
    g.labels().set(3)
    text = generate_latest(reg).decode()
    assert 'epp_test_ratio_bucket{le="0.0"} 1.0' in text
    assert 'epp_test_ratio_bucket{le="0.5"} 1.0' in text
    assert 'epp_test_ratio_bucket{le="1.0"} 2.0' in text
    assert 'epp_test_ratio_bucket{le="+Inf"} 2.0' in text
    assert "epp_test_ratio_count 2.0" in text and "epp_test_ratio_sum 0.7" in text
    assert "epp_test_level 3.0" in text


def test_misuse_is_refused() -> None:
    reg = CollectorRegistry()
    c = counter("epp_test_total", "Exported as epp_test_total, not epp_test_total_total.", ("a",), registry=reg)
    with pytest.raises(ValueError):
        c.labels("x").inc(-1)
    with pytest.raises(ValueError):
        c.labels("x", "y")
    with pytest.raises(ValueError):  # the registry refuses a second family with the same name
        counter("epp_test", "Duplicate.", registry=reg)
    with pytest.raises(ValueError):
        histogram("epp_test_h", "Unsorted.", buckets=(1.0, 0.5), registry=reg)
    c.labels("x").inc()
    assert 'epp_test_total{a="x"} 1.0' in generate_latest(reg).decode()


def test_gauge_function_is_read_at_each_collection_as_prometheus_client() -> None:
    level = [0.25]
    ours_reg, theirs_reg = CollectorRegistry(), CollectorRegistry()
    ours = gauge("epp_test_saturation", "Read at collection.", ("pool",), registry=ours_reg)
    theirs = Gauge("epp_test_saturation", "Read at collection.", registry=theirs_reg)
    ours.labels("p").set(9)  # a function, once set, wins over the recorded value
    ours.labels("p").set_function(lambda: level[0])
    theirs.set_function(lambda: level[0])
    first = generate_latest(ours_reg).decode()
    level[0] = 1.5
    second = generate_latest(ours_reg).decode()
    assert 'epp_test_saturation{pool="p"} 0.25' in first and 'epp_test_saturation{pool="p"} 1.5' in second
    assert generate_latest(theirs_reg).decode().splitlines()[-1] == "epp_test_saturation 1.5"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), label_values, st.integers(0, 80).map(lambda n: n / 4)),
                max_size=40))  # quarters: sums are exact in any order, so the texts compare exactly
def test_peers_snapshots_merge_into_the_exposition_of_one_process_that_saw_everything(
        observations: list[tuple[int, tuple[str, str], float]]) -> None:
    """Worker 0 reports the sum over itself and its peers (``epp serve --workers``): the same text as a single
    process that recorded every observation, whichever worker recorded it and whenever the snapshots were sent."""
    def families(reg: CollectorRegistry) -> tuple:  # type: ignore[type-arg]
        return (histogram("epp_test_seconds", "H.", LABELS, buckets=BUCKETS, registry=reg),
                counter("epp_test_requests", "C.", LABELS, registry=reg),
                gauge("epp_test_running", "G.", LABELS, registry=reg))

    whole_reg = CollectorRegistry()
    whole = families(whole_reg)
    workers = [families(CollectorRegistry()) for _ in range(2)]
    owner_reg = CollectorRegistry()
    owner = families(owner_reg)
    for i, (worker, labels, value) in enumerate(observations):
        target = owner if worker == 0 else workers[worker - 1]
        for fams in (target, whole):
            fams[0].labels(*labels).observe(value)
            fams[1].labels(*labels).inc(value)
            fams[2].labels(*labels).inc(1)
        if i % 3 == 0:  # an early snapshot, replaced by the later one
            for peer, fams in enumerate(workers, start=1):
                for mine, theirs in zip(owner, fams):
                    mine.merge_peer(peer, theirs.snapshot())
    for peer, fams in enumerate(workers, start=1):
        for mine, theirs in zip(owner, fams):
            mine.merge_peer(peer, theirs.snapshot())
    assert sorted(generate_latest(owner_reg).decode().splitlines()) == \
        sorted(generate_latest(whole_reg).decode().splitlines())


def test_function_gauges_stay_with_their_process() -> None:
    reg = CollectorRegistry()
    g = gauge("epp_test_pool", "G.", ("pool",), registry=reg)
    g.labels("p").set_function(lambda: 3.0)
    g.labels("q").set(2.0)
    assert g.snapshot() == [(("q",), 2.0)]
