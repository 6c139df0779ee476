"""The current reference's ``--emit-endpoint-scores`` (scores in ``envoy.lb``) and ``--tls-min-version`` /
``--tls-cipher-suites`` (the ext_proc port's TLS policy), on real servers and real TLS handshakes."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator

import pytest

from epp.config.tls import TlsPolicy, parse_cipher_suites, parse_tls_version
from epp.extproc import ExtProcServer
from epp.extproc.protocol import DESTINATION_KEYS, LB_NAMESPACE, SCORES_KEY

from .helpers import CHAT, make_director, request_body, request_headers, specs

QUEUE_ONLY = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: max-score-picker
"""


def _director():  # type: ignore[no-untyped-def]
    return make_director(specs(3), QUEUE_ONLY, waiting={"ep0": 0, "ep1": 5, "ep2": 10})


async def _lb_fields(client) -> dict:  # type: ignore[no-untyped-def]
    replies = await client.exchange([request_headers(), request_body(CHAT)], 1)
    return dict(replies[0].dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields)


async def test_scores_of_every_scored_candidate_go_into_envoy_lb(serve) -> None:
    _, client = await serve(_director(), emit_scores=True)
    fields = await _lb_fields(client)
    scores = {k: v.number_value for k, v in fields[SCORES_KEY].struct_value.fields.items()}
    # queue-scorer (weight 2): (max - q) / (max - min) -> 1, 0.5, 0 for queues 0, 5, 10; the struct holds the
    # candidates the picker did not choose too, while the destination keys are unchanged
    assert scores == {"10.0.0.1:8000": 2.0, "10.0.0.2:8000": 1.0, "10.0.0.3:8000": 0.0}
    assert all(fields[key].string_value.split(",")[0] == "10.0.0.1:8000" for key in DESTINATION_KEYS)


async def test_no_scores_key_unless_asked(serve) -> None:
    _, client = await serve(_director())
    fields = await _lb_fields(client)
    assert SCORES_KEY not in fields and all(key in fields for key in DESTINATION_KEYS)


def _client_context(*, max_version: ssl.TLSVersion | None = None, ciphers: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    if max_version is not None:
        ctx.maximum_version = max_version
    if ciphers is not None:
        ctx.set_ciphers(ciphers)
    return ctx


async def _handshake(port: int, ctx: ssl.SSLContext) -> tuple[str, str] | None:
    """(TLS version, cipher) the server agreed to, or None if it refused the handshake."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    except (ssl.SSLError, ConnectionResetError):
        return None
    obj = writer.get_extra_info("ssl_object")
    result = (obj.version(), obj.cipher()[0])
    writer.close()
    return result


@contextlib.asynccontextmanager
async def _tls_server(policy: TlsPolicy) -> AsyncIterator[ExtProcServer]:
    """A native-transport server with a generated (ECDSA P-256) certificate under ``policy``."""
    server = ExtProcServer(make_director(specs(1)), host="127.0.0.1", port=0, health_port=None, tls_policy=policy)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0)


async def test_a_minimum_tls_version_refuses_older_clients() -> None:
    async with _tls_server(TlsPolicy(parse_tls_version("VersionTLS13"), None)) as server:
        assert await _handshake(server.port, _client_context(max_version=ssl.TLSVersion.TLSv1_2)) is None
        assert (await _handshake(server.port, _client_context()) or ("",))[0] == "TLSv1.3"


async def test_cipher_suites_restrict_tls_1_2() -> None:
    ciphers = parse_cipher_suites(["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", " ", "TLS_AES_256_GCM_SHA384"])
    assert ciphers == "ECDHE-ECDSA-AES128-GCM-SHA256"  # TLS 1.3 suites are not configurable, blanks are skipped
    tls12 = ssl.TLSVersion.TLSv1_2
    async with _tls_server(TlsPolicy(None, ciphers)) as server:
        assert await _handshake(server.port, _client_context(max_version=tls12)) == (
            "TLSv1.2", "ECDHE-ECDSA-AES128-GCM-SHA256")
        assert await _handshake(server.port, _client_context(max_version=tls12,
                                                             ciphers="ECDHE-ECDSA-AES256-GCM-SHA384")) is None


def test_grpcio_cannot_take_a_tls_policy() -> None:
    with pytest.raises(ValueError, match="native ext_proc transport"):
        ExtProcServer(make_director(specs(1)), transport="grpcio", tls_policy=TlsPolicy(ssl.TLSVersion.TLSv1_3))


@pytest.mark.parametrize(("names", "message"), [
    (["TLS_FOO"], "unknown cipher suite 'TLS_FOO'"),
    (["TLS_RSA_WITH_RC4_128_SHA"], "not available in this build's OpenSSL"),
])
def test_bad_cipher_suites_are_named(names: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cipher_suites(names)
