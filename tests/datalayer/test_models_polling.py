"""``models-data-source`` polling real servers on 127.0.0.1: simulated vLLM servers (whose LoRA adapters are loaded
and unloaded through vLLM's API), and ``/v1/models`` servers that fail (500, garbage, no answer, gone, TLS).

The attribute must follow each server's list; a failing endpoint keeps what it had (nothing, or its last good list),
as the reference's source leaves the extractor uncalled, and never holds up the others."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.datalayer.models import stored_models
from epp.extproc.tls import self_signed
from epp.framework.endpoint import Endpoint, EndpointSpec
from epp.runtime.builtins import default_registry
from epp_sim import SimConfig, SimServer

from ..conftest import Servers, eventually
from .models_server import ModelsServer

TICK = 0.01  # the refresh tick the sources are rounded to in these tests: a poll every 10 ms


@pytest.fixture(scope="module")
def registry():
    return default_registry(entry_points=False)


@pytest.fixture
def sims(servers: Servers) -> Callable[..., Awaitable[SimServer]]:
    """``await sims(**SimConfig fields)`` -> a started simulator with LoRA enabled; stopped after."""

    async def start(**fields) -> SimServer:
        return await servers.start(SimServer(SimConfig(time_scale=0.002, enable_lora=True, **fields)), "127.0.0.1", 0)

    return start


@pytest.fixture
def models_servers(servers: Servers) -> Callable[..., Awaitable[ModelsServer]]:
    """``await models_servers(ssl_context=None)`` -> a started ModelsServer; stopped after."""

    async def start(ssl_context: ssl.SSLContext | None = None) -> ModelsServer:
        return await servers.start(ModelsServer(ssl_context))

    return start


@pytest.fixture
def sources(registry, servers: Servers) -> Callable[..., Awaitable]:
    """``await sources(datastore, params_yaml)``: a started models source (with its extractor) from a config."""

    async def start(datastore: Datastore, params: str = ""):
        text = "plugins:\n- type: models-data-source\n" + (f"  parameters: {params}\n" if params else "")
        pipeline = build_pipeline(*load_raw(text + "- type: models-data-extractor\n"), registry)
        src = pipeline.handle.plugin("models-data-source")
        src.use_base_tick(TICK)
        return await servers.start(src, datastore)

    return start


def ids(ep: Endpoint) -> list[str] | None:
    models = stored_models(ep)
    return None if models is None else [m.id for m in models]


async def lora(server: SimServer, action: str, name: str) -> None:
    body = {"lora_name": name, "lora_path": f"/adapters/{name}"} if action == "load" else {"lora_name": name}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{server.url}/v1/{action}_lora_adapter", json=body) as resp:
            assert resp.status == 200, await resp.text()


def spec(name: str, port: int, **kw) -> EndpointSpec:
    return EndpointSpec(name, "127.0.0.1", port, **kw)


async def test_each_endpoint_gets_its_list_and_it_follows_lora_adapters(datastore, sims, sources):
    a, b = await sims(), await sims(lora_adapters=["sql"])
    datastore.replace_all([spec("a", a.port), spec("b", b.port)])
    await sources(datastore)
    ep_a, ep_b = datastore.get("a"), datastore.get("b")
    await eventually(lambda: ids(ep_a) == ["sim-model"] and ids(ep_b) == ["sim-model", "sql"], what="lists")
    assert stored_models(ep_b)[1].parent == "sim-model" and stored_models(ep_b)[0].parent == ""

    await lora(a, "load", "legal")
    await eventually(lambda: ids(ep_a) == ["sim-model", "legal"], what="a loaded adapter listed")
    assert stored_models(ep_a)[1].parent == "sim-model" and ids(ep_b) == ["sim-model", "sql"]
    await lora(b, "unload", "sql")
    await eventually(lambda: ids(ep_b) == ["sim-model"], what="an unloaded adapter gone")
    assert ids(ep_a) == ["sim-model", "legal"]


async def test_an_added_endpoint_is_polled_and_a_removed_one_is_dropped(datastore, sims, sources):
    a, b = await sims(), await sims()
    datastore.replace_all([spec("a", a.port)])
    src = await sources(datastore)
    ep_b = datastore.upsert(spec("b", b.port))
    await eventually(lambda: ids(ep_b) == ["sim-model"], what="the new endpoint's list")
    datastore.remove("b")
    await eventually(lambda: not src.poller.polling(ep_b), what="its loop stopped")
    assert src.poller.polling(datastore.get("a"))


async def test_a_moved_metrics_port_is_followed(datastore, models_servers, sources):
    """Discovery retags an endpoint (same address and port, new ``metricsPort``): the kept-alive connection to
    the old place is dropped and the next poll goes to the new one."""
    first, second = await models_servers(), await models_servers()
    first.serve("from-first")
    second.serve("from-second")
    ep = datastore.upsert(spec("s", first.port))
    await sources(datastore)
    await eventually(lambda: ids(ep) == ["from-first"], what="the first list")
    assert datastore.upsert(spec("s", first.port, metrics_port=second.port)) is ep
    await eventually(lambda: ids(ep) == ["from-second"], what="the list from the new metrics port")


async def test_failing_endpoints_get_no_list_and_do_not_hold_up_the_others(datastore, sims, models_servers, sources):
    sim = await sims()
    broken, garbage, hung = await models_servers(), await models_servers(), await models_servers()
    broken.mode, broken.status, garbage.mode, hung.mode = "status", 500, "garbage", "hang"
    datastore.replace_all([spec("sim", sim.port), spec("500", broken.port), spec("garbage", garbage.port),
                           spec("hung", hung.port), spec("gone", 1)])
    src = await sources(datastore)
    eps = {ep.name: ep for ep in datastore.endpoints()}
    await eventually(lambda: ids(eps["sim"]) == ["sim-model"], what="the good endpoint's list")
    await lora(sim, "load", "legal")  # while the hung endpoint's polls wait out their timeout
    await eventually(lambda: ids(eps["sim"]) == ["sim-model", "legal"], what="the good endpoint keeps up")
    await eventually(lambda: src.poller.last_error(eps["hung"]) == "timed out", what="the hung poll timed out")
    errors = {name: src.poller.last_error(ep) for name, ep in eps.items()}
    assert errors["sim"] is None and errors["500"] == "HTTP 500" and "not JSON" in errors["garbage"]
    assert "cannot connect" in errors["gone"]
    for name in ("500", "garbage", "hung", "gone"):
        assert stored_models(eps[name]) is None and src.poller.failures(eps[name]) >= 1, name
    assert src.poller.stats.failed >= 4 and src.poller.stats.ok >= 2


@pytest.mark.parametrize("mode", ["status", "garbage", "hang"])
async def test_a_failing_poll_keeps_the_last_good_list(datastore, models_servers, sources, mode):
    server = await models_servers()
    server.serve("base", "adapter-1")
    datastore.replace_all([spec("s", server.port)])
    src = await sources(datastore)
    ep = datastore.get("s")
    await eventually(lambda: ids(ep) == ["base", "adapter-1"], what="the first list")
    server.mode, server.status = mode, 503
    failures = src.poller.stats.failed
    await eventually(lambda: src.poller.stats.failed > failures, timeout=5, what="a failed poll")
    assert ids(ep) == ["base", "adapter-1"]
    server.serve("base")
    await eventually(lambda: ids(ep) == ["base"], what="the recovered list")
    assert src.poller.failures(ep) == 0 and src.poller.last_error(ep) is None


async def test_interval_spaces_the_polls(datastore, models_servers, sources):
    """With ``interval: 1h`` each endpoint is polled once at start, then not again within the test."""
    server = await models_servers()
    server.serve("base")
    datastore.replace_all([spec("s", server.port)])
    src = await sources(datastore, "{interval: 1h}")
    await eventually(lambda: ids(datastore.get("s")) == ["base"], what="the first poll")
    server.serve("base", "late-adapter")
    other = await models_servers()
    other.serve("x")
    ep = datastore.upsert(spec("t", other.port))  # a later endpoint is polled at once, on its own schedule
    await eventually(lambda: ids(ep) == ["x"], what="the added endpoint's first poll")
    assert server.hits == 1 and ids(datastore.get("s")) == ["base"] and src.interval == 3600


# ------------------------------------------------------------------ TLS


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, Path]:
    """A self-signed server pair and a self-signed client pair, as files."""
    files = {}
    for who in ("server", "client"):
        pair = self_signed()
        files[f"{who}.crt"], files[f"{who}.key"] = tmp_path / f"{who}.crt", tmp_path / f"{who}.key"
        files[f"{who}.crt"].write_bytes(pair.cert_pem)
        files[f"{who}.key"].write_bytes(pair.key_pem)
    return files


def server_tls(certs: dict[str, Path], require_client: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs["server.crt"], certs["server.key"])
    if require_client:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(certs["client.crt"])
    return ctx


@pytest.mark.parametrize("params, works", [
    ("{scheme: https}", True),
    ("{scheme: https, insecureSkipVerify: true}", True),
    ("{scheme: https, insecureSkipVerify: false}", False),
    ("{scheme: https, insecureSkipVerify: false, caCertPath: '%(server.crt)s'}", True),
    ("{scheme: https, insecureSkipVerify: false, caCertPath: '%(client.crt)s'}", False),
    ("{scheme: http}", False),
], ids=["default-skips-verify", "skip-verify", "verify-without-ca", "verify-with-ca", "verify-with-wrong-ca",
        "plain-http"])
async def test_https_with_a_self_signed_certificate(datastore, models_servers, sources, certs, params, works):
    server = await models_servers(server_tls(certs))
    server.serve("secure-model")
    datastore.replace_all([spec("s", server.port)])
    src = await sources(datastore, params % {k: str(v) for k, v in certs.items()})
    ep = datastore.get("s")
    if works:
        await eventually(lambda: ids(ep) == ["secure-model"], what="the list over TLS")
        return
    await eventually(lambda: src.poller.failures(ep) >= 2, what="failed polls")
    assert stored_models(ep) is None
    if "insecureSkipVerify: false" in params:
        assert "CERTIFICATE_VERIFY_FAILED" in src.poller.last_error(ep)


@pytest.mark.parametrize("with_client_cert", [True, False], ids=["client-cert", "no-client-cert"])
async def test_mtls_client_certificate(datastore, models_servers, sources, certs, with_client_cert):
    server = await models_servers(server_tls(certs, require_client=True))
    server.serve("mtls-model")
    datastore.replace_all([spec("s", server.port)])
    client = f", clientCertPath: '{certs['client.crt']}', clientKeyPath: '{certs['client.key']}'"
    src = await sources(datastore, "{scheme: https, insecureSkipVerify: false, caCertPath: '%s'%s}" % (
        certs["server.crt"], client if with_client_cert else ""))
    ep = datastore.get("s")
    if with_client_cert:
        await eventually(lambda: ids(ep) == ["mtls-model"], what="the list over mTLS")
    else:
        await eventually(lambda: src.poller.failures(ep) >= 2, what="refused without a client certificate")
        assert stored_models(ep) is None


async def test_an_endpoint_declared_https_is_polled_over_tls(datastore, models_servers, sources, certs):
    """As the metrics scraper: the source says http, the endpoints file says the server only speaks TLS."""
    server = await models_servers(server_tls(certs))
    server.serve("tls-only")
    datastore.replace_all([spec("s", server.port, scheme="https")])
    await sources(datastore)
    await eventually(lambda: ids(datastore.get("s")) == ["tls-only"], what="polled over TLS")
