"""Metric pages -> Metrics: the real V0 capture, a V1 data-parallel page, other engines, and garbage."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.datalayer.engines import CustomMetric
from epp.datalayer.parsing import (
    BUILTIN_ENGINES,
    EngineConfig,
    MetricsExtractError,
    MetricsParseError,
    MetricSpec,
    parse_targeted,
    parse_with_prometheus_client,
)
from epp.framework.endpoint import LoraLoadState

VLLM = BUILTIN_ENGINES["vllm"]
PARSERS = [pytest.param(parse_targeted, id="targeted"), pytest.param(parse_with_prometheus_client, id="prom")]


@pytest.mark.parametrize("parse", PARSERS)
def test_real_v0_capture(parse, v0_page):
    m = parse(v0_page.decode(), VLLM, 12.5)
    assert (m.waiting, m.running, m.kv_usage) == (0, 0, 0.0)
    assert (m.block_size, m.num_gpu_blocks) == (16, 81767)
    assert (m.running_loras, m.waiting_loras, m.max_lora) == (frozenset(), frozenset(), 0)
    assert m.update_time == 12.5


@pytest.mark.parametrize("parse", PARSERS)
def test_v1_data_parallel_page_sums_queues_and_takes_the_largest_kv(parse, v1_page):
    # engine 0: waiting 3, running 7, kv 0.25; engine 1: waiting 1, running 5, kv 0.75 (81767 blocks each)
    m = parse(v1_page.decode(), VLLM, 1.0)
    assert (m.waiting, m.running) == (4, 12)
    assert m.kv_usage == 0.75  # the reference's aggregateMax
    assert (m.block_size, m.num_gpu_blocks) == (16, 2 * 81767)


def test_targeted_parser_accepts_bytes_and_str_alike(v1_page):
    assert parse_targeted(v1_page, VLLM, 1.0) == parse_targeted(v1_page.decode(), VLLM, 1.0)


V1_AND_LEGACY = b"""\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3
"""


@pytest.mark.parametrize("parse", PARSERS)
def test_v1_name_wins_over_deprecated_mirror(parse):
    assert parse(V1_AND_LEGACY.decode(), VLLM, 1.0).kv_usage == pytest.approx(0.3)


LORA = b"""\
vllm:num_requests_running 1
vllm:num_requests_waiting 0
vllm:kv_cache_usage_perc 0.1
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 1.7382173e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora, fr-lora",waiting_lora_adapters="chat"} 1.7382174e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="older",waiting_lora_adapters="x"} 1.7382170e+09
"""


@pytest.mark.parametrize("parse", PARSERS)
def test_lora_newest_series_wins(parse):
    m = parse(LORA.decode(), VLLM, 1.0)
    assert m.running_loras == frozenset({"sql-lora", "fr-lora"})
    assert m.waiting_loras == frozenset({"chat"})
    assert m.max_lora == 4
    assert (m.block_size, m.num_gpu_blocks) == (None, None)


CORE = b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n"
GPU, CPU = LoraLoadState("gpu"), LoraLoadState("cpu")


def loaded(engine: str, adapter: str, level: str, pinned: str = "false", value: int = 1, rank: str = "") -> str:
    extra = f',rank="{rank}"' if rank else ""
    return (f'vllm:lora_adapter_loaded{{adapter_name="{adapter}",engine="{engine}",level="{level}",'
            f'pinned="{pinned}"{extra}}} {value}\n')


def gpu_count(engine: str, value: int) -> str:
    return f'vllm:num_gpu_loaded_lora_adapters{{engine="{engine}",model_name="base"}} {value}\n'


# The vllm engine with the residency gauges the reference reads by default (EPP's built-in one reads only the slots).
VLLM_RESIDENCY = dataclasses.replace(VLLM, lora_loaded=(MetricSpec.parse("vllm:lora_adapter_loaded"),),
                                     lora_gpu_loaded=(MetricSpec.parse("vllm:num_gpu_loaded_lora_adapters"),))


# The reference's residency cases (lora_load_state_test.go), on text pages through the reference's vllm specs.
@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize("page,want_loaded,want_gpu,want_base", [
    (loaded("0", "alice", "gpu") + loaded("0", "bob", "cpu", "true") + loaded("0", "dave", "gpu", value=0)
     + loaded("1", "alice", "cpu") + loaded("1", "carol", "gpu") + gpu_count("0", 1) + gpu_count("1", 2),
     {"alice": GPU, "bob": LoraLoadState("cpu", pinned=True), "carol": GPU}, 2, "base"),
    (gpu_count("0", 0), {}, 0, "base"),
    ("", None, 0, ""),
    (loaded("0", "alice", "gpu") + loaded("0", "bob", "cpu") + loaded("0", "carol", "gpu"),
     {"alice": GPU, "bob": CPU, "carol": GPU}, 2, ""),
    (loaded("0", "alice", "gpu", rank="64") + loaded("1", "alice", "cpu", rank="64")
     + loaded("0", "bob", "gpu", rank="not-a-number") + gpu_count("0", 2),
     {"alice": LoraLoadState("gpu", rank=64), "bob": GPU}, 2, "base"),
    ("vllm:lora_adapter_loaded 1\n" + gpu_count("0", 1), {}, 1, "base"),
], ids=["two-engines-union", "count-at-zero", "not-reported", "count-from-resident-set", "rank", "no-adapter-name"])
def test_lora_residency(parse, page, want_loaded, want_gpu, want_base):
    m = parse(CORE.decode() + page, VLLM_RESIDENCY, 1.0)
    assert (m.loaded_loras, m.gpu_loaded_loras, m.base_model) == (want_loaded, want_gpu, want_base)


@pytest.mark.parametrize("parse", PARSERS)
def test_builtin_vllm_reads_gpu_slots_but_not_the_unconsumed_residency_gauges(parse):
    page = CORE.decode() + loaded("0", "alice", "gpu") + gpu_count("0", 1) + "vllm:max_gpu_lora_adapters 6\n"
    m = parse(page, VLLM, 1.0)
    assert (m.loaded_loras, m.gpu_loaded_loras, m.base_model, m.max_lora) == (None, 0, "", 6)


@pytest.mark.parametrize("parse", PARSERS)
def test_lora_residency_spec_label_matchers_select_one_engine(parse):
    engine = EngineConfig("e", lora_loaded=(MetricSpec.parse("vllm:lora_adapter_loaded{engine=1}"),),
                          lora_gpu_loaded=(MetricSpec.parse("vllm:num_gpu_loaded_lora_adapters{engine=1}"),))
    page = loaded("0", "alice", "gpu") + loaded("1", "carol", "gpu") + gpu_count("0", 5) + gpu_count("1", 1)
    m = parse(page, engine, 1.0)
    assert (m.loaded_loras, m.gpu_loaded_loras, m.base_model) == ({"carol": GPU}, 1, "base")


LORA_INFO_2 = 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 9\n'


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize("page,want", [
    (LORA_INFO_2, 2),
    (LORA_INFO_2 + 'vllm:max_gpu_lora_adapters{engine="0"} 4\nvllm:max_gpu_lora_adapters{engine="1"} 3\n', 4),
    ('vllm:max_gpu_lora_adapters{engine="0"} 4\n', 4),
], ids=["info-label", "slots-gauge-wins", "slots-gauge-alone"])
def test_lora_gpu_slots_gauge_overrides_the_info_label(parse, page, want):
    assert parse(CORE.decode() + page, VLLM, 1.0).max_lora == want


CUSTOM = EngineConfig(
    "custom", queued=(MetricSpec.parse("q"),), running=(MetricSpec.parse("r"),), kv_usage=(MetricSpec.parse("kv"),),
    custom_metrics=(CustomMetric("queue.depth", (MetricSpec.parse("depth{tier=gold}"),)),
                    CustomMetric("nixl.failed", (MetricSpec.parse("nixl_failed_total"),), optional=True)))


@pytest.mark.parametrize("parse", PARSERS)
def test_custom_metrics(parse):
    page = ('q 1\nr 2\nkv 0.5\ndepth{tier="silver"} 9\ndepth{tier="gold"} 3 1000\ndepth{tier="gold"} 4 2000\n'
            '# TYPE nixl_failed_total counter\nnixl_failed_total 7\n')
    assert parse(page, CUSTOM, 1.0).custom == {"queue.depth": 4.0, "nixl.failed": 7.0}  # newest timestamp wins
    optional_absent = parse('q 1\nr 2\nkv 0.5\ndepth{tier="gold"} 3\n', CUSTOM, 1.0)
    assert optional_absent.custom == {"queue.depth": 3.0}
    with pytest.raises(MetricsParseError, match="custom metric queue.depth"):
        parse('q 1\nr 2\nkv 0.5\ndepth{tier="silver"} 9\nnixl_failed_total 7\n', CUSTOM, 1.0)


LABELS = dataclasses.replace(CUSTOM, custom_metrics=(
    CustomMetric("compat", (MetricSpec.parse("cfg_info"),), label_name="hash"),
    CustomMetric("opt", (MetricSpec.parse("other_info"),), optional=True, label_name="hash")))


@pytest.mark.parametrize("parse", PARSERS)
def test_custom_label_metrics(parse):
    """``labelName`` reads the label of the newest series (its value, even NaN, does not matter); a series without
    the label, or an empty one, is missing: the scrape fails unless the entry is optional."""
    m = parse('q 1\nr 2\nkv 0.5\ncfg_info{hash="a"} 1 1000\ncfg_info{hash="b"} NaN 2000\nother_info 1\n', LABELS, 1.0)
    assert (m.custom_labels, m.custom) == ({"compat": "b"}, {})
    for page in ('q 1\nr 2\nkv 0.5\ncfg_info{x="a"} 1\n', 'q 1\nr 2\nkv 0.5\ncfg_info{hash=""} 1\n'):
        with pytest.raises(MetricsExtractError, match="custom metric compat .label hash of cfg_info"):
            parse(page, LABELS, 1.0)


def test_custom_metric_keys_must_be_unique():
    with pytest.raises(ValueError, match="repeated"):
        EngineConfig("x", custom_metrics=(CustomMetric("k", (MetricSpec.parse("a"),)),
                                          CustomMetric("k", (MetricSpec.parse("b"),))))


SGLANG = b"""\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 6.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.42
sglang:cache_config_info{page_size="32",num_pages="1000"} 1
"""

# Newer SGLang: the cache geometry as plain gauges (labelled per rank) instead of cache_config_info labels.
SGLANG_GAUGES = b"""\
# TYPE sglang:page_size gauge
sglang:page_size{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 16.0
# TYPE sglang:num_pages gauge
sglang:num_pages{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 5000.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 2.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 6.0
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.42
"""

TRTLLM = b"""\
trtllm_num_requests_waiting 5
trtllm_num_requests_running 3
trtllm_kv_cache_utilization 0.6
trtllm_kv_cache_tokens_per_block 64
trtllm_kv_cache_max_blocks 4096
"""

TRITON = b"""\
nv_trt_llm_request_metrics{model="m",request_type="context"} 1
nv_trt_llm_request_metrics{model="m",request_type="scheduled"} 4
nv_trt_llm_request_metrics{model="m",request_type="waiting"} 9
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="m"} 0.25
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="m"} 8192
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="m"} 32
"""


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize("engine,page,expected", [
    ("sglang", SGLANG, (2, 6, 0.42, 32, 1000)),
    ("sglang", SGLANG_GAUGES, (2, 6, 0.42, 16, 5000)),
    ("trtllm-serve", TRTLLM, (5, 3, 0.6, 64, 4096)),
    ("triton-tensorrt-llm", TRITON, (9, 4, 0.25, 32, 8192)),
], ids=["sglang-cache-info", "sglang-gauges", "trtllm-serve", "triton"])
def test_other_engines(parse, engine, page, expected):
    m = parse(page.decode(), BUILTIN_ENGINES[engine], 1.0)
    assert (m.waiting, m.running, m.kv_usage, m.block_size, m.num_gpu_blocks) == pytest.approx(expected)


def test_vllm_engine_rejects_an_sglang_page():
    with pytest.raises(MetricsParseError, match="vllm:num_requests_waiting"):
        parse_targeted(SGLANG, VLLM, 1.0)


@pytest.mark.parametrize("parse", PARSERS)
def test_escaped_label_values_and_timestamps(parse):
    page = (b'vllm:num_requests_running{a="x}y",b="q\\"uote"} 2 1700000000000\n'
            b"vllm:num_requests_waiting 3\n"
            b'vllm:kv_cache_usage_perc{engine="0"} 0.5\r\n'
            b'vllm:cache_config_info{block_size="32",num_gpu_blocks="10",note="a\\\\b\\nc"} 1\n')
    m = parse(page.decode(), VLLM, 1.0)
    assert (m.running, m.waiting, m.kv_usage, m.block_size, m.num_gpu_blocks) == (2, 3, 0.5, 32, 10)


def test_longer_names_and_histogram_children_do_not_match():
    page = (b"vllm:num_requests_running_total 99\n"
            b"vllm:num_requests_running_bucket{le=\"1\"} 98\n"
            b"vllm:num_requests_running 4\n"
            b"vllm:num_requests_waiting 1\n"
            b"vllm:kv_cache_usage_perc 0.5\n")
    assert parse_targeted(page, VLLM, 1.0).running == 4


def test_negative_counts_are_clamped():
    page = b"vllm:num_requests_running -3\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.5\n"
    m = parse_targeted(page, VLLM, 1.0)
    assert (m.running, m.waiting, m.kv_usage) == (0, 1, 0.5)


# The reference's TestExtractorReadsEveryEngineOfDataParallelPod pages (four engines, then one NaN engine).
DP4 = "".join(f'{family}{{engine="{i}"}} {value}\n'
              for family, values in [("vllm:num_requests_waiting", (6, 10, 11, 7)),
                                     ("vllm:num_requests_running", (40, 38, 41, 37)),
                                     ("vllm:kv_cache_usage_perc", (0.52, 0.91, 0.78, 0.6))]
              for i, value in enumerate(values))


@pytest.mark.parametrize("parse", PARSERS)
def test_data_parallel_engines_as_the_reference(parse):
    m = parse(DP4, VLLM, 1.0)
    assert (m.waiting, m.running, m.kv_usage) == (34, 156, 0.91)


@pytest.mark.parametrize("page", [
    DP4.replace('waiting{engine="1"} 10', 'waiting{engine="1"} NaN'),
    DP4.replace('running{engine="0"} 40', 'running{engine="0"} +Inf'),
    DP4.replace('perc{engine="3"} 0.6', 'perc{engine="3"} -Inf'),
    "vllm:num_requests_running 1\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc NaN\n",
], ids=["nan-waiting", "inf-running", "minus-inf-kv", "nan-kv"])
def test_a_non_finite_required_value_fails_the_scrape(page):
    """The reference's TestExtractorRejectsNonFiniteMetrics: an error, and the previous value stays (EPP keeps the
    whole last good snapshot); before, NaN KV usage read as 0.0 and made the endpoint look empty."""
    with pytest.raises(MetricsExtractError, match="non-finite value in"):
        parse_targeted(page.encode(), VLLM, 1.0)


@pytest.mark.parametrize("page", [
    b"",
    b"<html><body>502 Bad Gateway</body></html>",
    b"\x00\x01\xff\xfe" * 100,
    b"vllm:num_requests_running 1\nvllm:num_requests_waiting 2\n",  # no KV usage
    b"vllm:num_requests_running one\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.1\n",
    b"vllm:num_requests_running{engine=\"0\" 1\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.1\n",
    b"vllm:num_requests_running 1 2 3\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.1\n",
    b"vllm:num_requests_running 1e308\nvllm:num_requests_running 1e308\nvllm:num_requests_waiting 2\n"
    b"vllm:kv_cache_usage_perc 0.1\n",
    b"vllm:num_requests_running +Inf\nvllm:num_requests_running -Inf\nvllm:num_requests_waiting 2\n"
    b"vllm:kv_cache_usage_perc 0.1\n",
], ids=["empty", "html", "binary", "missing-kv", "bad-value", "unterminated-labels", "extra-fields", "overflow",
        "inf-minus-inf"])
def test_garbage_raises_parse_error(page):
    with pytest.raises(MetricsParseError):
        parse_targeted(page, VLLM, 1.0)


def test_malformed_labels_fail_only_when_read():
    page = (b"vllm:num_requests_running 1\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.1\n"
            b"vllm:cache_config_info{block_size=16} 1\n")
    with pytest.raises(MetricsParseError, match="label"):
        parse_targeted(page, VLLM, 1.0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400) | st.text(alphabet='vlm:_{}="\n 0.1eNa#,\\', max_size=400).map(str.encode))
def test_arbitrary_bytes_never_raise_anything_but_parse_error(page):
    for prefix in (b"", b"vllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\nvllm:num_requests_waiting"):
        try:
            parse_targeted(prefix + page, VLLM, 1.0)
        except MetricsParseError:
            pass


@pytest.mark.parametrize("text,expected", [
    ("vllm:num_requests_waiting", MetricSpec("vllm:num_requests_waiting")),
    ('nv{request_type="waiting"}', MetricSpec("nv", (("request_type", "waiting"),))),
    ("nv{a=b, c=\"d\"}", MetricSpec("nv", (("a", "b"), ("c", "d")))),
    ("  x_y  ", MetricSpec("x_y")),
])
def test_metric_spec_parse(text, expected):
    assert MetricSpec.parse(text) == expected


@pytest.mark.parametrize("text", ["", "{a=b}", "9abc", "name{a=b", "name junk", "name{=b}"])
def test_metric_spec_parse_rejects(text):
    with pytest.raises(ValueError):
        MetricSpec.parse(text)


def test_engine_without_required_specs_needs_nothing():
    cfg = EngineConfig("kv-only", kv_usage=(MetricSpec("my_kv"),))
    m = parse_targeted(b"my_kv 0.7\n", cfg, 3.0)
    assert (m.kv_usage, m.waiting, m.running, m.update_time) == (0.7, 0, 0, 3.0)


# -- ScanState: per-endpoint hints must never change the result ---------------------------------------------------


def _page(prefix_lines: int, big_block: int, lora: bool, engines: int = 1) -> bytes:
    lines = [b"# filler %d %s" % (i, b"x" * (i % 50)) for i in range(prefix_lines)]
    for e in range(engines):
        lines.append(b'vllm:num_requests_running{engine="%d"} %d' % (e, 3 + e))
    lines.append(b"vllm:num_requests_waiting 2")
    lines += [b'vllm:kv_cache_usage_perc{engine="%d"} 0.%d' % (i, i % 10) for i in range(big_block)]
    lines.append(b"# TYPE other gauge")
    lines.append(b'vllm:cache_config_info{block_size="16",num_gpu_blocks="%d"} 1' % (100 + prefix_lines))
    if lora:
        lines.append(b'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 5')
    return b"\n".join(lines) + b"\n"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.integers(1, 300), st.booleans(), st.integers(1, 3)),
                min_size=1, max_size=6))
def test_scan_state_hints_are_exact(pages):
    from epp.datalayer.parsing import ScanState

    state = ScanState(recheck=0)  # always re-look for absent families: only the hints are under test
    for args in pages:
        page = _page(*args)
        assert parse_targeted(page, VLLM, 1.0, state) == parse_targeted(page, VLLM, 1.0)


def test_scan_state_on_real_pages_in_any_order(v0_page, v1_page):
    from epp.datalayer.parsing import ScanState

    state = ScanState(recheck=0)
    for page in (v1_page, v0_page, v1_page, LORA, v0_page, V1_AND_LEGACY, v1_page):
        assert parse_targeted(page, VLLM, 1.0, state) == parse_targeted(page, VLLM, 1.0)


def test_absent_optional_family_is_rechecked_periodically():
    from epp.datalayer.parsing import ScanState

    state = ScanState(recheck=3)
    without, with_lora = _page(10, 2, lora=False), _page(10, 2, lora=True)
    assert parse_targeted(without, VLLM, 1.0, state).running_loras == frozenset()
    seen = [parse_targeted(with_lora, VLLM, 1.0, state).running_loras for _ in range(4)]
    assert seen == [frozenset()] * 3 + [frozenset({"a"})]  # found at the recheck, then every page
    assert parse_targeted(with_lora, VLLM, 1.0, state).running_loras == frozenset({"a"})
    # required families are never skipped: a page without KV usage fails at once
    with pytest.raises(MetricsParseError):
        parse_targeted(b"vllm:num_requests_running 1\nvllm:num_requests_waiting 1\n", VLLM, 1.0, state)
