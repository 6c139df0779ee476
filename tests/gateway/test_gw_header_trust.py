"""Header trust on the HTTP gateway (both front ends and upstream clients; a simulated vLLM server behind a
recording tap): a client's trusted-only headers (model rewrite, data-parallel rank, encoder and prefiller hosts,
subset) and EPP-only ones (destination, served) change nothing and never reach the model server; with the
operator's trust (``--trusted-headers``) the trusted-only ones are honoured; the flag end to end through
``epp serve``'s options."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import aiohttp
import pytest

from epp.cli.main import build_parser
from epp.cli.serve import options_from_args
from epp.config.loader import DEFAULT_CONFIG_TEXT
from epp.framework.request import InferenceRequest
from epp.headers import (
    DATA_PARALLEL_HEADER,
    DESTINATION_HEADER,
    ENCODER_HEADER,
    FAIRNESS_ID_HEADER,
    HEADER_RULES,
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADER,
    PREFILLER_HEADER,
    SERVED_HEADER,
    SUBSET_HEADER,
    HeaderTrust,
    Trust,
    header_names,
)
from epp.runtime.app import EppApp

from .helpers import Stack, Tap, chat, sim, spec_for

ALIAS, TARGET = "alias", "target"  # both served by the simulator; another model name is a 404
ALL_TRUSTED = HeaderTrust(r.name for r in HEADER_RULES if r.trust is Trust.TRUSTED)
SIDECAR = {DATA_PARALLEL_HEADER: "6.6.6.6:1", ENCODER_HEADER: "6.6.6.6:2,6.6.6.6:3", PREFILLER_HEADER: "6.6.6.6:4"}
EPP_ONLY = {name: "6.6.6.6:80" for base in (DESTINATION_HEADER, SERVED_HEADER) for name in header_names(base)}


def spoofed(subset: str = "6.6.6.6") -> dict[str, str]:
    """Every trusted-only and EPP-only header, under every name, as a client (any case) may send them."""
    out = {name.title(): TARGET for name in header_names(MODEL_REWRITE_HEADER)}
    out |= {name.title(): subset for name in header_names(SUBSET_HEADER)}
    return out | {k.title(): v for k, v in (SIDECAR | EPP_ONLY).items()}


async def pool(sims, stack, taps, **kw) -> tuple[Stack, Tap]:  # type: ignore[no-untyped-def]
    [server] = await sims(sim(lora_adapters=[ALIAS, TARGET]))
    tap = await taps(server)
    return await stack(DEFAULT_CONFIG_TEXT, [spec_for(server, port=tap.port)], **kw), tap


async def send(st: Stack, headers: dict[str, str], status: int = 200) -> InferenceRequest | None:
    """POST a chat request for ``ALIAS``; the request as EPP parsed it (None when it was refused before parsing)."""
    done = len(st.recorder.done)
    got, body = await st.post("/v1/chat/completions", chat(max_tokens=2) | {"model": ALIAS}, headers=headers)
    assert got == status, body
    if status == 200:
        assert body["model"] == ALIAS  # the client sees its own model name either way
    return st.recorder.done[-1][0] if len(st.recorder.done) > done else None


async def test_spoofed_trusted_only_and_epp_only_headers_change_nothing(sims, stack, taps) -> None:
    st, tap = await pool(sims, stack, taps)
    tenant = {FAIRNESS_ID_HEADER: "tenant-a", OBJECTIVE_HEADER: "gold"}  # client-settable: read, not forwarded
    request = await send(st, spoofed() | tenant)  # a subset honoured here would leave no endpoint: 503
    assert request is not None
    assert request.target_model == ALIAS and tap.records[-1].body["model"] == ALIAS  # no rewrite
    assert request.fairness_id == "tenant-a" and request.objective == "gold"
    untrusted = {name.lower() for name in spoofed()}
    assert not untrusted & set(request.headers)  # plugins never see them
    forwarded = set(tap.records[-1].headers)
    assert not (untrusted | set(header_names(FAIRNESS_ID_HEADER)) | set(header_names(OBJECTIVE_HEADER))) & forwarded
    assert st.inflight() == 0


async def test_trusted_headers_are_honoured(sims, stack, taps) -> None:
    st, tap = await pool(sims, stack, taps, pd_orchestration=False)  # so a prefiller header is the sidecar's
    st.director.header_trust = ALL_TRUSTED
    request = await send(st, spoofed(subset="127.0.0.1"))
    assert request is not None and request.target_model == TARGET
    record = tap.records[-1]
    assert record.body["model"] == TARGET  # rewritten upstream, restored for the client (send)
    assert {k: record.headers.get(k) for k in SIDECAR} == SIDECAR  # forwarded to the model server's sidecar
    consumed = {*header_names(MODEL_REWRITE_HEADER), *header_names(SUBSET_HEADER), *EPP_ONLY}
    assert not consumed & set(record.headers)  # read by EPP, never forwarded; EPP-only ones never trusted
    await send(st, {SUBSET_HEADER: "6.6.6.6"}, status=503)  # the trusted subset allows no pool endpoint
    await send(st, {SUBSET_HEADER: "127.0.0.1:1"})  # subsets match by IP, as Envoy's subset hint


async def test_trusting_one_header_leaves_the_others_stripped(sims, stack, taps) -> None:
    st, tap = await pool(sims, stack, taps, pd_orchestration=False)
    st.director.header_trust = HeaderTrust([DATA_PARALLEL_HEADER])
    request = await send(st, spoofed())  # the untrusted subset is ignored: routed, not 503
    assert request is not None and request.target_model == ALIAS
    headers = tap.records[-1].headers
    assert headers[DATA_PARALLEL_HEADER] == SIDECAR[DATA_PARALLEL_HEADER]
    assert ENCODER_HEADER not in headers and PREFILLER_HEADER not in headers


@pytest.mark.parametrize("trusted", [[], ["--trusted-headers", "X-Gateway-Model-Name-Rewrite"]],
                         ids=["default", "trusted"])
async def test_the_flag_reaches_the_gateway_of_epp_serve(sims, tmp_path: Path, trusted: list[str]) -> None:
    [server] = await sims(sim())  # serves only the default model: an unrewritten "alias" is a 404 there
    args = build_parser().parse_args(["serve", "--http-port", "0", "--grpc-port", "-1", "--metrics-port", "-1",
                                      "--host", "127.0.0.1", *trusted])
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(f"endpoints:\n  - name: sim\n    address: 127.0.0.1\n    port: {server.port}\n")
    app = EppApp(dataclasses.replace(options_from_args(args), endpoints_file=str(endpoints), health_port=0))
    await app.start()
    try:
        await app.wait_ready()
        async with aiohttp.ClientSession() as session:
            async with session.post(app.gateway.url + "/v1/chat/completions",
                                    json=chat(max_tokens=2) | {"model": ALIAS},
                                    headers={MODEL_REWRITE_HEADER: server.cfg.model}) as resp:
                assert resp.status == (200 if trusted else 404), await resp.text()
    finally:
        await app.stop()


@pytest.mark.parametrize("value", ["x-gateway-destination-endpoint", "x-llm-d-router-inference-fairness-id",
                                   "x-no-such-header"])
def test_the_flag_refuses_headers_that_are_not_trusted_only(capsys, value: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--trusted-headers", value])
    assert f"--trusted-headers: {value!r}" in capsys.readouterr().err
