"""inflight-load-producer: config loading (declared, defaulted, named by consumers) and the in-flight load it books
through the real Director and scheduler (estimate, parameters, prefill release at the first byte, prefix discount)."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
import pytest

from epp.cli.check import run as check_config
from epp.config.loader import Pipeline, build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.errors import ConfigError, SchedulingFailed
from epp.framework.endpoint import ROLE_LABEL, EndpointSpec, Metrics
from epp.framework.plugins import ResponseInfo
from epp.plugins.producers.inflight_load import InFlightLoadProducer
from epp.scheduling.director import Director

from .helpers import registry, req

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
CONSUMERS = ["token-load-scorer", "active-request-scorer", "concurrency-detector", "prefix-cache-affinity-filter"]


def pipeline(text: str) -> Pipeline:
    return build_pipeline(*load_raw(HEAD + text, "<test>"), registry())


def producers(p: Pipeline) -> list[InFlightLoadProducer]:
    return [x for x in p.handle.plugins() if isinstance(x, InFlightLoadProducer)]


def director(text: str, *roles: str | None) -> Director:
    """A Director over ``text`` and one endpoint per role (``e0``, ``e1``, ...), all freshly scraped and idle."""
    store = Datastore()
    store.replace_all([EndpointSpec(f"e{i}", f"10.0.0.{i + 1}", 8000, labels={ROLE_LABEL: r} if r else {})
                       for i, r in enumerate(roles)])
    for e in store.endpoints():
        e.metrics = Metrics(update_time=1e12)
    store.mark_synced()
    return Director(pipeline(text), store)


def estimate(prompt: str, ratio: float = 1.5, **extra: int) -> tuple[int, int]:
    """(prompt, output) tokens of the completions request ``req(prompt, **extra)`` builds: its bytes / 4 and
    round(ratio x that)."""
    n = len(orjson.dumps({"model": "m", "prompt": prompt, **extra})) // 4
    return n, int(n * ratio + 0.5)


def load(d: Director, name: str) -> tuple[int, int]:
    ep = d.datastore.get(name)
    assert ep is not None
    return ep.inflight_requests, ep.inflight_tokens


# -- config loading --------------------------------------------------------------------------------------------


def test_without_a_declared_producer_the_loader_adds_one_with_the_defaults() -> None:
    p = pipeline("plugins:\n- type: token-load-scorer\n")
    (producer,) = producers(p)
    assert producer.name == "inflight-load-producer" and producer.params == InFlightLoadProducer.Params()
    assert "inflight-load-producer {" in p.describe()


def test_a_declared_producer_is_the_only_one_and_consumers_may_name_it() -> None:
    p = pipeline("plugins:\n- type: inflight-load-producer\n  name: load\n"
                 "  parameters: {addEstimatedOutputTokens: true, outputRatio: 0.2, maxEstimatedOutputTokens: 1000,"
                 " syncCrossReplicaState: false}\n"
                 + "".join(f"- type: {c}\n  parameters: {{inFlightLoadProducerName: load}}\n" for c in CONSUMERS))
    (producer,) = producers(p)
    assert producer.name == "load" and producer.params.output_ratio == 0.2
    assert producer.params.max_estimated_output_tokens == 1000


@pytest.mark.parametrize("consumer", CONSUMERS)
def test_naming_the_default_producer_needs_no_declaration(consumer: str) -> None:
    """As in the reference, whose loader creates the default producer for its default name."""
    p = pipeline(f"plugins:\n- type: {consumer}\n  parameters: {{inFlightLoadProducerName: inflight-load-producer}}\n")
    assert [x.name for x in producers(p)] == ["inflight-load-producer"]


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("extra, named, reason", [
    ("", "nope", "'nope', which is not configured"),
    ("- type: queue-scorer\n", "queue-scorer", "which is a queue-scorer, not an inflight-load-producer"),
    ("- type: inflight-load-producer\n  name: load\n", "inflight-load-producer", "which is not configured"),
], ids=["missing", "other-type", "declared-under-another-name"])
def test_a_bad_producer_name_is_an_error_naming_the_consumer_and_field(consumer: str, extra: str, named: str,
                                                                        reason: str) -> None:
    text = f"plugins:\n{extra}- type: {consumer}\n  name: reader\n  parameters: {{inFlightLoadProducerName: {named}}}\n"
    with pytest.raises(ConfigError) as info:
        pipeline(text)
    assert info.value.plugin == "reader" and info.value.field == "inFlightLoadProducerName"
    assert f"plugin 'reader' (type: {consumer}): inFlightLoadProducerName names plugin" in str(info.value)
    assert reason in str(info.value)


@pytest.mark.parametrize("params, field", [
    ("{outputRatio: -0.5}", "outputRatio"),
    ("{maxEstimatedOutputTokens: -1}", "maxEstimatedOutputTokens"),
    ("{addEstimatedOutputTokens: 1}", "addEstimatedOutputTokens"),
    ("{tokensPerByte: 4}", "tokensPerByte"),
    ("{prefixMatchInfoProducerName: nope}", "prefixMatchInfoProducerName"),
], ids=["negative-ratio", "negative-cap", "not-a-bool", "unknown", "missing-prefix-producer"])
def test_bad_parameters_are_errors_naming_the_field(params: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        pipeline(f"plugins:\n- type: inflight-load-producer\n  parameters: {params}\n")
    assert info.value.plugin == "inflight-load-producer" and info.value.field == field


def test_only_one_producer_may_be_declared() -> None:
    with pytest.raises(ConfigError, match="only one inflight-load-producer") as info:
        pipeline("plugins:\n- type: inflight-load-producer\n- type: inflight-load-producer\n  name: second\n")
    assert info.value.plugin == "second"


def test_naming_the_default_prefix_producer_creates_it() -> None:
    p = pipeline("plugins:\n- type: inflight-load-producer\n"
                 "  parameters: {prefixMatchInfoProducerName: approx-prefix-cache-producer}\n")
    assert p.handle.first_of_type("approx-prefix-cache-producer") is not None


def test_check_config_accepts_an_llm_d_config_declaring_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(HEAD + "plugins:\n- type: approx-prefix-cache-producer\n- type: inflight-load-producer\n"
                    "- type: prefix-cache-affinity-filter\n  parameters: {inFlightLoadProducerName: "
                    "inflight-load-producer}\n- type: token-load-scorer\nschedulingProfiles:\n- name: default\n"
                    "  plugins:\n  - pluginRef: prefix-cache-affinity-filter\n  - pluginRef: token-load-scorer\n")
    assert check_config(argparse.Namespace(file=str(path))) == 0
    assert "inflight-load-producer {\"addEstimatedOutputTokens\":true" in capsys.readouterr().out


# -- what it books, through the Director --------------------------------------------------------------------------

SCORED = ("schedulingProfiles:\n- name: default\n  plugins: [{pluginRef: token-load-scorer}]\n")


async def test_default_estimate_is_bytes_over_four_plus_one_and_a_half_held_until_the_end() -> None:
    d = director("plugins:\n- type: token-load-scorer\n" + SCORED, None)
    prompt = "x" * 405
    n, out = estimate(prompt, max_tokens=1)
    ctx = await d.route(req(prompt, max_tokens=1))       # max_tokens does not cap the estimate
    assert load(d, "e0") == (1, n + out) and ctx.tokens == n + out
    d.response_started(ctx)
    assert load(d, "e0") == (1, n + out)
    d.response_complete(ctx, ResponseInfo())
    d.response_complete(ctx, ResponseInfo())              # idempotent
    assert load(d, "e0") == (0, 0)


@pytest.mark.parametrize("params, ratio, cap", [
    ("{outputRatio: 0.2}", 0.2, None),
    ("{outputRatio: 3, maxEstimatedOutputTokens: 50}", 3.0, 50),
    ("{addEstimatedOutputTokens: true, outputRatio: 0}", 0.0, None),
], ids=["ratio", "capped", "zero-ratio"])
async def test_output_ratio_and_cap(params: str, ratio: float, cap: int | None) -> None:
    d = director(f"plugins:\n- type: inflight-load-producer\n  parameters: {params}\n- type: token-load-scorer\n"
                 + SCORED, None)
    n, out = estimate("y" * 300, ratio)
    ctx = await d.route(req("y" * 300))
    assert load(d, "e0") == (1, n + (out if cap is None else min(out, cap)))
    d.response_complete(ctx, ResponseInfo())
    assert load(d, "e0") == (0, 0)


async def test_prompt_only_frees_its_tokens_at_the_first_byte_and_the_request_at_the_end() -> None:
    d = director("plugins:\n- type: inflight-load-producer\n  parameters: {addEstimatedOutputTokens: false}\n"
                 "- type: token-load-scorer\n" + SCORED, None)
    n, _ = estimate("z" * 200)
    ctx = await d.route(req("z" * 200))
    assert load(d, "e0") == (1, n)
    d.response_started(ctx)
    assert load(d, "e0") == (1, 0)
    d.response_complete(ctx, ResponseInfo())
    assert load(d, "e0") == (0, 0)


async def test_token_load_scorer_sees_the_booked_load() -> None:
    d = director("plugins:\n- type: token-load-scorer\n  parameters: {inFlightLoadProducerName: "
                 "inflight-load-producer}\n" + SCORED, None, None)
    first = await d.route(req("a" * 800))
    second = await d.route(req("b" * 100))
    assert {first.target.name, second.target.name} == {"e0", "e1"}   # the booked one scores lower
    for ctx in (first, second):
        d.response_complete(ctx, ResponseInfo())
    assert load(d, "e0") == load(d, "e1") == (0, 0)


async def test_token_concurrency_gate_reopens_when_prompt_only_tokens_are_freed() -> None:
    """concurrency-detector (tokens, as a filter) reads the producer's bookings: with addEstimatedOutputTokens
    off, the endpoint takes requests again from the first response byte of the one filling it."""
    d = director("plugins:\n- type: inflight-load-producer\n  name: load\n"
                 "  parameters: {addEstimatedOutputTokens: false}\n- type: concurrency-detector\n"
                 "  parameters: {concurrencyMode: tokens, maxTokenConcurrency: 50, inFlightLoadProducerName: load}\n"
                 "schedulingProfiles:\n- name: default\n  plugins: [{pluginRef: concurrency-detector}]\n", None)
    ctx = await d.route(req("q" * 400))                  # about 100 prompt tokens: over the limit of 50
    with pytest.raises(SchedulingFailed):
        await d.route(req("r"))
    d.response_started(ctx)
    later = await d.route(req("r"))
    assert later.target.name == "e0" and load(d, "e0")[0] == 2
    for c in (ctx, later):
        d.response_complete(c, ResponseInfo())
    assert load(d, "e0") == (0, 0)


PD = ("plugins:\n- type: prefill-filter\n- type: decode-filter\n- type: always-disagg-pd-decider\n"
      "- type: disagg-profile-handler\n  parameters: {deciders: {prefill: always-disagg-pd-decider}}\n"
      "schedulingProfiles:\n- name: prefill\n  plugins: [{pluginRef: prefill-filter}]\n"
      "- name: decode\n  plugins: [{pluginRef: decode-filter}]\n")


async def test_prefill_charge_is_released_at_the_first_byte_and_decode_at_the_end() -> None:
    d = director(PD, "prefill", "decode")
    n, out = estimate("p" * 500)
    ctx = await d.route(req("p" * 500))
    assert ctx.prefill is not None and ctx.prefill.name == "e0" and ctx.target.name == "e1"
    assert load(d, "e0") == load(d, "e1") == (1, n + out)    # both charged the full estimate, as the reference
    d.response_started(ctx)
    assert load(d, "e0") == (0, 0) and load(d, "e1") == (1, n + out)
    d.response_complete(ctx, ResponseInfo())
    assert load(d, "e1") == (0, 0)


async def test_a_request_ending_before_its_first_byte_releases_the_prefill_charge_too() -> None:
    d = director(PD, "prefill", "decode")
    ctx = await d.route(req("p" * 500))
    d.response_complete(ctx, ResponseInfo(status=502, error=True))
    assert load(d, "e0") == load(d, "e1") == (0, 0)


async def test_retarget_moves_the_charge_to_the_fallback() -> None:
    d = director("plugins:\n- type: token-load-scorer\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 2}\n"
                 "schedulingProfiles:\n- name: default\n  plugins: [{pluginRef: token-load-scorer}, "
                 "{pluginRef: max-score-picker}]\n", None, None)
    n, out = estimate("m" * 100)
    ctx = await d.route(req("m" * 100))
    first, fallback = ctx.target.name, ctx.fallbacks[0]
    d.retarget(ctx, fallback)
    assert load(d, first) == (0, 0) and load(d, fallback.name) == (1, n + out)
    d.response_complete(ctx, ResponseInfo())
    assert load(d, fallback.name) == (0, 0)


async def test_named_prefix_producer_discounts_the_cached_prefix() -> None:
    """The second identical prompt finds its 10 blocks of 16 tokens cached on the endpoint: 160 fewer tokens."""
    d = director("plugins:\n- type: approx-prefix-cache-producer\n"
                 "  parameters: {autoTune: false, blockSizeTokens: 16}\n"
                 "- type: inflight-load-producer\n"
                 "  parameters: {prefixMatchInfoProducerName: approx-prefix-cache-producer}\n"
                 "- type: token-load-scorer\n" + SCORED, None)
    prompt = "s" * 640                                    # 10 blocks of 64 characters
    n, out = estimate(prompt)
    cold = await d.route(req(prompt))
    assert load(d, "e0") == (1, n + out)
    warm = await d.route(req(prompt))
    assert load(d, "e0") == (2, (n + out) + (n - 160 + out))
    for ctx in (cold, warm):
        d.response_complete(ctx, ResponseInfo())
    assert load(d, "e0") == (0, 0)
