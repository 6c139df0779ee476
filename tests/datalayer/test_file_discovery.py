"""``dataLayer.discovery``: the reference's file-discovery configs (v1alpha1's ``pluginRef`` and v1's
``endpoints.pluginRef``) run EPP without Kubernetes or an ``--endpoints`` flag, serving a simulator the file
lists; what EPP cannot serve (peer discovery, cross-replica sync) is a ConfigError naming the field."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.errors import ConfigError
from epp.framework.registry import Registry
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.builtins import default_registry
from epp_sim import SimConfig, SimServer

from ..conftest import eventually

FIXTURE = Path(__file__).parents[1] / "fixtures/configs/llmd/router_file-discovery.yaml"
RUNNER_TEST, FILE_README = FIXTURE.read_text().split("\n---\n")


@pytest.fixture(scope="module")
def registry() -> Registry:
    return default_registry(entry_points=False)


def build(text: str, registry: Registry):  # type: ignore[no-untyped-def]
    return build_pipeline(*load_raw(text, "t.yaml"), registry)


def endpoints_file(path: Path, *ports: int) -> Path:
    """The reference's file shape: namespace, a quoted port."""
    path.write_text("endpoints:\n" + "".join(
        f"  - name: vllm-{i}\n    namespace: llm\n    address: 127.0.0.1\n    port: \"{p}\"\n"
        for i, p in enumerate(ports)))
    return path


def options(config: str, **kw: object) -> ServeOptions:
    return ServeOptions(config_text=config, host="127.0.0.1", grpc_port=None, health_port=None, metrics_port=None,
                        **kw)  # type: ignore[arg-type]


def test_both_reference_shapes_name_the_discovery_plugin(registry: Registry, tmp_path: Path) -> None:
    path = str(endpoints_file(tmp_path / "e.yaml", 8000))
    old, new = (build(text.replace("ENDPOINTS_FILE", path), registry) for text in (RUNNER_TEST, FILE_README))
    assert (old.discovery.name, old.discovery.params.path, old.discovery.params.watch_file) == (
        "file-discovery", path, False)
    assert (new.discovery.name, new.discovery.params.watch_file) == ("file-discovery", True)
    assert "discovery: file-discovery" in old.describe()
    assert not old.discovery.discovery_service(Datastore()).watch  # watchFile false: read once, never again


async def test_the_runner_test_config_serves_the_files_simulator_through_the_gateway(tmp_path: Path) -> None:
    sim = SimServer(SimConfig(model="m", time_scale=0.01, seed=2))
    await sim.start("127.0.0.1", 0)
    path = endpoints_file(tmp_path / "endpoints.yaml", sim.port)
    app = EppApp(options(RUNNER_TEST.replace("ENDPOINTS_FILE", str(path)), http_port=0))
    try:
        await app.start()
        assert not app.kubernetes_discovery
        assert [(ep.name, ep.spec.namespace, ep.hostport) for ep in app.datastore.endpoints()] == [
            ("vllm-0", "llm", f"127.0.0.1:{sim.port}")]
        async with aiohttp.ClientSession() as session:
            async with session.post(app.gateway.url + "/v1/completions",
                                    json={"model": "m", "prompt": "hello", "max_tokens": 3}) as resp:
                assert resp.status == 200 and (await resp.json())["usage"]["completion_tokens"] == 3
    finally:
        await app.stop()
        await sim.stop()


async def test_watch_file_applies_a_changed_file(tmp_path: Path) -> None:
    path = endpoints_file(tmp_path / "endpoints.yaml", 8001)
    app = EppApp(options(FILE_README.replace("ENDPOINTS_FILE", str(path))))
    try:
        await app.start()
        assert [ep.spec.port for ep in app.datastore.endpoints()] == [8001]
        endpoints_file(path, 8002, 8003)
        await eventually(lambda: sorted(ep.spec.port for ep in app.datastore.endpoints()) == [8002, 8003],
                         timeout=10.0, what="the rewritten endpoints file")
    finally:
        await app.stop()


async def test_the_discovery_plugin_wins_over_an_endpoint_flag(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    configured = endpoints_file(tmp_path / "configured.yaml", 8004)
    flagged = endpoints_file(tmp_path / "flag.yaml", 8005)
    app = EppApp(options(FILE_README.replace("ENDPOINTS_FILE", str(configured)), endpoints_file=str(flagged)))
    try:
        with caplog.at_level(logging.WARNING, logger="epp.runtime.app"):
            await app.start()
        assert [ep.spec.port for ep in app.datastore.endpoints()] == [8004]
        assert "dataLayer.discovery names plugin 'file-discovery', the endpoint source; --endpoints is ignored" \
            in caplog.text
    finally:
        await app.stop()


async def test_an_invalid_endpoints_file_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text("endpoints: [\n")  # the reference's config_reload_test writes this broken file
    app = EppApp(options(RUNNER_TEST.replace("ENDPOINTS_FILE", str(path))))
    with pytest.raises(ConfigError, match="endpoints.yaml"):
        await app.start()
    await app.stop()


@pytest.mark.parametrize("section,field,line,message", [
    ("dataLayer:\n  discovery:\n    pluginRef: queue-scorer\n", "dataLayer.discovery.pluginRef", 6,
     "cannot use plugin 'queue-scorer' (type: queue-scorer): it is not an endpoint discovery plugin"),
    ("dataLayer:\n  discovery:\n    endpoints: {pluginRef: nowhere}\n", "dataLayer.discovery.endpoints.pluginRef",
     6, "references unknown plugin 'nowhere'"),
    ("dataLayer:\n  discovery:\n    pluginRef: fd\n    endpoints: {pluginRef: fd}\n", "dataLayer.discovery", 5,
     "give pluginRef (v1alpha1) or endpoints.pluginRef (v1), not both"),
    ("dataLayer:\n  discovery:\n    endpoints: {pluginRef: fd}\n    peers: {pluginRef: fd}\n",
     "dataLayer.discovery.peers", 7, "EPP has no peer discovery"),
    ("dataLayer:\n  peerDiscovery: {pluginRef: fd}\n", "dataLayer.peerDiscovery", 5, "EPP has no peer discovery"),
    ("dataLayer:\n  crossReplicaSyncerPluginRef: local-syncer\n", "dataLayer.crossReplicaSyncerPluginRef", 5,
     "EPP has no cross-replica state sync"),
    ("dataLayer:\n  crossReplicaSyncInterval: 5ms\n", "dataLayer.crossReplicaSyncInterval", 5,
     "EPP has no cross-replica state sync"),
    ("dataLayer:\n  crossReplica: {syncInterval: 1s}\n", "dataLayer.crossReplica", 5,
     "EPP has no cross-replica state sync"),
    ("dataLayer:\n  discovery:\n    pluginRef: 7\n", "dataLayer.discovery.pluginRef", 6, "string"),
], ids=["not-discovery", "unknown", "both-shapes", "peers", "peer-discovery", "syncer", "sync-interval",
        "cross-replica", "not-a-string"])
def test_discovery_fields_epp_cannot_serve_name_the_field(section: str, field: str, line: int, message: str,
                                                          registry: Registry) -> None:
    text = "plugins:\n- {type: file-discovery, name: fd, parameters: {path: /x}}\n- {type: queue-scorer}\n" + section
    with pytest.raises(ConfigError) as info:
        build(text, registry)
    assert (info.value.field, info.value.line) == (field, line) and message in str(info.value), str(info.value)


def test_file_discovery_needs_a_path(registry: Registry) -> None:
    with pytest.raises(ConfigError, match=r"plugin 'file-discovery' \(type: file-discovery\).*path") as info:
        build("plugins:\n- type: file-discovery\ndataLayer: {discovery: {pluginRef: file-discovery}}\n", registry)
    assert info.value.line == 2
