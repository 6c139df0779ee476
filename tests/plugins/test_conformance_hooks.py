"""The Gateway API Inference Extension conformance hooks: ``header-based-testing-filter`` and
``destination-endpoint-served-verifier``, and the conformance suite's own plugins config loading unchanged."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.framework.plugins import ResponseHeaders
from epp.plugins.filters.header_based_testing import SELECTION_HEADER, HeaderBasedTestingFilter
from epp.plugins.requestcontrol.destination_endpoint_served_verifier import (
    MISSING_LB,
    MISSING_SERVED,
    RESULT_HEADER,
    DestinationEndpointServedVerifier,
)

from .helpers import cycle, ep, make, names, registry, req

EXCERPT = Path(__file__).parent.parent / "fixtures" / "configs" / "gie" / "conformance_base_plugins-configmap_excerpt.yaml"


def conformance_plugins_yaml() -> str:
    """The ``conformance-plugins.yaml`` the suite's ConfigMap carries, cut from the fixture excerpt as is."""
    lines = EXCERPT.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "conformance-plugins.yaml: |") + 1
    block = []
    for line in lines[start:]:
        if line.strip() == "---" or (line and not line.startswith("    ")):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)) + "\n"


def test_the_conformance_suites_plugins_config_loads_unchanged() -> None:
    shipped = conformance_plugins_yaml()
    assert (EXCERPT.parent.parent.parent / "conformance-configs" / "conformance-plugins.yaml").read_text() == shipped
    pipeline = build_pipeline(*load_raw(shipped, "conformance-plugins.yaml"), registry())
    profile = pipeline.scheduler.profiles["conformance-profile"]
    assert [f.type_name for f in profile.filters] == ["header-based-testing-filter"]
    assert [type(p).type_name for p in pipeline.response_header] == ["destination-endpoint-served-verifier"]


def _select(value: str | None, pool: list) -> list[str]:  # type: ignore[type-arg]
    headers = {SELECTION_HEADER: value} if value is not None else {}
    return names(make(HeaderBasedTestingFilter).filter(cycle(), req(headers=headers), pool))


def test_filter_keeps_the_named_endpoints_in_header_order() -> None:
    pool = [ep("a", address="10.0.0.1"), ep("b", address="10.0.0.2"), ep("c", address="10.0.0.3")]
    assert _select("10.0.0.3:8000, 10.0.0.1", pool) == ["c", "a"]
    assert _select("10.0.0.2", pool) == ["b"]


def test_filter_without_or_with_a_blank_header_keeps_nothing() -> None:
    pool = [ep("a", address="10.0.0.1")]
    assert _select(None, pool) == []
    assert _select("  ", pool) == []
    assert _select(",", pool) == []


def test_filter_ip_port_items_need_the_exact_port_and_unknown_items_are_skipped() -> None:
    pool = [ep("a", address="10.0.0.1", port=8000), ep("b", address="10.0.0.2", port=8000)]
    assert _select("10.0.0.1:9000", pool) == []
    assert _select("10.9.9.9, 10.0.0.2:8000, nonsense", pool) == ["b"]


def test_filter_keeps_one_endpoint_per_ip_and_a_bare_ip_means_the_last_rank_listed() -> None:
    ranks = [ep("r0", address="10.0.0.1", port=8000), ep("r1", address="10.0.0.1", port=8001)]
    assert _select("10.0.0.1", ranks) == ["r1"]
    assert _select("10.0.0.1:8000", ranks) == ["r0"]
    assert _select("10.0.0.1:8000,10.0.0.1:8001", ranks) == ["r0"]  # de-duplicated by IP, as the reference


def test_filter_reads_bracketed_ipv6() -> None:
    pool = [ep("v6", address="fd00::1", port=8000), ep("v4", address="10.0.0.1")]
    assert _select("[fd00::1]:8000", pool) == ["v6"]
    assert _select("[fd00::1]", pool) == ["v6"]
    assert _select("fd00::1", pool) == ["v6"]


@pytest.mark.parametrize("served, metadata, expected", [
    ("10.0.0.2:8000", {}, "10.0.0.2:8000"),
    ("", {}, MISSING_LB),
    ("", {"envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.2:8000"}}, MISSING_SERVED),
], ids=["served", "no-envoy-lb", "envoy-lb-without-served-key"])
def test_verifier_reports_what_the_proxy_served_or_the_reference_failure_text(
        served: str, metadata: dict, expected: str) -> None:  # type: ignore[type-arg]
    response = ResponseHeaders(200, served, metadata)
    make(DestinationEndpointServedVerifier).response_header(req(), response, ep("a", address="10.0.0.1"))
    assert response.headers == {RESULT_HEADER: expected}
