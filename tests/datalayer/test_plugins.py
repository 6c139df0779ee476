"""Config-visible data-layer plugins: ``dataLayer`` sections load and turn into the right scraper settings."""

from __future__ import annotations

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer import build_scraper, scrape_settings
from epp.datalayer.scraper import Scraper
from epp.errors import ConfigError
from epp.framework.endpoint import ENGINE_LABEL, LEGACY_ENGINE_LABEL, EndpointSpec, LoraLoadState
from epp.runtime.builtins import default_registry

HEAD = """\
plugins:
- type: queue-scorer
"""


@pytest.fixture(scope="module")
def registry():
    return default_registry(entry_points=False)


def settings(registry, text: str):
    pipeline = build_pipeline(*load_raw(text), registry)
    return scrape_settings(pipeline.config, pipeline.handle, registry)


def test_reference_shape_with_parameters(registry):
    cfg, ex = settings(registry, HEAD + """\
- type: metrics-data-source
  parameters: {scheme: https, path: /stats, insecureSkipVerify: false, refreshInterval: 100ms, timeout: 2s,
               jitter: 0.2, maxBackoff: 1m, failureThreshold: 5, stalenessThreshold: 500ms,
               compression: true, transport: aiohttp}
- type: core-metrics-extractor
  parameters: {defaultEngine: trtllm-serve}
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
""")
    assert (cfg.scheme, cfg.path, cfg.insecure_skip_verify) == ("https", "/stats", False)
    assert (cfg.interval, cfg.timeout, cfg.jitter, cfg.max_backoff) == (0.1, 2.0, 0.2, 60.0)
    assert (cfg.failure_threshold, cfg.staleness, cfg.compression, cfg.transport) == (5, 0.5, True, "aiohttp")
    assert ex.default_engine == "trtllm-serve"


def test_omitted_data_layer_uses_defaults(registry):
    cfg, ex = settings(registry, HEAD)
    assert (cfg.interval, cfg.timeout, cfg.scheme, cfg.path, cfg.insecure_skip_verify, cfg.transport) == (
        0.05, 1.0, "http", "/metrics", True, "lean")
    assert ex.default_engine == "vllm" and set(ex.engines) >= {"vllm", "sglang", "trtllm-serve"}


def test_omitted_data_layer_uses_declared_plugins(registry):
    cfg, ex = settings(registry, HEAD + """\
- type: metrics-data-source
  parameters: {refreshInterval: 20ms}
- type: core-metrics-extractor
  parameters: {defaultEngine: sglang}
""")
    assert cfg.interval == 0.02 and ex.default_engine == "sglang"


def test_empty_sources_still_scrape_unless_injection_is_off(registry, datastore):
    """The reference injects the default metrics source into an empty list; ``injectDefaults: false`` turns
    metrics collection off."""
    assert settings(registry, HEAD + "dataLayer: {sources: []}\n") is not None
    text = HEAD + "dataLayer: {sources: [], injectDefaults: false}\n"
    assert settings(registry, text) is None
    pipeline = build_pipeline(*load_raw(text), registry)
    assert build_scraper(pipeline.config, pipeline.handle, registry, datastore) is None


def test_build_scraper(registry, datastore):
    pipeline = build_pipeline(*load_raw(HEAD), registry)
    scraper = build_scraper(pipeline.config, pipeline.handle, registry, datastore)
    assert isinstance(scraper, Scraper) and scraper.datastore is datastore and not scraper.running


def test_engine_configs_fully_replace_a_builtin(registry):
    _, ex = settings(registry, HEAD + """\
- type: core-metrics-extractor
  parameters:
    engineLabelKey: example.com/engine
    engineConfigs:
    - name: vllm
      queuedRequestsSpec: vllm:num_requests_waiting
      runningRequestsSpec: vllm:num_requests_running
      kvUsageSpec: vllm:kv_cache_usage_perc
    - name: custom
      queuedRequestsSpec: q
      runningRequestsSpec: r
      kvUsageSpec: [kv_new, 'kv_old{unit="ratio"}']
      blockSizeSpec: bs
""")
    vllm = ex.engines["vllm"]
    assert [s.name for s in vllm.kv_usage] == ["vllm:kv_cache_usage_perc"]  # no V0 fallback any more
    assert vllm.lora == () and vllm.cache_info == ()
    custom = ex.engine_for(EndpointSpec("a", "h", 1, labels={"example.com/engine": "custom"}))
    m = ex.extract(b'q 1\nr 2\nkv_old{unit="ratio"} 0.5\nbs 64\n', EndpointSpec("a", "h", 1, engine="custom"))
    assert custom.name == "custom" and (m.waiting, m.running, m.kv_usage, m.block_size) == (1, 2, 0.5, 64)
    assert ex.engine_for(EndpointSpec("a", "h", 1, labels={ENGINE_LABEL: "custom"})).name == "vllm"
    # the legacy key is ignored, as in the newest reference ("legacy GAIE label key is ignored")
    assert ex.engine_for(EndpointSpec("a", "h", 1, labels={LEGACY_ENGINE_LABEL: "custom"})).name == "vllm"


def test_reference_engine_config_names(registry):
    """llm-d-router's engineConfigs fields: cacheBlockSizeSpec/cacheNumBlocksSpec (gauges) and
    cacheBlockSizeLabelName/cacheNumBlocksLabelName (labels of cacheInfoSpec, instead of block_size/num_gpu_blocks)."""
    _, ex = settings(registry, HEAD + """\
- type: core-metrics-extractor
  parameters:
    engineConfigs:
    - name: my-trt
      queuedRequestsSpec: q
      runningRequestsSpec: r
      kvUsageSpec: kv
      cacheBlockSizeSpec: 'cache{kind=tokens_per}'
      cacheNumBlocksSpec: 'cache{kind=max}'
    - name: my-engine
      queuedRequestsSpec: q
      runningRequestsSpec: r
      kvUsageSpec: kv
      cacheInfoSpec: my_cache_info
      cacheBlockSizeLabelName: page
      cacheNumBlocksLabelName: pages
""")
    page = (b'q 1\nr 2\nkv 0.5\ncache{kind="tokens_per"} 64\ncache{kind="max"} 900\n'
            b'my_cache_info{block_size="32",num_gpu_blocks="7",page="16",pages="100"} 1\n')
    trt = ex.extract(page, EndpointSpec("a", "h", 1, engine="my-trt"))
    assert (trt.block_size, trt.num_gpu_blocks) == (64, 900)
    labelled = ex.extract(page, EndpointSpec("a", "h", 1, engine="my-engine"))
    assert (labelled.block_size, labelled.num_gpu_blocks) == (16, 100)


def test_reference_lora_residency_and_custom_metric_fields(registry):
    """llm-d-router's loraLoadedSpec, loraGPULoadedSpec, loraGPUSlotsSpec and customMetrics (attributeKey,
    metricSpec, optional) are accepted and read; the built-in vllm reads vLLM's residency gauges by default."""
    _, ex = settings(registry, HEAD + """\
- type: core-metrics-extractor
  parameters:
    engineConfigs:
    - name: my-engine
      queuedRequestsSpec: q
      runningRequestsSpec: r
      kvUsageSpec: kv
      loraSpec: lora_info
      loraLoadedSpec: 'lora_loaded{engine=0}'
      loraGPULoadedSpec: lora_gpu_count
      loraGPUSlotsSpec: lora_slots
      customMetrics:
      - attributeKey: custom.queue_depth
        metricSpec: 'depth{tier=gold}'
      - {attributeKey: transfers.failed, metricSpec: failed_total, optional: true}
""")
    page = (b'q 1\nr 2\nkv 0.5\nlora_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 9\n'
            b'lora_loaded{engine="0",adapter_name="a",level="gpu",pinned="true"} 1\n'
            b'lora_loaded{engine="1",adapter_name="b",level="gpu",pinned="false"} 1\n'
            b'lora_gpu_count{model_name="llama"} 1\nlora_slots 8\ndepth{tier="gold"} 5\n')
    m = ex.extract(page, EndpointSpec("a", "h", 1, engine="my-engine"))
    assert m.loaded_loras == {"a": LoraLoadState("gpu", pinned=True)}
    assert (m.gpu_loaded_loras, m.base_model, m.max_lora, m.running_loras) == (1, "llama", 8, frozenset({"a"}))
    assert m.custom == {"custom.queue_depth": 5.0}
    vllm = ex.engines["vllm"]
    assert [s.name for s in vllm.lora_loaded + vllm.lora_gpu_loaded + vllm.lora_gpu_slots] == [
        "vllm:max_gpu_lora_adapters"]  # the residency gauges only when configured: nothing in EPP reads them
    assert all(not (e.lora_loaded or e.lora_gpu_loaded or e.lora_gpu_slots)
               for name, e in ex.engines.items() if name not in ("vllm", "my-engine"))


@pytest.mark.parametrize("engine,page,want", [
    ("triton", b'nv_inference_pending_request_count{model="m",version="1"} 3\n'
               b'nv_inference_exec_count{model="m",version="1"} 5\n', (3, 5, 0.0)),
    ("atom", b'atom:requests_waiting 4\natom:requests_running 6\natom:kv_cache_usage_ratio 0.25\n'
             b'atom:cache_config_info{block_size="16",num_gpu_blocks="512"} 1\n', (4, 6, 0.25)),
], ids=["triton", "atom"])
def test_builtin_engines_of_the_reference(registry, engine, page, want):
    _, ex = settings(registry, HEAD + f"- type: core-metrics-extractor\n  parameters: {{defaultEngine: {engine}}}\n")
    m = ex.extract(page, EndpointSpec("a", "h", 1))
    assert (m.waiting, m.running, m.kv_usage) == want


def test_reference_custom_string_label_and_scalar_from_config(registry):
    """The reference's TestMetricsExtractionCustomStringLabelFromConfig and ...CustomScalarFromConfig configs: a
    ``labelName`` entry stores that label's value (a string) in ``Metrics.custom_labels``; before, EPP refused the
    key. A series without the label fails the scrape unless the entry is optional."""
    _, ex = settings(registry, HEAD + """\
- type: core-metrics-extractor
  parameters:
    engineConfigs:
    - name: vllm
      customMetrics:
      - attributeKey: vllm.io/nixl-compat-hash
        metricSpec: vllm:nixl_config_info
        labelName: compatibility_hash
      - attributeKey: custom.queue_depth
        metricSpec: custom_queue_depth{tier=gold}
""")
    vllm = EndpointSpec("a", "h", 1, labels={ENGINE_LABEL: "vllm"})
    m = ex.extract(b'vllm:nixl_config_info{compatibility_hash="sha256:abc123"} 1\n'
                   b'custom_queue_depth{tier="gold"} 42.5\n', vllm)
    assert (m.custom_labels, m.custom) == ({"vllm.io/nixl-compat-hash": "sha256:abc123"},
                                           {"custom.queue_depth": 42.5})
    assert (m.waiting, m.running, m.kv_usage) == (0, 0, 0.0)
    with pytest.raises(ValueError, match="label compatibility_hash of vllm:nixl_config_info"):
        ex.extract(b'vllm:nixl_config_info{other="x"} 1\ncustom_queue_depth{tier="gold"} 1\n', vllm)


def test_empty_or_null_parameters_mean_the_defaults(registry):
    """The reference's factory fills an empty ``engineLabelKey``/``defaultEngine`` with its defaults and decodes a
    null ``engineConfigs`` as none, so these load and behave as the built-in vllm with the default label key."""
    _, ex = settings(registry, HEAD + """\
- type: core-metrics-extractor
  parameters:
    engineLabelKey: ""
    defaultEngine: ""
    engineConfigs: null
""")
    assert (ex.engine_label_key, ex.default_engine) == (ENGINE_LABEL, "vllm")
    page = b'vllm:num_requests_waiting 3\nvllm:num_requests_running 4\nvllm:kv_cache_usage_perc 0.5\n'
    m = ex.extract(page, EndpointSpec("a", "h", 1, labels={ENGINE_LABEL: ""}))
    assert (m.waiting, m.running, m.kv_usage) == (3, 4, 0.5)


@pytest.mark.parametrize("params,needle", [
    ("{defaultEngine: nope}", "defaultEngine"),
    ("{engineConfigs: [{name: default}]}", "reserved"),
    ("{engineConfigs: [{name: x, kvUsageSpec: '9bad'}]}", "kvUsageSpec"),
    ("{engineConfigs: [{name: x}, {name: x}]}", "twice"),
    ("{engineConfigs: [{name: x, kvSpec: a}]}", "kvSpec"),
    ("{engineConfigs: [{name: x, cacheBlockSizeLabelName: 'block size'}]}", "cacheBlockSizeLabelName"),
    ("{engineConfigs: [{name: x, cacheNumBlocksSpec: '9bad'}]}", "cacheNumBlocksSpec"),
    ("{engineConfigs: [{name: x, cacheBlockSizeSpec: a, blockSizeSpec: b}]}", "blockSizeSpec"),
    ("{defaultEngine: vllm, extra: 1}", "extra"),
    ("{engineConfigs: [{name: x, loraLoadedSpec: '9bad'}]}", "loraLoadedSpec"),
    ("{engineConfigs: [{name: x, loraGPUSlotsSpec: 'a{'}]}", "loraGPUSlotsSpec"),
    ("{engineConfigs: [{name: x, customMetrics: [{attributeKey: '', metricSpec: a}]}]}", "attributeKey"),
    ("{engineConfigs: [{name: x, customMetrics: [{attributeKey: k, metricSpec: ''}]}]}", "metricSpec"),
    ("{engineConfigs: [{name: x, customMetrics: [{attributeKey: k}]}]}", "metricSpec"),
    ("{engineConfigs: [{name: x, customMetrics: [{attributeKey: k, metricSpec: a},"
     " {attributeKey: k, metricSpec: b}]}]}", "repeated"),
    ("{engineConfigs: [{name: x, customMetrics: [{attributeKey: k, metricSpec: a, required: true}]}]}", "required"),
    ("{engineConfigs: [{name: x, customMetrics: [{attributeKey: k, metricSpec: a, labelName: 'a b'}]}]}",
     "labelName"),
])
def test_extractor_parameter_errors(registry, params, needle):
    with pytest.raises(ConfigError, match=needle):
        settings(registry, HEAD + f"- type: core-metrics-extractor\n  parameters: {params}\n")


@pytest.mark.parametrize("params,needle", [
    ("{scheme: ftp}", "scheme"),
    ("{path: metrics}", "path"),
    ("{refreshInterval: soon}", "refreshInterval"),
    ("{failureThreshold: 0}", "failureThreshold"),
    ("{transport: curl}", "transport"),
])
def test_source_parameter_errors(registry, params, needle):
    with pytest.raises(ConfigError, match=needle):
        settings(registry, HEAD + f"- type: metrics-data-source\n  parameters: {params}\n")


@pytest.mark.parametrize("data_layer,needle", [
    ("{sources: [{pluginRef: missing}]}", "unknown plugin 'missing'"),
    ("{sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: queue-scorer}]}]}", "cannot use"),
    ("{sources: [{pluginRef: metrics-data-source}, {pluginRef: second}]}", "only one"),
])
def test_data_layer_reference_errors(registry, data_layer, needle):
    text = HEAD + "- type: metrics-data-source\n- type: metrics-data-source\n  name: second\n"
    with pytest.raises(ConfigError, match=needle):
        settings(registry, text + f"dataLayer: {data_layer}\n")


def test_source_without_extractor_gets_the_default_one(registry):
    cfg, ex = settings(registry, HEAD + "- type: metrics-data-source\ndataLayer: {sources: "
                                        "[{pluginRef: metrics-data-source}]}\n")
    assert ex.default_engine == "vllm"


@pytest.mark.parametrize("rel", ["conformance-configs/hermetic-datalayer.yaml",
                                 "configs/gie/integration_default-config.yaml",
                                 "configs/llmd/HEAD_epp-config.yaml"])
def test_shipped_reference_configs_load(registry, rel):
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fixtures" / rel
    cfg, ex = settings(registry, path.read_text())
    assert cfg.interval == 0.05 and ex.default_engine == "vllm"
