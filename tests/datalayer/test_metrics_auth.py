"""``--metrics-endpoint-auth``: the metrics port asks the API server (TokenReview, then SubjectAccessReview on the
non-resource URL) before answering, as the reference's controller-runtime filter; answers are cached."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions

from .fake_kube import FakeKube
from .fake_kube_auth import AuthReviews


@pytest.fixture
async def auth_kube() -> AsyncIterator[tuple[FakeKube, AuthReviews]]:
    fake = FakeKube()
    reviews = AuthReviews(fake)
    await fake.start()
    yield fake, reviews
    await fake.stop()


@pytest.fixture
async def app(auth_kube: tuple[FakeKube, AuthReviews], tmp_path: Path) -> AsyncIterator[EppApp]:
    fake, _ = auth_kube
    options = ServeOptions(endpoints=[EndpointSpec(name="a", address="127.0.0.1", port=9)], host="127.0.0.1",
                           grpc_port=None, health_port=None, metrics_port=0, metrics_auth=True,
                           kubeconfig=str(fake.kubeconfig(tmp_path / "kubeconfig")))
    epp = EppApp(options)
    await epp.start()
    yield epp
    await epp.stop()


async def get(app: EppApp, token: str | None, path: str = "/metrics") -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{app.metrics_port}{path}", headers=headers) as resp:
            return resp.status, await resp.text()


async def test_only_an_authenticated_and_authorized_token_reads_metrics(
        app: EppApp, auth_kube: tuple[FakeKube, AuthReviews]) -> None:
    fake, reviews = auth_kube
    reviews.add_token("prom-token", "system:serviceaccount:monitoring:prometheus")
    reviews.add_token("other-token", "system:serviceaccount:default:other")
    reviews.grant("system:serviceaccount:monitoring:prometheus", "/metrics")
    assert (await get(app, None))[0] == 401
    async with aiohttp.ClientSession() as session:  # not a bearer token
        async with session.get(f"http://127.0.0.1:{app.metrics_port}/metrics",
                               headers={"Authorization": "Basic dXNlcjpwdw=="}) as resp:
            assert resp.status == 401
    assert (await get(app, "forged"))[0] == 401
    status, text = await get(app, "other-token")
    assert status == 403 and "system:serviceaccount:default:other" in text
    status, text = await get(app, "prom-token")
    assert status == 200 and "inference_pool_ready_pods" in text
    # The grant covers /metrics only: the debug path needs its own.
    assert (await get(app, "prom-token", "/debug/tenants"))[0] == 403


async def test_answers_are_cached_and_the_api_server_going_away_keeps_cached_grants(
        app: EppApp, auth_kube: tuple[FakeKube, AuthReviews]) -> None:
    fake, reviews = auth_kube
    reviews.add_token("prom-token", "prometheus")
    reviews.add_token("late-token", "late")
    reviews.grant("group:system:authenticated", "/metrics")
    for _ in range(3):
        assert (await get(app, "prom-token"))[0] == 200
    assert fake.requests[("create", "tokenreviews")] == 1
    assert fake.requests[("create", "subjectaccessreviews")] == 1
    await fake.stop()  # within the cache TTLs, a known token still reads; an unknown one cannot be checked
    assert (await get(app, "prom-token"))[0] == 200
    assert (await get(app, "late-token"))[0] == 401
    await fake.start()
    assert (await get(app, "late-token"))[0] == 200
