"""The header trust table (``epp.headers.HEADER_RULES``) and its policy object: which names each trust level
strips or consumes, the ``--trusted-headers`` parser, the subset header, the documented table (docs/extproc.md)
matching the code's, and the gateway's upstream headers following the table's "forwarded" column."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from epp.errors import ConfigError
from epp.gateway._upstream import upstream_headers
from epp.headers import (
    DATA_PARALLEL_HEADER,
    ENCODER_HEADER,
    FAIRNESS_ID_HEADER,
    HEADER_ALIASES,
    HEADER_RULES,
    MODEL_REWRITE_HEADER,
    PREFILLER_HEADER,
    SUBSET_HEADER,
    HeaderRule,
    HeaderTrust,
    Trust,
    header_names,
    parse_trusted_headers,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "extproc.md"
TRUSTED = [r for r in HEADER_RULES if r.trust is Trust.TRUSTED]
ALL_NAMES = {name for r in HEADER_RULES for name in r.names}


def test_the_table_has_each_header_once_in_lower_case() -> None:
    names = [name for r in HEADER_RULES for name in r.names]
    assert len(names) == len(set(names)) and all(n == n.lower() for n in names)
    assert {r.name for r in HEADER_RULES if r.name in HEADER_ALIASES} <= set(HEADER_ALIASES)


def test_by_default_every_trusted_only_and_epp_only_name_is_stripped_and_consumed_names_kept() -> None:
    trust = HeaderTrust()
    expected = {n for r in HEADER_RULES if r.trust is not Trust.CLIENT for n in r.names}
    assert set(trust.stripped) == expected
    assert set(trust.consumed) == {n for r in HEADER_RULES if r.trust is Trust.CLIENT and not r.forwarded
                                   for n in r.names}
    headers = {name: "x" for name in ALL_NAMES} | {"x-other": "kept"}
    removed = trust.strip(headers)
    assert set(headers) == ALL_NAMES - expected | {"x-other"}  # the client-settable ones and the rest stay
    assert set(removed) == expected | set(trust.consumed)  # stripped, and consumed ones removed upstream only


@pytest.mark.parametrize("rule", TRUSTED, ids=[r.name for r in TRUSTED])
def test_a_trusted_header_is_kept_under_both_names_and_consumed_unless_forwarded(rule: HeaderRule) -> None:
    trust = HeaderTrust([rule.names[-1].upper()])  # the alias, if any, in any case, trusts the header
    assert trust.trusted == {rule.name}
    headers = {name: "v" for name in rule.names}
    removed = trust.strip(headers)
    assert set(headers) == set(rule.names)
    assert set(removed) == (set() if rule.forwarded else set(rule.names))


def test_an_empty_trust_strips_nothing_when_the_request_has_none_of_the_names() -> None:
    headers = {":path": "/v1/chat/completions", "content-type": "application/json"}
    assert HeaderTrust().strip(headers) == [] and len(headers) == 2


@pytest.mark.parametrize("text, expected", [
    ("x-gateway-model-name-rewrite, X-LLM-D-Router-Model-Name-Rewrite", (MODEL_REWRITE_HEADER,)),
    ("x-data-parallel-host-port,,x-gateway-destination-endpoint-subset", (DATA_PARALLEL_HEADER, SUBSET_HEADER)),
    ("", ()),
])
def test_parse_trusted_headers(text: str, expected: tuple[str, ...]) -> None:
    assert parse_trusted_headers(text) == expected


@pytest.mark.parametrize("name, why", [
    ("x-llm-d-router-destination-endpoint", "EPP's own output"),
    ("x-gateway-destination-endpoint-served", "EPP's own output"),
    (FAIRNESS_ID_HEADER, "client-settable"),
    ("x-unknown", "not a header EPP acts on"),
])
def test_only_trusted_only_headers_can_be_trusted(name: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_trusted_headers(name)
    with pytest.raises(ConfigError, match="--trusted-headers"):
        HeaderTrust([name])


@pytest.mark.parametrize("headers, expected", [
    ({SUBSET_HEADER: "10.0.0.1:8000, 10.0.0.2"}, ["10.0.0.1:8000", "10.0.0.2"]),
    ({HEADER_ALIASES[SUBSET_HEADER]: "10.0.0.3"}, ["10.0.0.3"]),
    ({SUBSET_HEADER: "10.0.0.1", HEADER_ALIASES[SUBSET_HEADER]: "10.0.0.3"}, ["10.0.0.1"]),
    ({SUBSET_HEADER: ""}, []),  # present and empty: no endpoint allowed, as an empty envoy.lb.subset_hint list
    ({}, None),
])
def test_a_trusted_subset_header(headers: dict[str, str], expected: list[str] | None) -> None:
    assert HeaderTrust([SUBSET_HEADER]).subset(headers) == expected
    assert HeaderTrust().subset(headers) is None  # untrusted: never a hint


def _documented_rows() -> list[tuple[str, str | None, str, bool]]:
    text = DOCS.read_text()
    section = text.split("### Header trust", 1)[1].split("\n### ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            names = re.findall(r"`([^`]+)`", cells[0])
            rows.append((names[0], names[1] if len(names) > 1 else None, cells[2].lower(), cells[3].startswith("yes")))
    return rows


def test_the_documented_table_is_the_codes_table() -> None:
    code = [(r.name, HEADER_ALIASES.get(r.name), r.trust.value, r.forwarded) for r in HEADER_RULES]
    assert _documented_rows() == code


def test_the_gateway_forwards_exactly_what_the_table_says() -> None:
    client = {name: "v" for name in ALL_NAMES}
    sent = upstream_headers(client, {}, "rid", drop_prefiller=False)
    for rule in HEADER_RULES:
        if rule.name == "x-request-id":
            continue  # always set: the request's id
        for name in rule.names:
            assert (name in sent) is rule.forwarded, name


def test_header_names_of_a_rule_are_its_name_then_alias() -> None:
    assert all(r.names == header_names(r.name) for r in HEADER_RULES)


def test_the_headers_plugins_and_front_ends_set_are_the_tables() -> None:
    from epp.extproc import protocol
    from epp.gateway import _upstream
    from epp.plugins.profiles import data_parallel, disagg_headers

    assert data_parallel.DATA_PARALLEL_HEADER == protocol.DATA_PARALLEL_HEADER == DATA_PARALLEL_HEADER
    assert disagg_headers.ENCODER_HEADER == protocol.ENCODER_HEADER == ENCODER_HEADER
    assert disagg_headers.PREFILL_HEADER == _upstream.PREFILLER_HEADER == protocol.PREFILLER_HEADER == PREFILLER_HEADER
