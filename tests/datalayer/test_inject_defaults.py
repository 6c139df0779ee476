"""``dataLayer.injectDefaults``: the reference's loader adds the default metrics source unless told not to, so a
config listing only a models source still scrapes metrics (here from a real simulator), and only
``injectDefaults: false`` turns collection off."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer import scrape_settings
from epp.errors import ConfigError
from epp.framework.endpoint import EndpointSpec
from epp.framework.registry import Registry
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.builtins import default_registry
from epp_sim import SimConfig, SimServer

from ..conftest import eventually

FIXTURE = Path(__file__).parents[1] / "fixtures/configs/llmd/router_loader-testdata_datalayer.yaml"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return default_registry(entry_points=False)


def build(text: str, registry: Registry):  # type: ignore[no-untyped-def]
    return build_pipeline(*load_raw(text, "t.yaml"), registry)


def sources(pipeline) -> list[tuple[str, str, list[str]]]:  # type: ignore[no-untyped-def]
    """Each ``dataLayer.sources`` entry after the build: (pluginRef, its plugin's type, extractor refs)."""
    return [(s.plugin_ref, pipeline.handle.plugin(s.plugin_ref).type_name, [e.plugin_ref for e in s.extractors])
            for s in pipeline.config.data_layer.sources]


METRICS = ("metrics-data-source", "metrics-data-source", ["core-metrics-extractor"])


def test_the_loader_testdata_configs(registry: Registry) -> None:
    auto, empty, opt_out = (build(text, registry) for text in FIXTURE.read_text().split("\n---\n"))
    assert sources(auto) == [METRICS]  # successDataLayerAutoDefaultText
    assert sources(empty) == [METRICS]  # successDataLayerNoSourcesText: dataLayer: {}
    assert sources(opt_out) == []  # successDataLayerOptOutText
    assert scrape_settings(opt_out.config, opt_out.handle, registry) is None


# With a metrics source declared, the injected entry is it (the first declared plugin of the type), with the
# first declared core-metrics-extractor.
INJECTED = ("mine", "metrics-data-source", ["ex"])


@pytest.mark.parametrize("data_layer,expected", [
    ("dataLayer: {sources: []}", [INJECTED]),
    ("dataLayer: {injectDefaults: true}", [INJECTED]),
    ("dataLayer: {sources: [{pluginRef: m, extractors: [{pluginRef: x}]}]}",
     [("m", "models-data-source", ["x"]), INJECTED]),
    ("dataLayer: {sources: [{pluginRef: kv, extractors: [{pluginRef: pp}]}]}",
     [("kv", "endpoint-notification-source", ["pp"]), INJECTED]),
    ("dataLayer: {sources: [{pluginRef: mine, extractors: []}]}",
     [("mine", "metrics-data-source", [])]),  # a listed metrics source, whatever its name, is not doubled
    ("dataLayer: {injectDefaults: false, sources: [{pluginRef: m, extractors: [{pluginRef: x}]}]}",
     [("m", "models-data-source", ["x"])]),
], ids=["empty-list", "explicit-true", "models-only", "kv-events-only", "listed-metrics-source", "opted-out"])
def test_the_metrics_source_is_added_unless_listed_or_opted_out(data_layer: str, expected: list,
                                                                 registry: Registry) -> None:
    pipeline = build(f"""
plugins:
- {{type: models-data-source, name: m}}
- {{type: models-data-extractor, name: x}}
- {{type: endpoint-notification-source, name: kv}}
- {{type: precise-prefix-cache-producer, name: pp}}
- {{type: token-producer, parameters: {{modelName: m, vllm: {{http: "http://127.0.0.1:1"}}}}}}
- {{type: metrics-data-source, name: mine, parameters: {{path: /stats}}}}
- {{type: core-metrics-extractor, name: ex}}
{data_layer}
""", registry)
    assert sources(pipeline) == expected


def test_a_declared_but_unlisted_metrics_source_is_the_one_injected(registry: Registry) -> None:
    pipeline = build("""
plugins:
- {type: metrics-data-source, name: scrape, parameters: {path: /stats}}
dataLayer: {sources: []}
""", registry)
    assert sources(pipeline) == [("scrape", "metrics-data-source", ["core-metrics-extractor"])]
    config, _ = scrape_settings(pipeline.config, pipeline.handle, registry)
    assert config.path == "/stats"


@pytest.mark.parametrize("text,field,line", [
    ("dataLayer:\n  injectDefaults: \"no\"\n", "dataLayer.injectDefaults", 2),
    ("dataLayer:\n  injectDefault: false\n", "dataLayer.injectDefault", 2),
], ids=["not-a-bool", "misspelt"])
def test_bad_inject_defaults_values_name_the_field(text: str, field: str, line: int, registry: Registry) -> None:
    with pytest.raises(ConfigError) as info:
        build(text, registry)
    assert info.value.field == field and info.value.line == line, str(info.value)


async def test_a_models_only_data_layer_still_scrapes_a_simulator() -> None:
    """The reference README's models-source config, served: the injected metrics source scrapes the simulator's
    queue (EPP used to turn scraping off when ``dataLayer.sources`` named no metrics source)."""
    sim = SimServer(SimConfig(model="m", time_scale=0.01, seed=1))
    await sim.start("127.0.0.1", 0)
    app = EppApp(ServeOptions(
        config_text="""
plugins:
- {type: models-data-source, name: models}
- {type: models-data-extractor, name: extractor}
dataLayer:
  sources: [{pluginRef: models, extractors: [{pluginRef: extractor}]}]
""", endpoints=[EndpointSpec(name="sim", address="127.0.0.1", port=sim.port)], host="127.0.0.1", grpc_port=None,
        health_port=None, metrics_port=None, refresh_interval=0.02))
    try:
        await app.start()
        (endpoint,) = app.datastore.endpoints()
        await eventually(lambda: endpoint.metrics.update_time > 0, timeout=10.0, what="a metrics scrape")
        assert endpoint.metrics.num_gpu_blocks == 2048  # the simulator's cache size, read off its metrics page
    finally:
        await app.stop()
        await sim.stop()
