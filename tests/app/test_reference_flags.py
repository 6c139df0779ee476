"""The reference EPP's command-line flags on ``epp serve``: its Helm chart's args parse and mean what they mean
there; Go booleans; ``--cert-path`` as a directory; ``$NAMESPACE``; the legacy metric flags; clear usage errors."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest

from epp.cli.logs import JsonFormatter
from epp.cli.main import build_parser
from epp.cli.reference_flags import go_bool, reference_settings
from epp.cli.serve import options_from_args

# The epp container's args as the reference's Helm chart (config/charts/epplib/templates/_deployment.yaml) renders
# them for a release "llama" in namespace "llm" with two replicas, tracing and metrics auth off, and the flags
# map {v: 3} (rendered as "--v=3").
CHART_ARGS = ["--pool-name", "llama", "--pool-namespace", "llm", "--pool-group", "inference.networking.k8s.io",
              "--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml",
              "--ha-enable-leader-election", "--v=3", "--tracing=false", "--metrics-endpoint-auth=false"]

# The chart's extra args for an SGLang pool and for trtllm-serve (quotes included, as the chart writes them).
SGLANG_ARGS = ['--total-queued-requests-metric="sglang:num_queue_reqs"',
               '--total-running-requests-metric="sglang:num_running_reqs"',
               '--kv-cache-usage-percentage-metric="sglang:token_usage"',
               '--cache-info-metric="sglang:cache_config_info"']
TRTLLM_ARGS = ['--total-queued-requests-metric="trtllm_num_requests_waiting"',
               '--total-running-requests-metric="trtllm_num_requests_running"',
               '--kv-cache-usage-percentage-metric="trtllm_kv_cache_utilization"',
               '--cache-info-metric="trtllm_cache_config_info"',
               '--model-server-metrics-path="/prometheus/metrics"', "--lora-info-metric", ""]


def parse(*args: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["serve", *args])


def test_the_reference_charts_args_parse_and_mean_the_same() -> None:
    args = parse(*CHART_ARGS)
    settings = reference_settings(args, log_level_given=False)
    options = options_from_args(args, settings)
    assert (options.pool_name, options.pool_namespace, options.pool_group) == ("llama", "llm",
                                                                              "inference.networking.k8s.io")
    assert options.config == "/config/default-plugins.yaml"
    assert options.leader_election and not options.plaintext  # TLS stays on, as the reference's default
    assert (options.grpc_port, options.health_port, options.metrics_port) == (9002, 9003, 9090)
    assert settings.log_json and settings.log_level == logging.INFO and settings.warnings == []


def test_the_charts_engine_args_set_the_default_engines_metrics() -> None:
    options = options_from_args(parse("--endpoints", "e.yaml", *SGLANG_ARGS))
    assert options.engine_metrics == {"queued": "sglang:num_queue_reqs", "running": "sglang:num_running_reqs",
                                      "kv_usage": "sglang:token_usage", "cache_info": "sglang:cache_config_info"}
    options = options_from_args(parse("--endpoints", "e.yaml", *TRTLLM_ARGS))
    assert options.engine_metrics["lora"] == "" and options.engine_metrics["queued"] == "trtllm_num_requests_waiting"
    assert options.scrape_overrides == {"path": "/prometheus/metrics"}
    # The Triton form: separate values with label matchers.
    options = options_from_args(parse("--endpoints", "e.yaml", "--kv-cache-usage-percentage-metric",
                                      "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"))
    assert options.engine_metrics == {"kv_usage": "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"}


@pytest.mark.parametrize("text, value", [("1", True), ("t", True), ("T", True), ("TRUE", True), ("true", True),
                                         ("True", True), ("0", False), ("f", False), ("F", False),
                                         ("FALSE", False), ("false", False), ("False", False)])
def test_go_boolean_spellings(text: str, value: bool) -> None:
    assert go_bool(text) is value


def test_boolean_flags_alone_are_true_and_secure_serving_false_is_plaintext() -> None:
    assert options_from_args(parse("--endpoints", "e.yaml", "--secure-serving=false")).plaintext
    assert not options_from_args(parse("--endpoints", "e.yaml", "--secure-serving")).plaintext
    assert options_from_args(parse("--endpoints", "e.yaml", "--plaintext")).plaintext
    assert options_from_args(parse("--endpoints", "e.yaml", "--ha-enable-leader-election=True")).leader_election
    assert not options_from_args(parse("--endpoints", "e.yaml")).leader_election


def test_the_tracing_flag_is_kept_as_given() -> None:
    on = reference_settings(parse("--endpoints", "e.yaml", "--tracing"), log_level_given=False)
    assert on.tracing is True and on.warnings == []
    assert reference_settings(parse("--endpoints", "e.yaml", "--tracing=false"), log_level_given=False).tracing is False
    assert reference_settings(parse("--endpoints", "e.yaml"), log_level_given=False).tracing is None


def test_metrics_auth_is_on_by_default_with_kubernetes_discovery_only() -> None:
    assert options_from_args(parse("--pool-name", "p")).metrics_auth
    assert options_from_args(parse("--endpoint-selector", "app=x", "--endpoint-target-ports", "8000")).metrics_auth
    assert not options_from_args(parse("--pool-name", "p", "--metrics-endpoint-auth=false")).metrics_auth
    assert not options_from_args(parse("--endpoints", "e.yaml")).metrics_auth
    assert options_from_args(parse("--endpoints", "e.yaml", "--metrics-endpoint-auth")).metrics_auth
    assert not options_from_args(parse(*CHART_ARGS)).metrics_auth  # the chart passes =false without auth


def test_cert_path_is_a_directory_with_tls_crt_and_key_or_a_file_with_key_path(tmp_path: Path) -> None:
    options = options_from_args(parse("--endpoints", "e.yaml", "--cert-path", str(tmp_path), "--enable-cert-reload"))
    assert (options.cert_path, options.key_path) == (str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    assert options.cert_reload
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    options = options_from_args(parse("--endpoints", "e.yaml", "--cert-path", str(cert), "--key-path", "k.pem"))
    assert (options.cert_path, options.key_path) == (str(cert), "k.pem")
    for args, needle in (((str(cert),), "give the key file with --key-path"),
                         ((str(tmp_path), "--key-path", "k.pem"), "cannot be used when --cert-path is a directory")):
        with pytest.raises(ValueError, match=needle):
            options_from_args(parse("--endpoints", "e.yaml", "--cert-path", *args))
    with pytest.raises(ValueError, match="--enable-cert-reload needs --cert-path"):
        options_from_args(parse("--endpoints", "e.yaml", "--enable-cert-reload"))


def test_pool_namespace_defaults_to_the_namespace_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAMESPACE", "from-env")
    assert options_from_args(parse("--pool-name", "p")).pool_namespace == "from-env"
    assert options_from_args(parse("--pool-name", "p", "--pool-namespace", "flag")).pool_namespace == "flag"
    monkeypatch.delenv("NAMESPACE")
    assert options_from_args(parse("--pool-name", "p")).pool_namespace == "default"


@pytest.mark.parametrize("args, level", [((), logging.INFO), (("--v=4",), logging.DEBUG), (("--v", "2"), logging.INFO),
                                         (("--zap-log-level", "debug"), logging.DEBUG),
                                         (("--zap-log-level=error",), logging.ERROR),
                                         (("--zap-devel",), logging.DEBUG),
                                         (("--v=5", "--log-level", "WARNING"), logging.WARNING)])
def test_log_level_from_v_zap_or_log_level(args: tuple[str, ...], level: int) -> None:
    parsed = parse("--endpoints", "e.yaml", *args)
    assert reference_settings(parsed, parsed.log_level is not None).log_level == level


@pytest.mark.parametrize("args, flag, needle", [
    (("--secure-serving=maybe",), "--secure-serving", "invalid boolean value 'maybe'"),
    (("--pool-group", "example.com"), "--pool-group", "invalid choice"),
    (("--total-queued-requests-metric", "bad{"), "--total-queued-requests-metric", "invalid metric spec"),
    (("--zap-encoder", "xml"), "--zap-encoder", "invalid choice"),
])
def test_bad_values_are_usage_errors_naming_the_flag(args: tuple[str, ...], flag: str, needle: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse("--endpoints", "e.yaml", *args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"argument {flag}" in err and needle in err


def test_json_log_lines_carry_zaps_fields() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("epp.test", logging.ERROR, "/x/app.py", 7, "failed %s", ("here",), sys.exc_info())
    line = orjson.loads(JsonFormatter("epoch").format(record))
    assert line["level"] == "error" and line["logger"] == "epp.test" and line["msg"] == "failed here"
    assert line["caller"] == "app.py:7" and line["error"] == "boom" and "ValueError" in line["stacktrace"]
    assert line["ts"] == record.created
    iso = orjson.loads(JsonFormatter("iso8601").format(record))["ts"]
    assert iso.endswith("Z") and iso[10] == "T" and len(iso) == 24


def test_an_access_line_is_top_level_json_under_the_zap_json_encoder() -> None:
    """The access log's fields become the line's own keys (``jq .status`` works), never a JSON string in msg, and
    cannot overwrite the encoder's own keys."""
    fields = {"status": 200, "model": "m", "endpoint": "10.0.0.1:8000", "level": "spoofed"}
    record = logging.LogRecord("epp.access", logging.INFO, "access_log.py", 1, orjson.dumps(fields).decode(), None,
                               None)
    record.fields = fields
    line = orjson.loads(JsonFormatter("epoch").format(record))
    assert line["msg"] == "access" and line["status"] == 200 and line["model"] == "m"
    assert line["level"] == "info" and line["logger"] == "epp.access"


def test_with_workers_only_worker_0_campaigns_and_serves_the_metrics_port() -> None:
    from epp.cli.serve import worker_options

    options = options_from_args(parse(*CHART_ARGS, "--metrics-endpoint-auth=true", "--workers", "3"))
    assert options.leader_election and options.metrics_auth
    assert worker_options(options, 0) is options
    for index in (1, 2):
        worker = worker_options(options, index)
        assert not worker.leader_election and not worker.metrics_auth and worker.metrics_port is None


def test_config_text_is_the_config_and_a_bad_one_names_the_flag() -> None:
    from epp.errors import ConfigError
    from epp.runtime.app import EppApp

    text = ("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
            "- type: queue-scorer\n- type: random-picker\nschedulingProfiles:\n- name: default\n  plugins:\n"
            "  - pluginRef: queue-scorer\n  - pluginRef: random-picker\n")
    app = EppApp(options_from_args(parse("--endpoints", "e.yaml", "--config-text", text)))
    assert {p.type_name for p in app.pipeline.handle.plugins()} >= {"queue-scorer", "random-picker"}
    with pytest.raises(ConfigError) as info:
        EppApp(options_from_args(parse("--endpoints", "e.yaml", "--config-text", "plugins: [{type: nope}]")))
    assert "--config-text" in str(info.value.source or "") + str(info.value)
