"""``epp envoy-config``: the bootstrap's security-relevant structure and the command line (no Envoy needed)."""

from __future__ import annotations

import pytest
import yaml

from epp.cli import main
from epp.cmd_envoy import queue_wait
from epp.envoy_config import (
    EPP_CLUSTER,
    FALLBACK_CLUSTER,
    POOL_CLUSTER,
    EnvoyConfigError,
    EnvoyConfigOptions,
    build_bootstrap,
)


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
    routed, unrouted = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert routed["match"]["dynamic_metadata"][0]["value"] == {"present_match": True}
    assert routed["route"] == {"cluster": POOL_CLUSTER, "timeout": "300s"}
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
    assert hcm["route_config"]["virtual_hosts"][0]["routes"][1]["route"]["cluster"] == FALLBACK_CLUSTER
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
    assert hcm["http_filters"][0]["typed_config"]["message_timeout"] == "305s" and captured.err == ""
    assert main(["envoy-config", "--mode", "buffered", "--fail-open", "--message-timeout", "5",
                 "--config", str(path)]) == 0
    assert "warning: buffered mode" in capsys.readouterr().err
    assert main(["envoy-config", "--mode", "buffered"]) == 0  # without the EPP config: a note on what to do
    assert "--config" in capsys.readouterr().err
    assert main(["envoy-config", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read config file" in capsys.readouterr().err
