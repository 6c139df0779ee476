"""data-parallel-profile-handler: the rank header, the primary port, load kept on the rank endpoint."""

from __future__ import annotations

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.errors import ConfigError, SchedulingFailed
from epp.framework.endpoint import EndpointSpec, Metrics
from epp.framework.plugins import CycleState, Handle, ResponseInfo
from epp.plugins.profiles.data_parallel import DataParallelProfileHandler
from epp.scheduling.director import Director

from .helpers import make, registry, req

DP_CONFIG = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: data-parallel-profile-handler
  parameters: {primaryPort: 8000}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
"""


def _dp_director() -> Director:
    pipeline = build_pipeline(*load_raw(DP_CONFIG, "<dp>"), registry())
    store = Datastore()
    store.replace_all([EndpointSpec(f"pod-{p}-rank-{i}", f"10.0.0.{p + 1}", 8100 + i) for p in range(2)
                       for i in range(2)])
    for e in store.endpoints():
        e.metrics = Metrics(waiting=0 if e.name == "pod-1-rank-1" else 5, update_time=1e12)
    store.mark_synced()
    return Director(pipeline, store)


async def test_data_parallel_routes_through_the_primary_port_with_the_rank_header() -> None:
    director = _dp_director()
    ctx = await director.route(req("hello"))
    rank = director.datastore.get("pod-1-rank-1")
    assert ctx.target.hostport == "10.0.0.2:8000" and ctx.target.name == "pod-1-rank-1"
    assert ctx.upstream_headers == {"x-data-parallel-host-port": "10.0.0.2:8101"}
    assert rank.inflight_requests == 1 and ctx.target.inflight_requests == 0    # load stays on the rank
    director.response_complete(ctx, ResponseInfo())
    assert rank.inflight_requests == 0 and rank.inflight_tokens == 0


@pytest.mark.parametrize("raw,message", [({"primaryPort": 0}, "primaryPort"), ({"primaryPort": 70000}, "primaryPort")],
                         ids=["zero", "too-big"])
def test_data_parallel_bad_port(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        registry().create("data-parallel-profile-handler", "dp", raw, Handle())
    assert info.value.plugin == "dp"


def test_data_parallel_needs_one_profile_and_a_result() -> None:
    handler = make(DataParallelProfileHandler)
    assert handler.params.primary_port == 8000
    with pytest.raises(ConfigError, match="exactly one scheduling profile"):
        handler.check_profiles({"a": object(), "b": object()})
    with pytest.raises(SchedulingFailed, match="failed to run scheduler profile 'a'"):
        handler.process_results(CycleState(), req(), {"a": None})
