"""``models-data-source`` and ``models-data-extractor`` as configured: the reference's config shapes load, parameters
are validated with errors naming the plugin and field, extractors are bound as the reference binds them, and
``/v1/models`` bodies are decoded as the reference's Go types decode them."""

from __future__ import annotations

import logging

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer import scrape_settings
from epp.datalayer.models import MODELS_ATTRIBUTE_KEY, ModelData, ModelsParseError, parse_models, stored_models
from epp.errors import ConfigError
from epp.extproc.tls import self_signed
from epp.framework.endpoint import Endpoint, EndpointSpec
from epp.runtime.builtins import default_registry

README_CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: models-data-source
  name: vllm-models-source
  parameters:
    scheme: "https"
    insecureSkipVerify: false
- type: models-data-extractor
  name: vllm-models-extractor
- type: queue-scorer
dataLayer:
  sources:
  - pluginRef: vllm-models-source
    extractors:
    - pluginRef: vllm-models-extractor
"""


@pytest.fixture(scope="module")
def registry():
    return default_registry(entry_points=False)


def load(registry, text: str):
    return build_pipeline(*load_raw(text, "t.yaml"), registry)


def source(params: str = "") -> str:
    text = "plugins:\n- type: models-data-source\n  name: m\n"
    return text + (f"  parameters: {params}\n" if params else "") + "- type: models-data-extractor\n"


# ------------------------------------------------------------------ the reference's configs


def test_reference_readme_config_loads(registry):
    """The README's complete example, under ``dataLayer:`` (the reference's field since v1alpha1 became llm-d's)."""
    pipeline = load(registry, README_CONFIG)
    src, ext = pipeline.handle.plugin("vllm-models-source"), pipeline.handle.plugin("vllm-models-extractor")
    assert (src.type_name, ext.type_name) == ("models-data-source", "models-data-extractor")
    assert (src.params.scheme, src.params.path, src.params.insecure_skip_verify) == ("https", "/v1/models", False)
    assert src.extractors == (ext,)
    # only the models source is listed: the reference's default metrics source is injected beside it
    assert [s.plugin_ref for s in pipeline.config.data_layer.sources] == ["vllm-models-source", "metrics-data-source"]
    assert scrape_settings(pipeline.config, pipeline.handle, registry) is not None


def test_readme_data_section_is_the_old_field_name(registry):
    """The README still writes ``data:``, the Inference Extension's old name; the reference's strict decoding
    rejects it today, and so does EPP, naming the field."""
    with pytest.raises(ConfigError, match="'data' is not a known field|data.*not a known field"):
        load(registry, README_CONFIG.replace("dataLayer:", "data:"))


def test_defaults(registry):
    pipeline = load(registry, source())
    src = pipeline.handle.plugin("m")
    p = src.params
    assert (p.scheme, p.path, p.insecure_skip_verify, p.interval) == ("http", "/v1/models", True, None)
    assert (p.ca_cert_path, p.client_cert_path, p.client_key_path) == ("", "", "")
    assert src.interval == 0.05 and src.extractors == (pipeline.handle.plugin("models-data-extractor"),)


@pytest.mark.parametrize("interval, tick, expected", [
    (None, 0.05, 0.05), ('""', 0.05, 0.05), ("120ms", 0.05, 0.1), ("10ms", 0.05, 0.05), ("5s", 0.05, 5.0),
    ("30ms", 0.02, 0.04), ("1m", 0.02, 60.0), ("74ms", 0.05, 0.05), ("75ms", 0.05, 0.1),
], ids=["unset", "empty", "rounds-down", "at-least-one-tick", "exact", "half-rounds-up", "minutes", "below-half",
        "half"])
def test_interval_rounds_to_the_refresh_tick(registry, interval, tick, expected):
    src = load(registry, source("" if interval is None else f"{{interval: {interval}}}")).handle.plugin("m")
    src.use_base_tick(tick)
    assert src.interval == pytest.approx(expected)


def test_path_without_a_leading_slash_is_host_relative(registry):
    assert load(registry, source("{path: v1/models}")).handle.plugin("m").params.path == "/v1/models"


def test_http_scheme_does_not_read_the_tls_files(registry):
    """As the reference: TLS options configure the https transport only."""
    src = load(registry, source("{caCertPath: /nonexistent/ca.pem, clientCertPath: /nonexistent/c.pem}"))
    assert src.handle.plugin("m").params.ca_cert_path == "/nonexistent/ca.pem"


@pytest.mark.parametrize("params, field", [
    ("{scheme: ftp}", "scheme"),
    ("{interval: soon}", "interval"),
    ("{interval: 0s}", "interval"),
    ("{insecureSkipVerify: 'no'}", "insecureSkipVerify"),
    ("{refreshInterval: 1s}", "refreshInterval"),
    ("{scheme: https, insecureSkipVerify: false, caCertPath: /nonexistent/ca.pem}", "caCertPath"),
    ("{scheme: https, clientCertPath: /nonexistent/c.pem}", "clientKeyPath"),
    ("{scheme: https, clientKeyPath: /nonexistent/k.pem}", "clientCertPath"),
    ("{scheme: https, clientCertPath: /nonexistent/c.pem, clientKeyPath: /nonexistent/k.pem}", "clientCertPath"),
], ids=["scheme", "interval-text", "interval-zero", "bool-type", "unknown-key", "ca-missing", "key-missing",
        "cert-missing", "pair-unreadable"])
def test_parameter_errors_name_the_plugin_and_field(registry, params, field):
    with pytest.raises(ConfigError) as info:
        load(registry, source(params))
    assert info.value.plugin == "m" and info.value.field == field
    assert "'m'" in str(info.value) and field in str(info.value)


def test_a_ca_file_without_certificates_is_refused(registry, tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="caCertPath"):
        load(registry, source(f"{{scheme: https, insecureSkipVerify: false, caCertPath: '{bad}'}}"))


def test_skip_verify_does_not_read_the_ca(registry, tmp_path):
    pair = self_signed()
    (tmp_path / "c.pem").write_bytes(pair.cert_pem)
    (tmp_path / "k.pem").write_bytes(pair.key_pem)
    load(registry, source(f"{{scheme: https, caCertPath: /nonexistent, clientCertPath: '{tmp_path / 'c.pem'}', "
                          f"clientKeyPath: '{tmp_path / 'k.pem'}'}}"))


# ------------------------------------------------------------------ binding extractors to sources


def test_a_source_listing_another_extractor_is_refused(registry):
    text = source() + """\
- type: core-metrics-extractor
dataLayer:
  sources:
  - pluginRef: m
    extractors: [{pluginRef: models-data-extractor}, {pluginRef: core-metrics-extractor}]
"""
    with pytest.raises(ConfigError, match="source 'm' .* cannot use extractor 'core-metrics-extractor'") as info:
        load(registry, text)
    assert info.value.field == "dataLayer.sources.0.extractors.1.pluginRef" and info.value.line == 9


def test_the_metrics_source_refuses_the_models_extractor(registry):
    text = source() + """\
- type: metrics-data-source
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{pluginRef: models-data-extractor}]
"""
    with pytest.raises(ConfigError, match="cannot use extractor 'models-data-extractor'"):
        scrape_settings((p := load(registry, text)).config, p.handle, registry)


def test_the_models_extractor_is_not_a_data_source(registry):
    text = source() + "dataLayer:\n  sources:\n  - pluginRef: models-data-extractor\n"
    with pytest.raises(ConfigError, match="not a data source"):
        load(registry, text)


def test_an_unlisted_extractor_binds_to_the_only_models_source(registry):
    pipeline = load(registry, source() + "- type: metrics-data-source\ndataLayer:\n  sources:\n"
                                         "  - pluginRef: metrics-data-source\n")
    assert pipeline.handle.plugin("m").extractors == (pipeline.handle.plugin("models-data-extractor"),)
    assert scrape_settings(pipeline.config, pipeline.handle, registry) is not None


@pytest.mark.parametrize("extra, why", [
    ("", "none is declared"),
    ("- type: models-data-source\n  name: m1\n- type: models-data-source\n  name: m2\n", "2 are declared"),
], ids=["no-source", "two-sources"])
def test_an_unresolved_extractor_stays_unbound_with_a_warning(registry, caplog, extra, why):
    with caplog.at_level(logging.WARNING, logger="epp.datalayer.wiring"):
        pipeline = load(registry, "plugins:\n- type: models-data-extractor\n" + extra)
    assert "datalayer: skipping unresolved dependency" in caplog.text and why in caplog.text
    assert all(not p.extractors for p in pipeline.handle.plugins() if p.type_name == "models-data-source")


def test_two_sources_each_with_its_listed_extractor(registry):
    pipeline = load(registry, """\
plugins:
- {type: models-data-source, name: a}
- {type: models-data-source, name: b, parameters: {path: /other}}
- {type: models-data-extractor, name: ea}
- {type: models-data-extractor, name: eb}
dataLayer:
  sources:
  - {pluginRef: a, extractors: [{pluginRef: ea}]}
  - {pluginRef: b, extractors: [{pluginRef: eb}]}
""")
    h = pipeline.handle
    assert h.plugin("a").extractors == (h.plugin("ea"),) and h.plugin("b").extractors == (h.plugin("eb"),)


async def test_a_source_without_extractors_does_not_poll(registry, datastore):
    src = load(registry, "plugins:\n- type: models-data-source\n").handle.plugin("models-data-source")
    await src.start(datastore)
    assert src.poller is None
    await src.stop()


# ------------------------------------------------------------------ the extractor and the response body

VLLM_BODY = b"""{"object": "list", "data": [
 {"id": "meta-llama/Llama-3.1-8B", "object": "model", "created": 1750000000, "owned_by": "vllm",
  "root": "/models/llama", "parent": null, "max_model_len": 8192, "permission": [{"id": "modelperm-1"}]},
 {"id": "sql-lora", "object": "model", "created": 1750000001, "owned_by": "vllm", "root": "/adapters/sql",
  "parent": "meta-llama/Llama-3.1-8B", "permission": []}]}"""


def test_extract_stores_the_list_under_the_reference_key(registry):
    ext = load(registry, source()).handle.plugin("models-data-extractor")
    ep = Endpoint(EndpointSpec("a", "127.0.0.1", 8000))
    assert stored_models(ep) is None
    ext.extract(ep, parse_models(VLLM_BODY))
    assert ep.attributes[MODELS_ATTRIBUTE_KEY] == stored_models(ep) == (
        ModelData("meta-llama/Llama-3.1-8B", "model", 1750000000, "vllm", max_model_len=8192),
        ModelData("sql-lora", "model", 1750000001, "vllm", "meta-llama/Llama-3.1-8B"))
    with pytest.raises(TypeError, match="unexpected input"):
        ext.extract(ep, {"data": []})


def test_extract_captures_max_model_len(registry):
    """The newest reference's ModelData carries vLLM's ``max_model_len`` (its TestExtractorCapturesMaxModelLen);
    an entry without it stores 0."""
    ext = load(registry, source()).handle.plugin("models-data-extractor")
    ep = Endpoint(EndpointSpec("a", "127.0.0.1", 8000))
    ext.extract(ep, parse_models(b'{"data": [{"id": "m", "max_model_len": 131072}, {"id": "n"}]}'))
    assert [(m.id, m.max_model_len) for m in stored_models(ep)] == [("m", 131072), ("n", 0)]


def test_extract_keeps_shutdown_date_and_the_card_lists_it_when_set(registry):
    """The newest reference's ModelData carries ``shutdown_date``, and its models-responder lists it (omitempty)."""
    ext = load(registry, source()).handle.plugin("models-data-extractor")
    ep = Endpoint(EndpointSpec("a", "127.0.0.1", 8000))
    ext.extract(ep, parse_models(b'{"data": [{"id": "old", "shutdown_date": "2026-12-31"}, {"id": "new"}]}'))
    old, new = stored_models(ep)
    assert (old.shutdown_date, new.shutdown_date) == ("2026-12-31", "")
    assert old.card()["shutdown_date"] == "2026-12-31" and "shutdown_date" not in new.card()


@pytest.mark.parametrize("body, ids", [
    (b'{"object": "list", "data": []}', ()),
    (b'{"object": "list"}', ()),
    (b'{"data": null}', ()),
    (b"null", ()),
    (b'{"data": [{"id": "x", "unknown": {"deep": [1]}}]}', ("x",)),
    (b'{"data": [{"object": "model"}]}', ("",)),
], ids=["empty", "no-data", "null-data", "null-body", "extra-fields", "no-id"])
def test_bodies_the_reference_accepts(body, ids):
    assert tuple(m.id for m in parse_models(body).data) == ids


@pytest.mark.parametrize("body", [
    b"<html>", b"", b"[]", b'"list"', b'{"data": {}}', b'{"data": ["x"]}', b'{"data": [{"id": 7}]}',
    b'{"data": [{"id": "x", "created": 1.5}]}', b'{"data": [{"id": "x", "created": "now"}]}',
    b'{"data": [{"id": "x", "parent": 3}]}', b'{"object": 1, "data": []}',
    b'{"data": [{"id": "x", "max_model_len": "8192"}]}', b'{"data": [{"id": "x", "max_model_len": 8192.5}]}',
    b'{"data": [{"id": "x", "shutdown_date": 20261231}]}',
], ids=["html", "empty", "array", "string", "data-object", "entry-string", "id-number", "created-float",
        "created-string", "parent-number", "object-number", "max-model-len-string", "max-model-len-float",
        "shutdown-date-number"])
def test_bodies_the_reference_rejects(body):
    with pytest.raises(ModelsParseError):
        parse_models(body)
