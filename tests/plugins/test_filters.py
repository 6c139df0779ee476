"""Filters: label selector, by-label, role filters, kv-capacity (the prefix-affinity filter is in test_prefix_cache)."""

from __future__ import annotations

import pytest

from epp.errors import ConfigError
from epp.framework.plugins import Handle
from epp.plugins.filters.by_label import ByLabelFilter
from epp.plugins.filters.decode_filter import DecodeFilter
from epp.plugins.filters.encode_filter import EncodeFilter
from epp.plugins.filters.kv_capacity import KvCapacityFilter
from epp.plugins.filters.label_selector import LabelSelectorFilter
from epp.plugins.filters.prefill_filter import PrefillFilter

from .helpers import approx_producer, bind_all, cycle, ep, make, names, registry, req

POD_LABELS = {
    "nginx-1": {"app": "nginx", "version": "v1.0", "tier": "frontend"},
    "nginx-2": {"app": "nginx", "version": "v1.1", "tier": "frontend"},
    "coredns": {"app": "coredns", "tier": "system"},
    "redis": {"app": "redis", "tier": "backend", "deprecated": "true"},
    "web": {"app": "web", "tier": "frontend", "environment": "production"},
    "no-tier": {"app": "unknown"},
}
PODS = [ep(n, labels=lbl) for n, lbl in POD_LABELS.items()]


@pytest.mark.parametrize("raw,expected", [
    ({}, list(POD_LABELS)),
    ({"matchLabels": {"app": "nginx"}}, ["nginx-1", "nginx-2"]),
    ({"matchLabels": {"app": "nginx", "version": "v1.1"}}, ["nginx-2"]),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["frontend", "backend"]}]},
     ["nginx-1", "nginx-2", "redis", "web"]),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["frontend"]}]},
     ["coredns", "redis", "no-tier"]),
    ({"matchExpressions": [{"key": "deprecated", "operator": "Exists"}]}, ["redis"]),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, ["no-tier"]),
    ({"matchLabels": {"tier": "frontend"},
      "matchExpressions": [{"key": "environment", "operator": "DoesNotExist"},
                           {"key": "version", "operator": "NotIn", "values": ["v1.0"]}]}, ["nginx-2"]),
    ({"matchLabels": {"app": "nothing"}}, []),
], ids=["empty-selector-keeps-all", "match-labels", "match-labels-two", "in", "notin-includes-absent", "exists",
        "does-not-exist", "labels-and-expressions", "matches-none"])
def test_label_selector(raw: dict, expected: list[str]) -> None:
    flt = make(LabelSelectorFilter, raw)
    assert names(flt.filter(cycle(), req(), PODS)) == expected


@pytest.mark.parametrize("raw,field", [
    ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "matchExpressions"),
    ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "matchExpressions"),
    ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "matchExpressions"),
    ({"matchLabel": {"a": "b"}}, "matchLabel"),
], ids=["in-without-values", "exists-with-values", "unknown-operator", "misspelt-field"])
def test_label_selector_bad_params_name_the_field(raw: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        registry().create("by-label-selector", "sel", raw, Handle())
    assert info.value.plugin == "sel" and info.value.field is not None and info.value.field.startswith(field)


@pytest.mark.parametrize("raw,expected", [
    ({"label": "app", "validValues": ["nginx"]}, ["nginx-1", "nginx-2"]),
    ({"label": "version", "validValues": ["v1.0"]}, ["nginx-1"]),
    ({"label": "tier", "allowsNoLabel": True}, ["no-tier"]),
    ({"label": "tier", "validValues": ["frontend", "backend", "system"]},
     ["nginx-1", "nginx-2", "coredns", "redis", "web"]),
    ({"label": "tier", "validValues": ["system"], "allowsNoLabel": True}, ["coredns", "no-tier"]),
], ids=["app-nginx", "exact-version", "only-unlabeled", "all-known-tiers", "value-or-unlabeled"])
def test_by_label(raw: dict, expected: list[str]) -> None:
    assert names(make(ByLabelFilter, raw).filter(cycle(), req(), PODS)) == expected


@pytest.mark.parametrize("raw", [
    {"label": "", "validValues": ["a"]},
    {"validValues": ["a"]},
    {"label": "tier", "validValues": []},
    {"label": "tier"},
    {"label": "tier", "validValues": "frontend"},
], ids=["empty-label", "missing-label", "empty-values-no-unlabeled", "no-values-no-unlabeled", "values-not-list"])
def test_by_label_rejects_contradictory_config(raw: dict) -> None:
    with pytest.raises(ConfigError, match="by-label"):
        registry().create("by-label", "by-label", raw, Handle())


ROLES = ["prefill", "decode", "both", "prefill-decode", "encode", "encode-prefill", "encode-prefill-decode",
         "other", None]
ROLE_EPS = [ep(f"ep-{r or 'unlabeled'}", role=r) for r in ROLES]


@pytest.mark.parametrize("cls,expected", [
    (DecodeFilter, ["decode", "both", "prefill-decode", "encode-prefill-decode", "unlabeled"]),
    (PrefillFilter, ["prefill", "both", "prefill-decode", "encode-prefill", "encode-prefill-decode"]),
    (EncodeFilter, ["encode", "encode-prefill", "encode-prefill-decode"]),
], ids=["decode", "prefill", "encode"])
def test_role_filters(cls: type, expected: list[str]) -> None:
    kept = make(cls).filter(cycle(), req(), ROLE_EPS)
    assert [n.removeprefix("ep-") for n in names(kept)] == expected


def test_role_filter_on_empty_candidates_is_empty() -> None:
    assert make(DecodeFilter).filter(cycle(), req(), []) == []


def test_role_filter_rejects_parameters() -> None:
    with pytest.raises(ConfigError, match="allowsNoLabel"):
        registry().create("decode-filter", "d", {"allowsNoLabel": False}, Handle())


# kv-capacity-filter: need = ceil((input_tokens + max_tokens) / block), free = gpu_blocks * (1 - kv).
# The prompt "x" * 400 is 100 input tokens.
@pytest.mark.parametrize("max_tokens,endpoints,expected", [
    # 100 + 60 = 160 tokens -> 10 blocks of 16.  free: a 10*(1-0)=10 ok; b 20*(1-0.55)=9 no; c unknown passes.
    (60, [dict(name="a", gpu_blocks=10, block_size=16), dict(name="b", gpu_blocks=20, kv=0.55, block_size=16),
          dict(name="c")], ["a", "c"]),
    # 161 tokens -> ceil(161/16) = 11 blocks; a has 10 free now.
    (61, [dict(name="a", gpu_blocks=10, block_size=16), dict(name="b", gpu_blocks=11, block_size=16)], ["b"]),
    # block size 32: 160 tokens -> 5 blocks; 8*(1-0.4)=4.8 < 5 drops it; unknown block size uses 16 -> 10 blocks.
    (60, [dict(name="a", gpu_blocks=8, kv=0.4, block_size=32), dict(name="b", gpu_blocks=8, kv=0.25, block_size=32),
          dict(name="c", gpu_blocks=10)], ["b", "c"]),
    # max_tokens unset: 100 + 150 (1.5x) = 250 tokens -> 16 blocks.
    (None, [dict(name="a", gpu_blocks=15, block_size=16), dict(name="b", gpu_blocks=16, block_size=16)], ["b"]),
    # nobody fits: keep all rather than fail the request.
    (60, [dict(name="a", gpu_blocks=5, block_size=16), dict(name="b", gpu_blocks=9, block_size=16)], ["a", "b"]),
    # kv usage above 1 is clamped (0 free), below 0 too (all free).
    (60, [dict(name="a", gpu_blocks=100, kv=1.2, block_size=16), dict(name="b", gpu_blocks=10, kv=-0.5,
                                                                        block_size=16)], ["b"]),
    # stale metrics are still the best information: an old snapshot is used as is.
    (60, [dict(name="a", gpu_blocks=10, block_size=16, update_time=0.0),
          dict(name="b", gpu_blocks=9, block_size=16, update_time=0.0)], ["a"]),
    (60, [], []),
], ids=["fits-and-unknown", "one-token-over", "per-endpoint-block-size", "max-tokens-estimated", "none-fit-keep-all",
        "usage-clamped", "stale-metrics", "empty"])
def test_kv_capacity_filter(max_tokens: int | None, endpoints: list[dict], expected: list[str]) -> None:
    eps = [ep(**spec) for spec in endpoints]
    kept = make(KvCapacityFilter).filter(cycle(), req("x" * 400, max_tokens=max_tokens), eps)
    assert names(kept) == expected



@pytest.mark.parametrize("producer, expected", [
    (True, ["a"]),              # a holds 3,000 of the 5,000 tokens: 125 blocks needed, 150 free
    (False, ["a", "b"]),        # without the discount neither has 313 free blocks: both are kept
], ids=["discounted", "no-producer"])
def test_kv_capacity_filter_discounts_the_prefix_an_endpoint_holds(producer: bool, expected: list[str]) -> None:
    """prompt 4,000 + max_tokens 1,000 = 5,000 tokens = 313 blocks; each endpoint has 150 free; the prefix
    producer's match says a holds 3,000 tokens of the prompt (blocks of 64 characters = 16 tokens)."""
    from epp.plugins.producers.approx_prefix_cache import PrefixMatch

    source = approx_producer({"blockSizeTokens": 16})
    raw = {"prefixMatchInfoProducerName": source.name} if producer else {}
    flt = make(KvCapacityFilter, raw)
    bind_all(source, flt)
    state = cycle()
    state[source.state_key] = PrefixMatch(hashes=list(range(250)), matches={"a": 3000 // 16}, block_chars=64)
    eps = [ep(name, gpu_blocks=1000, kv=0.85, block_size=16) for name in ("a", "b")]
    assert names(flt.filter(state, req("x" * 16_000, max_tokens=1000), eps)) == expected
