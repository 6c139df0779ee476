"""``epp envoy-config``: the bootstrap's security-relevant structure and the command line; every option's output
loads in the real Envoy (``envoy --mode validate``)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
import yaml

from epp.cli.envoy import queue_wait
from epp.cli.main import main
from epp.envoy.bootstrap import (
    DESTINATION_KEY,
    EPP_CLUSTER,
    FALLBACK_CLUSTER,
    INFERENCE_SUFFIXES,
    POOL_CLUSTER,
    RETRY_ON,
    XDS_CLUSTER,
    EnvoyConfigError,
    EnvoyConfigOptions,
    build_bootstrap,
)
from epp.plugins.parsers.anthropic import AnthropicParser
from epp.plugins.parsers.openai import OpenAIParser

from .envoy_harness import validate


def parts(opts: EnvoyConfigOptions):  # type: ignore[no-untyped-def]
    boot = build_bootstrap(opts)
    listener = boot["static_resources"]["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    ext_proc = hcm["http_filters"][0]["typed_config"]
    return boot, listener, hcm, clusters, ext_proc


def test_pool_is_routed_by_metadata_that_only_epp_can_set() -> None:
    _, _, hcm, clusters, ext_proc = parts(EnvoyConfigOptions())
    pool = clusters[POOL_CLUSTER]
    assert pool["type"] == "ORIGINAL_DST" and "use_http_header" not in pool["original_dst_lb_config"]
    assert pool["original_dst_lb_config"]["metadata_key"] == {
        "key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint-primary"}]}
    assert ext_proc["metadata_options"]["receiving_namespaces"] == {"untyped": ["envoy.lb"]}
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    routed, unrouted = routes[0], routes[2]  # the claimed paths, with and without EPP's decision
    assert routed["match"]["safe_regex"] == unrouted["match"]["safe_regex"]
    assert routed["match"]["dynamic_metadata"][0]["value"] == {"present_match": True}
    assert routed["route"] == {"cluster": POOL_CLUSTER, "timeout": "300s"}  # ORIGINAL_DST: no retry elsewhere
    assert unrouted["direct_response"]["status"] == 503  # never ORIGINAL_DST without a decision


def test_ext_proc_cluster_is_http2_with_tls_unless_plaintext() -> None:
    _, _, _, clusters, _ = parts(EnvoyConfigOptions(epp=("127.0.0.1:9002", "127.0.0.1:9003")))
    epp = clusters[EPP_CLUSTER]
    options = epp["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http2_protocol_options" in options["explicit_http_config"]
    assert epp["transport_socket"]["name"] == "envoy.transport_sockets.tls"
    assert len(epp["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2
    _, _, _, plain, _ = parts(EnvoyConfigOptions(plaintext=True))
    assert "transport_socket" not in plain[EPP_CLUSTER]


def test_every_epp_is_health_checked_on_the_plaintext_health_port() -> None:
    _, _, _, clusters, _ = parts(EnvoyConfigOptions(epp=("10.0.0.7:9002", "10.0.0.8:9002"), epp_health_port=9013))
    epp = clusters[EPP_CLUSTER]
    endpoints = epp["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["health_check_config"] for e in endpoints] == [{"port_value": 9013}] * 2
    (check,) = epp["health_checks"]
    assert check["grpc_health_check"] == {"service_name": "envoy.service.ext_proc.v3.ExternalProcessor"}
    assert check["no_traffic_interval"] == check["interval"] == "1s"  # Envoy's 60 s default would see a drain late
    # ext_proc is TLS, the health port plaintext: the check picks the raw-buffer socket by its match criteria
    (match,) = epp["transport_socket_matches"]
    assert match["match"] == check["transport_socket_match_criteria"]
    assert match["transport_socket"]["name"] == "envoy.transport_sockets.raw_buffer"
    _, _, _, plain, _ = parts(EnvoyConfigOptions(plaintext=True, epp_health_port=9003))
    assert "transport_socket_matches" not in plain[EPP_CLUSTER]
    assert "transport_socket_match_criteria" not in plain[EPP_CLUSTER]["health_checks"][0]
    _, _, _, unchecked, _ = parts(EnvoyConfigOptions())
    assert "health_checks" not in unchecked[EPP_CLUSTER]


@pytest.mark.parametrize("mode, body, trailers, buffer", [
    ("full-duplex", "FULL_DUPLEX_STREAMED", "SEND", None),
    ("buffered", "BUFFERED", "SKIP", (10 << 20) + (1 << 20)),
])
def test_processing_modes_and_buffer_limits(mode: str, body: str, trailers: str, buffer: int | None) -> None:
    _, listener, _, _, ext_proc = parts(EnvoyConfigOptions(mode=mode))  # type: ignore[arg-type]
    pm = ext_proc["processing_mode"]
    assert (pm["request_body_mode"], pm["request_trailer_mode"]) == (body, trailers)
    assert (pm["response_header_mode"], pm["response_body_mode"]) == ("SEND", "STREAMED")
    assert listener.get("per_connection_buffer_limit_bytes") == buffer
    assert ext_proc["failure_mode_allow"] is False


def test_fail_open_routes_unpicked_requests_to_the_fallback_cluster_only() -> None:
    _, _, hcm, clusters, ext_proc = parts(EnvoyConfigOptions(mode="buffered", fail_open=True,
                                                            fallback=("10.0.0.1:8000",)))
    assert ext_proc["failure_mode_allow"] is True
    assert hcm["route_config"]["virtual_hosts"][0]["routes"][2]["route"]["cluster"] == FALLBACK_CLUSTER
    assert clusters[FALLBACK_CLUSTER]["type"] == "STATIC"


def test_response_mode_none_sends_no_response_phase() -> None:
    _, _, _, _, ext_proc = parts(EnvoyConfigOptions(mode="buffered", response_mode="none"))
    pm = ext_proc["processing_mode"]
    assert (pm["response_header_mode"], pm["response_body_mode"], pm["response_trailer_mode"]) == (
        "SKIP", "NONE", "SKIP")


def test_response_mode_none_with_a_full_duplex_request_body_is_refused(capsys) -> None:
    # Envoy resets such a stream right after the routing reply: EPP would release every request ~1 ms after
    # routing it (tests/extproc/test_envoy.py shows the reset with a real Envoy).
    with pytest.raises(EnvoyConfigError, match="--response-mode none needs --mode buffered"):
        build_bootstrap(EnvoyConfigOptions(response_mode="none"))
    assert main(["envoy-config", "--response-mode", "none"]) == 2  # the default --mode is full-duplex
    assert "needs --mode buffered" in capsys.readouterr().err
    assert main(["envoy-config", "--mode", "buffered", "--response-mode", "none"]) == 0


def test_cli_prints_yaml_with_comma_separated_workers(capsys) -> None:
    assert main(["envoy-config", "--epp", "10.0.0.9:9002,10.0.0.9:9003", "--epp", "10.0.0.9:9004",
                 "--listen", "127.0.0.1:8081", "--plaintext"]) == 0
    boot = yaml.safe_load(capsys.readouterr().out)
    epp = next(c for c in boot["static_resources"]["clusters"] if c["name"] == EPP_CLUSTER)
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"]
             for e in epp["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert ports == [9002, 9003, 9004]


def test_cli_writes_a_file_and_refuses_contradictions(tmp_path, capsys) -> None:
    out = tmp_path / "envoy.yaml"
    assert main(["envoy-config", "--mode", "buffered", "--fail-open", "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["static_resources"]
    assert main(["envoy-config", "--fail-open"]) == 2
    assert "needs --mode buffered" in capsys.readouterr().err


# -- timeouts sized for EPP's flow-control queue -------------------------------------------------------------

def timeouts(opts: EnvoyConfigOptions) -> tuple[str, str]:
    _, _, hcm, _, ext_proc = parts(opts)
    assert hcm["request_timeout"] == "120s"  # receiving the client's request only: Envoy stops it once it is in
    return ext_proc["message_timeout"], hcm["stream_idle_timeout"]


@pytest.mark.parametrize("opts, expected", [
    (EnvoyConfigOptions(), ("5s", "300s")),
    (EnvoyConfigOptions(mode="buffered"), ("5s", "300s")),
    (EnvoyConfigOptions(mode="buffered", queue_wait_s=30), ("35s", "300s")),
    (EnvoyConfigOptions(mode="buffered", queue_wait_s=600), ("605s", "605s")),
    (EnvoyConfigOptions(queue_wait_s=600), ("5s", "605s")),  # full-duplex: no message timeout on the request
    (EnvoyConfigOptions(mode="buffered", queue_wait_s=0), ("300s", "300s")),  # no TTL: the idle timeout ends it
    (EnvoyConfigOptions(mode="buffered", queue_wait_s=7200), ("3600s", "7205s")),  # Envoy's 1 h maximum
    (EnvoyConfigOptions(route_timeout_s=900), ("5s", "900s")),  # a non-streamed answer is silent until done
    (EnvoyConfigOptions(mode="buffered", queue_wait_s=600, message_timeout_s=9, idle_timeout_s=60), ("9s", "60s")),
], ids=["default", "buffered-no-queue", "buffered-short-ttl", "buffered-long-ttl", "full-duplex-long-ttl",
        "buffered-no-ttl", "buffered-beyond-1h", "long-route-timeout", "explicit"])
def test_timeouts_outlast_the_flow_control_queue(opts: EnvoyConfigOptions, expected: tuple[str, str]) -> None:
    assert timeouts(opts) == expected


@pytest.mark.parametrize("opts, words", [
    (EnvoyConfigOptions(mode="buffered", queue_wait_s=0), ["no request TTL", "stream timeout"]),
    (EnvoyConfigOptions(queue_wait_s=600, idle_timeout_s=300), ["shorter than", "stream timeout"]),
    (EnvoyConfigOptions(mode="buffered", fail_open=True, queue_wait_s=30, message_timeout_s=5),
     ["504", "--fail-open", "past flow control"]),
    (EnvoyConfigOptions(mode="buffered", queue_wait_s=7200), ["504", "at most 1 h", "--mode full-duplex"]),
], ids=["no-ttl", "idle-timeout-too-short", "message-timeout-too-short-fail-open", "beyond-1h"])
def test_what_the_timeouts_cannot_cover_is_named(opts: EnvoyConfigOptions, words: list[str]) -> None:
    text = " ".join(opts.warnings())
    assert all(w in text for w in words), text


def test_sized_timeouts_warn_about_nothing_and_a_message_timeout_beyond_envoys_range_is_refused() -> None:
    assert EnvoyConfigOptions(mode="buffered", queue_wait_s=600).warnings() == []
    assert EnvoyConfigOptions(mode="buffered").warnings() == []  # no queue known: nothing to say here
    with pytest.raises(EnvoyConfigError, match="--message-timeout"):
        build_bootstrap(EnvoyConfigOptions(mode="buffered", message_timeout_s=3601))


FLOW_CONTROL = """\
featureGates: [flowControl]
flowControl:
  defaultRequestTTL: 20s
  tenants:
    defaults: {requestTTL: 30s}
    batch: {requestTTL: 5m}
    quick: {weight: 2}
"""


@pytest.mark.parametrize("text, wait", [
    (FLOW_CONTROL, 300.0),
    ("featureGates: [flowControl]\nflowControl: {defaultRequestTTL: 20s, noEndpointRequestTTL: 10s}\n", 20.0),
    ("featureGates: [flowControl]\nflowControl: {defaultRequestTTL: 20s}\n", 60.0),  # noEndpointRequestTTL 60s
    ("featureGates: [flowControl]\nflowControl: {noEndpointRequestTTL: 2m}\n", 120.0),
    ("featureGates: [flowControl]\n", 60.0),  # both budgets default to 60s, as in the reference
    ("featureGates: [flowControl]\nflowControl: {defaultRequestTTL: 0s}\n", 0.0),  # no TTL: as long as the client
    ("featureGates: [flowControl]\nflowControl: {noEndpointRequestTTL: 0s}\n", 0.0),
    (FLOW_CONTROL.replace("defaults: {requestTTL: 30s}", "defaults: {requestTTL: 0s}"), 0.0),
    (FLOW_CONTROL.replace("featureGates: [flowControl]\n", ""), None),  # gate off: nothing is queued
], ids=["tenant-ttls", "default-ttl", "no-endpoint-default", "no-endpoint-ttl", "defaults", "no-ttl",
        "no-endpoint-no-ttl", "a-tenant-without-ttl", "gate-off"])
def test_queue_wait_is_the_longest_request_ttl(tmp_path, text: str, wait: float | None) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(text)
    assert queue_wait(str(path)) == wait


def test_cli_sizes_a_buffered_config_for_the_epp_config_and_says_when_it_cannot(tmp_path, capsys) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(FLOW_CONTROL)
    assert main(["envoy-config", "--mode", "buffered", "--config", str(path)]) == 0
    captured = capsys.readouterr()
    boot = yaml.safe_load(captured.out)
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["http_filters"][0]["typed_config"]["message_timeout"] == "305s" and "warning" not in captured.err
    assert main(["envoy-config", "--mode", "buffered", "--fail-open", "--message-timeout", "5",
                 "--config", str(path)]) == 0
    assert "warning: buffered mode" in capsys.readouterr().err
    assert main(["envoy-config", "--mode", "buffered"]) == 0  # without the EPP config: a note on what to do
    assert "--config" in capsys.readouterr().err
    assert main(["envoy-config", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read config file" in capsys.readouterr().err


# -- override_host over EPP's EDS, retries, routes, local replies ---------------------------------------------

def test_override_host_reads_epps_list_from_metadata_only_and_learns_the_pool_over_xds() -> None:
    _, _, hcm, clusters, _ = parts(EnvoyConfigOptions(lb="override-host", epp=("10.0.0.5:9002",)))
    pool = clusters[POOL_CLUSTER]
    assert pool["type"] == "EDS" and "original_dst_lb_config" not in pool
    policy = pool["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    # One source, metadata: a client header never picks the upstream, and the list is walked once.
    assert policy["typed_config"]["override_host_sources"] == [
        {"metadata": {"key": "envoy.lb", "path": [{"key": DESTINATION_KEY}]}}]
    eds = pool["eds_cluster_config"]["eds_config"]["api_config_source"]
    assert eds["grpc_services"][0]["envoy_grpc"]["cluster_name"] == XDS_CLUSTER
    xds = clusters[XDS_CLUSTER]  # HTTP/2 and TLS as the ext_proc cluster; EPP's host, the default xDS port
    assert "http2_protocol_options" in str(xds["typed_extension_protocol_options"]) and "transport_socket" in xds
    assert xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] == {
        "address": "10.0.0.5", "port_value": 18000}
    assert pool["circuit_breakers"]["thresholds"][0]["max_retries"] >= 1000  # a dead pod: many retries at once
    routed = hcm["route_config"]["virtual_hosts"][0]["routes"][0]
    assert routed["match"]["dynamic_metadata"][0]["path"] == [{"key": DESTINATION_KEY}]
    retry = routed["route"]["retry_policy"]
    assert retry["retry_on"] == RETRY_ON and retry["num_retries"] == 3 and retry["retriable_status_codes"] == [503]
    assert retry["retry_host_predicate"][0]["name"] == "envoy.retry_host_predicates.previous_hosts"


@pytest.mark.parametrize("opts, address", [
    (EnvoyConfigOptions(lb="override-host", epp=("[::1]:9002",)), ("::1", 18000)),
    (EnvoyConfigOptions(lb="override-host", xds=("epp.example:7000",)), ("epp.example", 7000)),
], ids=["ipv6-epp", "explicit-dns"])
def test_the_xds_address(opts: EnvoyConfigOptions, address: tuple[str, int]) -> None:
    _, _, _, clusters, _ = parts(opts)
    socket = clusters[XDS_CLUSTER]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert (socket["socket_address"]["address"], socket["socket_address"]["port_value"]) == address


def test_no_retries_and_original_dst_have_no_retry_policy() -> None:
    for opts in (EnvoyConfigOptions(lb="override-host", retries=0), EnvoyConfigOptions()):
        _, _, hcm, clusters, _ = parts(opts)
        assert "retry_policy" not in hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert XDS_CLUSTER not in clusters  # ORIGINAL_DST needs nothing from EPP but ext_proc


def test_the_default_suffixes_are_the_openai_and_anthropic_parsers_claims() -> None:
    assert INFERENCE_SUFFIXES == OpenAIParser.claims + AnthropicParser.claims


@pytest.mark.parametrize("path, routed", [
    ("/v1/chat/completions", True), ("/v1/completions", True), ("/v1/messages/count_tokens", True),
    ("/v1/chat/completions/", True), ("/openai/v1/responses", True), ("/v1/nothing", False),
    ("/reset_prefix_cache", False), ("/v1/load_lora_adapter", False), ("/tokenize", False), ("/completionsx", False),
])
def test_the_claimed_paths_regex(path: str, routed: bool) -> None:
    _, _, hcm, _, _ = parts(EnvoyConfigOptions())
    regex = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["match"]["safe_regex"]["regex"]
    assert bool(re.fullmatch(regex, path)) is routed  # RE2 full match, as Envoy applies it to the path


def test_every_other_path_is_a_404_from_envoy_without_ext_proc() -> None:
    _, _, hcm, _, _ = parts(EnvoyConfigOptions(allow_paths=("/tokenize", "/tokenize")))
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert [r["match"].get("path") for r in routes] == [None, "/v1/models", "/tokenize"] * 2 + [None]
    last = routes[-1]
    assert last["match"] == {"prefix": "/"} and last["direct_response"] == {"status": 404}
    assert last["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["disabled"] is True
    assert hcm["normalize_path"] is True and hcm["merge_slashes"] is True


def test_envoys_own_answers_are_json_and_epps_pass_unchanged() -> None:
    _, _, hcm, _, _ = parts(EnvoyConfigOptions())
    first, *mappers = hcm["local_reply_config"]["mappers"]
    assert first == {"filter": {"extension_filter": {
        "name": "envoy.access_loggers.extension_filters.cel", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
            "expression": "response.code_details.startsWith('epp_')"}}}}  # no rewrite
    assert len(mappers) == 20  # ten cases, each in Anthropic's envelope for /v1/messages, then OpenAI's
    for mapper in mappers:
        body = mapper["body_format_override"]["json_format"]
        assert ("type" in body["error"]) and (body.get("type") == "error" or "code" in body["error"])
        is_503 = mapper.get("status_code") == 503 or "== 503" in mapper["filter"]["extension_filter"][
            "typed_config"]["expression"]
        assert ("headers_to_add" in mapper) is is_503


def test_options_that_cannot_work_are_refused(capsys) -> None:
    for opts, words in [(EnvoyConfigOptions(xds=("127.0.0.1:1",)), "--xds is only used with --lb override-host"),
                        (EnvoyConfigOptions(retries=11), "--retries"),
                        (EnvoyConfigOptions(allow_paths=("tokenize",)), "--allow-path"),
                        (EnvoyConfigOptions(suffixes=()), "no inference path")]:
        with pytest.raises(EnvoyConfigError, match=words):
            build_bootstrap(opts)
    assert main(["envoy-config", "--lb", "original-dst", "--xds", "127.0.0.1:1"]) == 2


PARSERS = """
plugins:
- {name: chat, type: openai-parser}
- {name: grpc, type: vllmgrpc-parser}
- {name: gen, type: sglanghttp-parser}
- {name: vertex, type: vertexai-parser}
requestHandler:
  parsers: [{pluginRef: chat}, {pluginRef: grpc}, {pluginRef: gen}, {pluginRef: vertex}]
"""


def test_with_epps_config_the_configured_parsers_paths_are_routed(tmp_path: Path, capsys) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(PARSERS)
    assert main(["envoy-config", "--config", str(path)]) == 0
    captured = capsys.readouterr()
    hcm = yaml.safe_load(captured.out)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    regex = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["match"]["safe_regex"]["regex"]
    for routed in ("/vllm.grpc.engine.VllmEngine/Generate", "/vllm.grpc.engine.VllmEngine/Embed", "/generate",
                   "/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions", "/v1/chat/completions",
                   "/v1/messages"):
        assert re.fullmatch(regex, routed), routed
    assert "epp serve with --xds-port" in captured.err  # the default --lb override-host needs EPP's xDS


CLI_VARIANTS = {
    "default": [],
    "original-dst": ["--lb", "original-dst"],
    "plaintext-explicit-xds": ["--plaintext", "--xds", "10.0.0.5:18000,10.0.0.6:18000"],
    "no-retries": ["--retries", "0"],
    "buffered": ["--mode", "buffered"],
    "buffered-fail-open-fallback": ["--mode", "buffered", "--fail-open", "--fallback", "10.0.0.1:8000"],
    "buffered-response-none": ["--mode", "buffered", "--response-mode", "none", "--lb", "original-dst"],
    "response-full-duplex": ["--response-mode", "full-duplex"],
    "allow-paths": ["--allow-path", "/tokenize", "--allow-path", "/v1/load_lora_adapter"],
    "dns-workers": ["--epp", "epp.example:9002,epp.example:9004", "--access-log", "--admin", ""],
    "ipv6": ["--listen", "[::]:8081", "--epp", "[::1]:9002"],
    "two-epps-health-checked": ["--epp", "10.0.0.7:9002,10.0.0.8:9002", "--epp-health-port", "9013",
                                "--health-interval", "0.5"],
    "plaintext-health-checked": ["--plaintext", "--epp", "10.0.0.7:9002,10.0.0.8:9002"],
    "no-health-checks": ["--epp-health-port", "0"],
    "parsers-config": ["--config", "{parsers}"],
}


@pytest.mark.envoy
@pytest.mark.parametrize("args", CLI_VARIANTS.values(), ids=CLI_VARIANTS.keys())
def test_every_cli_variant_loads_in_envoy(envoy_bin: Path, tmp_path: Path, args: list[str], capsys) -> None:
    parsers = tmp_path / "epp.yaml"
    parsers.write_text(PARSERS)
    out = tmp_path / "envoy.yaml"
    assert main(["envoy-config", *[a.format(parsers=parsers) for a in args], "-o", str(out)]) == 0
    capsys.readouterr()
    result = validate(envoy_bin, out)
    assert result.returncode == 0, result.stdout + result.stderr


def test_envoy_answers_use_epps_error_shapes() -> None:
    _, _, hcm, _, _ = parts(EnvoyConfigOptions())
    bodies = [m["body_format_override"]["json_format"] for m in hcm["local_reply_config"]["mappers"][1:]]
    not_found = next(b for b in bodies if b.get("error", {}).get("code") == "NotFound")
    assert orjson.dumps(not_found) == orjson.dumps({"error": {
        "message": "no route for %REQ(:METHOD)% %REQ(:PATH)%", "type": "not_found_error", "param": None,
        "code": "NotFound"}})
