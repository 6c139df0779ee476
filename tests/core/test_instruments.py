"""epp.metrics.instruments against prometheus-client's own instruments: the same observations must give the same
exposition (text format and OpenMetrics), apart from prometheus-client's ``_created`` series."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from epp.metrics.instruments import HistogramTee, counter, gauge, histogram, renamed

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


def _exposition(reg: CollectorRegistry) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    """Family name -> (HELP, samples) of ``reg``'s text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: (f.documentation, [(s.name, s.labels, s.value) for s in f.samples])
            for f in text_string_to_metric_families(generate_latest(reg).decode())}


def test_renamed_families_show_every_recording_under_both_names_with_their_own_labels() -> None:
    """A deprecated name and its successor (the reference's legacy and ``llm_d_epp_`` families): one
    recording, through either, counts in both; the old HELP names the successor; peers' values show in both."""
    reg = CollectorRegistry()
    old = renamed(counter, "epp_test_attempts_total", "epp_new_attempts_total", "Attempts.", ("status", "pod_name"),
                  new_labelnames=("status", "endpoint_name"), registry=reg)
    hist = renamed(histogram, "epp_test_seconds", "epp_new_seconds", "Latency.", LABELS, buckets=BUCKETS,
                   registry=reg)
    kept = renamed(gauge, "epp_test_info", "epp_new_info", "Info.", registry=reg, mark=False)
    old.labels("success", "pod-a").inc()
    hist.labels("m", "t").observe(0.3)
    kept.labels().set(1)
    old.merge_peer(1, [(("success", "pod-a"), 2.0), (("failure", ""), 1.0)])
    fams = _exposition(reg)
    assert fams["epp_test_attempts"][0] == "[Deprecated: Use epp_new_attempts_total] Attempts."
    assert fams["epp_new_attempts"][0] == "Attempts." and fams["epp_new_info"][0] == fams["epp_test_info"][0]
    assert fams["epp_new_attempts"][1] == [
        ("epp_new_attempts_total", {"status": "success", "endpoint_name": "pod-a"}, 3.0),
        ("epp_new_attempts_total", {"status": "failure", "endpoint_name": ""}, 1.0)]
    assert [(n.replace("epp_test_", "epp_new_"), labels, v) for n, labels, v in fams["epp_test_seconds"][1]] == \
        fams["epp_new_seconds"][1]
    assert [v for _, _, v in fams["epp_new_seconds"][1] if v] and fams["epp_new_info"][1][0][2] == 1.0
    twin = hist.twin("epp_other_seconds", "Latency.", registry=reg)
    assert twin.twin_of is hist and twin.labels("m", "t") is hist.labels("m", "t") and twin.snapshot() == \
        hist.snapshot()


def test_a_twin_needs_as_many_label_names() -> None:
    fam = counter("epp_test_requests", "C.", LABELS, registry=CollectorRegistry())
    with pytest.raises(ValueError, match="label names"):
        fam.twin("epp_new_requests", "C.", ("model_name",), registry=CollectorRegistry())


def test_a_histogram_tee_observes_into_both_series_as_two_observations_would() -> None:
    teed_reg, plain_reg = CollectorRegistry(), CollectorRegistry()
    names = ("epp_a_seconds", "epp_b_seconds")
    teed = [histogram(n, "H.", LABELS, buckets=BUCKETS, registry=teed_reg) for n in names]
    plain = [histogram(n, "H.", LABELS, buckets=BUCKETS, registry=plain_reg) for n in names]
    tee = HistogramTee(teed[0].labels("m", "t"), teed[1].labels("m", "u"))
    for value in (0.0, 0.004, 0.3, 2.5, 99.0):
        tee.observe(value)
        plain[0].labels("m", "t").observe(value)
        plain[1].labels("m", "u").observe(value)
    assert generate_latest(teed_reg) == generate_latest(plain_reg)
    other = histogram("epp_c_seconds", "H.", buckets=(1.0, 2.0), registry=CollectorRegistry())
    with pytest.raises(ValueError, match="same buckets"):
        HistogramTee(teed[0].labels("m", "t"), other.labels())
