"""NodePlacer, the extender's policy, over Endpoint objects and the real saturation detectors."""

from __future__ import annotations

from typing import Any

import pytest

from epp.extender.placement import MAX_PRIORITY, SATURATED_REASON, NodePlacer
from epp.framework.endpoint import Endpoint, EndpointSpec, Metrics
from epp.framework.plugins import Handle
from epp.plugins.saturation import ConcurrencyDetector, UtilizationDetector

NOW = 100.0
APP = {"app": "vllm", "llm-d.ai/inferenceServing": "true"}
NODES = ["gpu-a", "gpu-b", "cpu-c"]


def utilization() -> UtilizationDetector:
    """queueDepthThreshold 5, kvCacheUtilThreshold 0.8, metrics older than 200 ms count as saturated."""
    return UtilizationDetector("u", UtilizationDetector.Params(), Handle(), clock=lambda: NOW)


def ep(name: str, node: str, *, waiting: int = 0, kv: float = 0.0, role: str | None = None,
       update_time: float = NOW, healthy: bool = True, labels: dict[str, str] | None = None,
       inflight: int = 0) -> Endpoint:
    tags = dict(APP if labels is None else labels)
    if role is not None:
        tags["llm-d.ai/role"] = role
    endpoint = Endpoint(EndpointSpec(name, "10.0.0.1", 8000, labels=tags, node=node),
                        Metrics(waiting=waiting, kv_usage=kv, update_time=update_time))
    endpoint.healthy = healthy
    endpoint.inflight_requests = inflight
    return endpoint


def pod(labels: dict[str, str] | None = None, name: str = "new") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "llm", "labels": dict(APP if labels is None else labels)},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}}


@pytest.mark.parametrize("endpoints, passed, failed", [
    ([ep("a1", "gpu-a", waiting=6), ep("b1", "gpu-b")], ["gpu-b", "cpu-c"], ["gpu-a"]),
    ([ep("a1", "gpu-a", kv=0.85), ep("b1", "gpu-b", kv=0.5)], ["gpu-b", "cpu-c"], ["gpu-a"]),
    ([ep("a1", "gpu-a", waiting=10), ep("a2", "gpu-a")], ["gpu-b", "cpu-c"], ["gpu-a"]),  # mean(2.0, 0) = 1.0
    ([ep("a1", "gpu-a", waiting=4), ep("b1", "gpu-b", waiting=4)], NODES, []),
    ([ep("a1", "gpu-a", update_time=0.0), ep("b1", "gpu-b", healthy=False)], NODES, []),
    ([ep("a1", "gpu-a", waiting=6), ep("a2", "gpu-a", update_time=0.0)], ["gpu-b", "cpu-c"], ["gpu-a"]),
    ([ep("x1", "", waiting=50), ep("z1", "elsewhere", waiting=50)], NODES, []),
], ids=["queue-full", "kv-full", "node-mean-at-one", "below-threshold", "unknown-never-fails",
        "known-saturated-with-unknown", "not-on-a-candidate"])
def test_filter_drops_nodes_whose_model_servers_are_saturated(endpoints: list[Endpoint], passed: list[str],
                                                              failed: list[str]) -> None:
    out, reasons = NodePlacer(utilization()).filter(pod(), NODES, endpoints)
    assert out == passed
    assert reasons == {node: SATURATED_REASON for node in failed}


def test_filter_fails_no_node_when_every_candidate_is_saturated() -> None:
    endpoints = [ep("a1", "gpu-a", waiting=9), ep("b1", "gpu-b", kv=0.95)]
    assert NodePlacer(utilization()).filter(pod(), ["gpu-a", "gpu-b"], endpoints) == (["gpu-a", "gpu-b"], {})


def test_filter_keeps_the_given_order_and_duplicates() -> None:
    endpoints = [ep("b1", "gpu-b", waiting=7)]
    out, failed = NodePlacer(utilization()).filter(pod(), ["cpu-c", "gpu-b", "gpu-a"], endpoints)
    assert out == ["cpu-c", "gpu-a"] and list(failed) == ["gpu-b"]


@pytest.mark.parametrize("labels, model_server", [
    (APP, True),
    ({**APP, "pod-template-hash": "7d9f"}, True),
    ({"app": "epp"}, False),
    ({"llm-d.ai/role": "decode"}, True),
    ({}, False),
], ids=["pool-labels", "other-revision", "epp-pod", "role-label", "no-labels"])
def test_which_pods_are_model_servers(labels: dict[str, str], model_server: bool) -> None:
    endpoints = [ep("a1", "gpu-a", labels={**APP, "pod-template-hash": "5c4b"}),
                 ep("b1", "gpu-b", role="decode")]
    placer = NodePlacer(utilization())
    assert placer.is_model_server(pod(labels), endpoints) is model_server


def test_an_epp_pod_is_never_filtered_but_still_prefers_headroom() -> None:
    endpoints = [ep("a1", "gpu-a", waiting=6), ep("b1", "gpu-b", waiting=2)]
    placer = NodePlacer(utilization())
    assert placer.filter(pod({"app": "epp"}), NODES, endpoints) == (NODES, {})
    assert placer.prioritize(pod({"app": "epp"}), NODES, endpoints) == [("gpu-a", 0), ("gpu-b", 6), ("cpu-c", 10)]


def test_every_pod_is_a_model_server_of_a_pool_whose_endpoints_share_no_label() -> None:
    endpoints = [ep("a1", "gpu-a", waiting=6, labels={}), ep("b1", "gpu-b", labels={"x": "1"})]
    assert NodePlacer(utilization()).filter(pod({"app": "epp"}), NODES, endpoints)[1] == {"gpu-a": SATURATED_REASON}


@pytest.mark.parametrize("endpoints, scores", [
    ([], [10, 10, 10]),
    ([ep("a1", "gpu-a", waiting=1), ep("b1", "gpu-b", waiting=3)], [8, 4, 10]),
    ([ep("a1", "gpu-a", kv=0.4), ep("a2", "gpu-a", waiting=5)], [3, 10, 10]),      # mean(0.5, 1.0) = 0.75
    ([ep("a1", "gpu-a", waiting=20)], [0, 10, 10]),                                  # clamped at saturation 1
    ([ep("a1", "gpu-a", update_time=0.0)], [0, 10, 10]),                             # unknown: no headroom
    ([ep("a1", "gpu-a"), ep("a2", "gpu-a", healthy=False)], [5, 10, 10]),           # half known idle, half unknown
    ([ep("a1", "gpu-a", update_time=NOW - 1)], [0, 10, 10]),                         # stale by the detector
], ids=["empty-pool", "by-queue", "node-mean", "clamped", "never-scraped", "unhealthy", "stale"])
def test_prioritize_scores_headroom(endpoints: list[Endpoint], scores: list[int]) -> None:
    out = NodePlacer(utilization()).prioritize(pod(), NODES, endpoints)
    assert out == list(zip(NODES, scores))
    assert all(0 <= s <= MAX_PRIORITY for _, s in out)


def test_a_decode_pod_prefers_a_node_with_prefill_headroom() -> None:
    endpoints = [ep("p1", "gpu-a", role="prefill", waiting=1), ep("d1", "gpu-a", role="decode", waiting=3),
                 ep("p2", "gpu-b", role="prefill", waiting=4), ep("d2", "cpu-c", role="decode")]
    placer = NodePlacer(utilization())
    decode = placer.prioritize(pod({**APP, "llm-d.ai/role": "decode"}), NODES, endpoints)
    # gpu-a: headroom mean(0.8, 0.4) = 0.6, prefill 0.8 -> 0.25·0.6 + 0.75·0.8 = 0.75; gpu-b: 0.25·0.2 + 0.75·0.2;
    # cpu-c: no prefill -> 0.25·1.0
    assert decode == [("gpu-a", 8), ("gpu-b", 2), ("cpu-c", 3)]
    # a prefill (or role-less) pod of the same pool ranks by headroom alone
    assert placer.prioritize(pod({**APP, "llm-d.ai/role": "prefill"}), NODES, endpoints) == [
        ("gpu-a", 6), ("gpu-b", 2), ("cpu-c", 10)]


def test_a_decode_pod_of_a_pool_without_prefill_ranks_by_headroom() -> None:
    endpoints = [ep("d1", "gpu-a", role="decode", waiting=3)]
    out = NodePlacer(utilization()).prioritize(pod({**APP, "llm-d.ai/role": "decode"}), NODES, endpoints)
    assert out == [("gpu-a", 4), ("gpu-b", 10), ("cpu-c", 10)]


def test_scores_follow_the_endpoints_state_call_by_call() -> None:
    busy = ep("a1", "gpu-a")
    placer = NodePlacer(utilization())
    assert placer.prioritize(pod(), ["gpu-a"], [busy]) == [("gpu-a", 10)]
    busy.metrics = Metrics(waiting=5, update_time=NOW)
    assert placer.prioritize(pod(), ["gpu-a"], [busy]) == [("gpu-a", 0)]
    assert placer.filter(pod(), ["gpu-a", "gpu-b"], [busy]) == (["gpu-b"], {"gpu-a": SATURATED_REASON})


def test_the_concurrency_detector_judges_by_in_flight_requests() -> None:
    detector = ConcurrencyDetector("c", ConcurrencyDetector.Params(maxConcurrency=4), Handle())
    endpoints = [ep("a1", "gpu-a", inflight=4), ep("b1", "gpu-b", inflight=1)]
    placer = NodePlacer(detector)
    assert placer.filter(pod(), NODES, endpoints) == (["gpu-b", "cpu-c"], {"gpu-a": SATURATED_REASON})
    assert placer.prioritize(pod(), NODES, endpoints) == [("gpu-a", 0), ("gpu-b", 8), ("cpu-c", 10)]


def test_a_custom_role_label() -> None:
    endpoints = [ep("p1", "gpu-a", labels={"role": "prefill"}), ep("d1", "gpu-b", labels={"role": "decode"})]
    out = NodePlacer(utilization(), role_label="role").prioritize(pod({"role": "decode"}), NODES, endpoints)
    assert out == [("gpu-a", 10), ("gpu-b", 3), ("cpu-c", 3)]


def test_a_pod_without_labels_is_not_a_model_server_of_a_labelled_pool() -> None:
    endpoints = [ep("a1", "gpu-a", waiting=6)]
    placer = NodePlacer(utilization())
    assert placer.filter({}, NODES, endpoints) == (NODES, {})
    assert placer.filter({"metadata": {"labels": "not-a-map"}}, NODES, endpoints) == (NODES, {})
    assert placer.prioritize({"metadata": None}, NODES, endpoints) == [("gpu-a", 0), ("gpu-b", 10), ("cpu-c", 10)]
