"""InferenceObjectives and InferenceModelRewrites from Kubernetes (``v1alpha2`` in ``llm-d.ai`` and in
``inference.networking.x-k8s.io``).

Driven through the real ``kubernetes_asyncio`` client. Tests marked ``k8s_real`` also run against the cluster of
``$KUBECONFIG`` (skipped there when the group's v1alpha2 CRDs are not installed); the others inject faults only
the fake API server offers (a CRD that is not installed yet, 410 Gone). The last test runs ``epp serve``'s composition
(:class:`epp.runtime.app.EppApp`) over the fake cluster and simulated vLLM servers, with the official ``openai`` client.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import openai
import pytest

from epp.datalayer.datastore import Datastore
from epp.datalayer.kubernetes import KubernetesDiscovery, WatchOptions
from epp.framework.objectives import OBJECTIVE_PLURAL, POLICY_GROUPS, POLICY_VERSION, REWRITE_PLURAL
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimPool

from ..conftest import eventually
from .fake_kube import FakeKube

FAST = WatchOptions(watch_timeout=5.0, read_margin=5.0, request_timeout=5.0, backoff_initial=0.02,
                    backoff_max=0.2)
APP = {"app": "vllm"}
LLMD, GIE = POLICY_GROUPS


def stored(plural: str, group: str) -> str:
    """The fake API server's name for a policy resource of ``group``."""
    return f"{plural}.llm-d.ai" if group == LLMD else plural


def exact(model: str, *targets: tuple[str, int | None]) -> dict[str, Any]:
    """A rewrite rule in the CRD's shape: ``model`` (exact) to weighted targets."""
    return {"matches": [{"model": {"value": model}}],
            "targets": [{"modelRewrite": m, **({} if w is None else {"weight": w})} for m, w in targets]}


def target_of(ds: Datastore, model: str) -> str | None:
    decision = ds.rewrites.rule_for(model)
    return None if decision is None else decision.rule.targets[0].model


@pytest.fixture(params=POLICY_GROUPS)
def group(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def policies_installed(cluster, group) -> None:
    """On a real cluster, skip unless the group's v1alpha2 CRDs are installed."""
    if cluster.fake is not None:
        return
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        for plural in (OBJECTIVE_PLURAL, REWRITE_PLURAL):
            await cluster.custom.list_namespaced_custom_object(group, POLICY_VERSION, cluster.namespace, plural)
    except ApiException as exc:
        if exc.status == 404:
            pytest.skip(f"the InferenceObjective / InferenceModelRewrite CRDs of {group} are not installed")
        raise


@pytest.fixture
async def discovery(datastore, cluster) -> AsyncIterator[KubernetesDiscovery]:
    await cluster.create_pool("pool", APP, [8000])
    await cluster.create_pod("a", APP, "10.5.0.1")
    d = KubernetesDiscovery(datastore, namespace=cluster.namespace, pool_name="pool", kubeconfig=cluster.kubeconfig,
                            options=FAST)
    await d.start()
    await eventually(lambda: datastore.synced.is_set(), what="pool synced")
    yield d
    await d.stop()


@pytest.mark.k8s_real
async def test_objectives_follow_the_cluster(cluster, datastore, discovery, group, policies_installed):
    await cluster.apply_objective("interactive", "pool", 10, group=group)
    await cluster.apply_objective("unset", "pool", None, group=group)
    await cluster.apply_objective("elsewhere", "other-pool", 99, group=group)
    await eventually(lambda: datastore.objectives.priority("interactive") == 10, what="objective added")
    await eventually(lambda: datastore.objectives.priority("unset") == 0, what="objective without priority")
    assert datastore.objectives.priority("elsewhere") is None  # names another pool
    await cluster.apply_objective("interactive", "pool", -1, group=group)
    await eventually(lambda: datastore.objectives.priority("interactive") == -1, what="priority changed")
    await cluster.apply_objective("interactive", "other-pool", 5, group=group)
    await eventually(lambda: datastore.objectives.priority("interactive") is None, what="moved to another pool")
    await cluster.delete_policy(OBJECTIVE_PLURAL, "unset", group=group)
    await eventually(lambda: datastore.objectives.priority("unset") is None, what="objective deleted")


@pytest.mark.k8s_real
async def test_model_rewrites_follow_the_cluster(cluster, datastore, discovery, group, policies_installed):
    await cluster.apply_rewrite("canary", "pool", [exact("llama", ("llama-v2", 90), ("llama-v3", 10))], group=group)
    await cluster.apply_rewrite("fallback", "pool", [{"targets": [{"modelRewrite": "default-model"}]}], group=group)
    await cluster.apply_rewrite("foreign", "other-pool", [exact("mistral", ("x", None))], group=group)
    await eventually(lambda: target_of(datastore, "llama") == "llama-v2", what="exact rule")
    await eventually(lambda: target_of(datastore, "mistral") == "default-model", what="generic rule")
    decision = datastore.rewrites.rule_for("llama")
    assert decision is not None and decision.rewrite_name == "canary"
    assert [(t.model, t.weight) for t in decision.rule.targets] == [("llama-v2", 90), ("llama-v3", 10)]
    await cluster.apply_rewrite("canary", "pool", [exact("llama", ("llama-v4", None))], group=group)
    await eventually(lambda: target_of(datastore, "llama") == "llama-v4", what="rule changed")
    await cluster.delete_policy(REWRITE_PLURAL, "canary", group=group)
    await eventually(lambda: target_of(datastore, "llama") == "default-model", what="exact rule deleted")


async def test_llm_d_group_wins_a_shared_name_and_the_other_group_still_applies(cluster, datastore, discovery):
    await cluster.apply_objective("chat", "pool", 1, group=GIE)
    await cluster.apply_objective("batch", "pool", -1, group=GIE)
    await cluster.apply_objective("chat", "pool", 9, group=LLMD)
    await eventually(lambda: datastore.objectives.priority("chat") == 9, what="llm-d.ai wins")
    await eventually(lambda: datastore.objectives.priority("batch") == -1, what="legacy group read")
    await cluster.apply_rewrite("split", "pool", [exact("m", ("from-gie", None))], group=GIE)
    await cluster.apply_rewrite("split", "pool", [exact("m", ("from-llm-d", None))], group=LLMD)
    await eventually(lambda: target_of(datastore, "m") == "from-llm-d", what="llm-d.ai rewrite wins")
    await cluster.delete_policy(OBJECTIVE_PLURAL, "chat", group=LLMD)
    await cluster.delete_policy(REWRITE_PLURAL, "split", group=LLMD)
    await eventually(lambda: datastore.objectives.priority("chat") == 1, what="the legacy objective shows again")
    await eventually(lambda: target_of(datastore, "m") == "from-gie", what="the legacy rewrite shows again")


async def test_a_missing_crd_does_not_block_readiness_and_is_picked_up_once_installed(
        cluster, datastore, fake_kube, caplog):
    fake_kube.missing = {stored(p, g) for p in (OBJECTIVE_PLURAL, REWRITE_PLURAL) for g in POLICY_GROUPS}
    await cluster.create_pool("pool", APP, [8000])
    await cluster.create_pod("a", APP, "10.5.0.1")
    d = KubernetesDiscovery(datastore, namespace=cluster.namespace, pool_name="pool", kubeconfig=cluster.kubeconfig,
                            options=FAST)
    with caplog.at_level(logging.INFO, logger="epp.datalayer.kubernetes"):
        await d.start()
        try:
            await eventually(lambda: datastore.synced.is_set(), what="ready without the CRDs")
            missing = stored(OBJECTIVE_PLURAL, LLMD)
            await eventually(lambda: fake_kube.requests[("list", missing)] >= 3, what="list retried")
            notes = [r for r in caplog.records if "InferenceObjective.llm-d.ai" in r.getMessage()]
            assert len(notes) == 1 and "not installed" in notes[0].getMessage()  # once, not per retry
            assert notes[0].levelno == logging.INFO  # most clusters have one group only: not a warning
            fake_kube.missing.discard(missing)  # llm-d's CRD gets installed
            fake_kube.create(missing, "default", {"metadata": {"name": "chat"},
                                                  "spec": {"poolRef": {"name": "pool"}, "priority": 7}})
            await eventually(lambda: datastore.objectives.priority("chat") == 7, what="objective after install")
        finally:
            await d.stop()


async def test_410_gone_relists_the_rewrites(cluster, datastore, discovery, fake_kube):
    await cluster.apply_rewrite("keep", "pool", [exact("a", ("a2", None))])
    await cluster.apply_rewrite("gone", "pool", [exact("b", ("b2", None))])
    await eventually(lambda: target_of(datastore, "b") == "b2", what="initial rules")
    relists = discovery.relists
    await fake_kube.stop()  # changes EPP cannot see, and the history that would tell it expires
    fake_kube.delete(stored(REWRITE_PLURAL, LLMD), "default", "gone")
    fake_kube.create(stored(REWRITE_PLURAL, LLMD), "default", {"metadata": {"name": "new"}, "spec": {
        "poolRef": {"name": "pool"}, "rules": [exact("c", ("c2", None))]}})
    fake_kube.compact()
    await fake_kube.start()
    await eventually(lambda: discovery.relists > relists, what="410 led to a re-list")
    await eventually(lambda: target_of(datastore, "c") == "c2" and target_of(datastore, "b") is None,
                     what="state after the re-list")
    assert target_of(datastore, "a") == "a2"


# -- epp serve over the fake cluster -------------------------------------------------------------------------


async def test_serve_applies_cluster_rewrites_and_objectives(fake_kube: FakeKube, tmp_path: Path) -> None:
    async with SimPool([SimConfig(model="llama-v2", time_scale=0.01, seed=i) for i in range(2)]) as pool:
        ports = [s.port for s in pool.servers]
        fake_kube.create("inferencepools", "default", {"metadata": {"name": "pool"}, "spec": {
            "selector": {"matchLabels": APP}, "targetPorts": [{"number": p} for p in ports]}})
        fake_kube.create("pods", "default", {"metadata": {"name": "vllm-0", "labels": APP},
                                             "spec": {"containers": [{"name": "s", "image": "i"}]}})
        fake_kube.patch("pods", "default", "vllm-0", {"status": {
            "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}, subresource="status")
        fake_kube.create(REWRITE_PLURAL, "default", {"metadata": {"name": "alias"}, "spec": {
            "poolRef": {"name": "pool"}, "rules": [exact("llama", ("llama-v2", None))]}})
        fake_kube.create(stored(OBJECTIVE_PLURAL, LLMD), "default", {
            "metadata": {"name": "batch"}, "spec": {"poolRef": {"name": "pool"}, "priority": -3}})
        options = ServeOptions(pool_name="pool", kubeconfig=str(fake_kube.kubeconfig(tmp_path / "kubeconfig")),
                               host="127.0.0.1", grpc_port=None, health_port=None, metrics_port=0, http_port=0)
        app = EppApp(options)
        await app.start()
        try:
            await app.wait_ready()
            await eventually(lambda: target_of(app.datastore, "llama") == "llama-v2", what="rewrite loaded")
            await eventually(lambda: app.datastore.objectives.priority("batch") == -3, what="objective loaded")
            client = openai.AsyncOpenAI(base_url=app.gateway.url + "/v1", api_key="unused", max_retries=0)
            try:
                chat = await client.chat.completions.create(
                    model="llama", messages=[{"role": "user", "content": "hello"}], max_tokens=4,
                    extra_headers={"x-gateway-inference-objective": "batch"})
                stream = await client.chat.completions.create(
                    model="llama", messages=[{"role": "user", "content": "hello"}], max_tokens=4, stream=True)
                streamed = [c async for c in stream]
            finally:
                await client.close()
            assert chat.model == "llama"  # served by llama-v2, shown to the client under the name it asked for
            assert chat.usage is not None and chat.usage.completion_tokens == 4
            assert streamed and all(c.model == "llama" for c in streamed)
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as resp:
                    text = await resp.text()
            assert ('inference_extension_model_rewrite_decisions_total{model_name="llama",'
                    'model_rewrite_name="alias",target_model="llama-v2"} 2.0') in text
            assert ('inference_objective_request_total{model_name="llama",priority="-3",'
                    'target_model_name="llama-v2"} 1.0') in text
            assert ('llm_d_epp_model_rewrite_decisions_total{model_name="llama",'
                    'model_rewrite_name="alias",target_model="llama-v2"} 2.0') in text
            assert ('llm_d_epp_request_total{fairness_id="default-flow",model_name="llama",priority="-3",'
                    'target_model_name="llama-v2"} 1.0') in text
        finally:
            await app.stop()
