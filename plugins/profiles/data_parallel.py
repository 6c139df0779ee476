"""``data-parallel-profile-handler`` (deprecated): one profile, routed through the pod's primary port.

For vLLM data parallelism behind a routing sidecar: each DP rank is an endpoint ``<pod>-rank-<i>`` on its own port,
but the request must enter the pod on ``primaryPort``. After the single profile ran, ``x-data-parallel-host-port``
is set on the upstream request to the chosen rank's ``address:port`` and every chosen endpoint is replaced by the
same endpoint on ``primaryPort``. In-flight counts still go to the rank endpoint. It needs exactly one scheduling
profile (checked when the config loads); a profile that found no endpoint fails the request (429).

YAML::

    - type: data-parallel-profile-handler
      parameters:
        primaryPort: 8000
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar, Mapping

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, ProfileHandler, ProfileRunResult, SchedulingResult
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

from .single_profile import SingleProfileHandler

__all__ = ["DATA_PARALLEL_HEADER", "DataParallelProfileHandler", "PrimaryPortEndpoint", "route_to_primary_port"]

DATA_PARALLEL_HEADER = "x-data-parallel-host-port"


class PrimaryPortEndpoint(Endpoint):
    """A rank endpoint readdressed to its pod's primary port. Same name, labels and metrics; in-flight counts
    are kept on the rank endpoint (:attr:`rank`), which is the one discovery, scraping and scorers know."""

    __slots__ = ("rank",)

    def __init__(self, rank: Endpoint, port: int) -> None:
        super().__init__(replace(rank.spec, port=port), rank.metrics)
        self.rank = rank
        self.healthy = rank.healthy

    def add_inflight(self, tokens: int, requests: int = 1) -> None:
        self.rank.add_inflight(tokens, requests)

    def release_inflight(self, tokens: int, requests: int = 1) -> None:
        self.rank.release_inflight(tokens, requests)


def route_to_primary_port(result: SchedulingResult, profile: str, port: int) -> None:
    """Set ``x-data-parallel-host-port`` to ``profile``'s target rank and readdress its endpoints to ``port``."""
    res = result.profile_results.get(profile)
    if res is None or not res.endpoints:
        return
    result.headers[DATA_PARALLEL_HEADER] = res.endpoints[0].hostport
    result.profile_results[profile] = ProfileRunResult([PrimaryPortEndpoint(ep, port) for ep in res.endpoints])


class DataParallelProfileHandler(SingleProfileHandler):
    """Runs the one profile; the target rank goes in ``x-data-parallel-host-port``, the request to ``primaryPort``."""

    type_name: ClassVar[str] = "data-parallel-profile-handler"
    label: ClassVar[str] = "data parallel profile handler"

    class Params(PluginParams):
        primary_port: int = Field(8000, alias="primaryPort", ge=1, le=65535)

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._port = params.primary_port

    def process_results(self, cycle: CycleState, request: InferenceRequest,
                        results: Mapping[str, ProfileRunResult | None]) -> SchedulingResult:
        result = super().process_results(cycle, request, results)
        route_to_primary_port(result, result.primary_profile, self._port)
        return result


_check: type[ProfileHandler] = DataParallelProfileHandler
