"""Tiny inline plugins and endpoint builders for engine tests (pluggy-style: declared where used)."""

from __future__ import annotations

from typing import ClassVar

from epp.framework.endpoint import Endpoint, EndpointSpec, Metrics
from epp.framework.plugins import CycleState, NoParams, ProfileRunResult, SchedulingResult, ScoredEndpoint
from epp.framework.request import InferenceRequest, parse_request


def endpoint(name: str, waiting: int = 0, kv: float = 0.0, role: str | None = None, port: int = 8000) -> Endpoint:
    labels = {"llm-d.ai/role": role} if role else {}
    ip = f"10.0.0.{sum(map(ord, name)) % 250 + 1}"
    return Endpoint(EndpointSpec(name=name, address=ip, port=port, labels=labels),
                    Metrics(waiting=waiting, kv_usage=kv, update_time=1.0))


def request(text: str = "hello") -> InferenceRequest:
    return parse_request("/v1/completions", b'{"model":"m","prompt":"%s"}' % text.encode(), {})


class FixedScorer:
    """Scores endpoints from a name->score table (values outside [0,1] test clamping)."""

    type_name: ClassVar[str] = "fixed-scorer"
    Params = NoParams

    def __init__(self, name: str, table: dict[str, float]) -> None:
        self.name, self.table = name, table

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        return [self.table.get(ep.name, 0.0) for ep in endpoints]


class DropFilter:
    type_name: ClassVar[str] = "drop-filter"
    Params = NoParams

    def __init__(self, name: str, drop: set[str]) -> None:
        self.name, self.drop = name, drop

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        return [ep for ep in endpoints if ep.name not in self.drop]


class TopPicker:
    """Deterministic picker: highest score first, ties by name; returns ``n`` endpoints."""

    type_name: ClassVar[str] = "top-picker"
    Params = NoParams

    def __init__(self, name: str = "top", n: int = 1) -> None:
        self.name, self.n = name, n
        self.seen: list[list[tuple[str, float]]] = []

    def pick(self, cycle: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]) -> ProfileRunResult:
        self.seen.append([(s.endpoint.name, s.score) for s in scored])
        ranked = sorted(scored, key=lambda s: (-s.score, s.endpoint.name))
        return ProfileRunResult([s.endpoint for s in ranked[: self.n]])


class RunAllHandler:
    """Runs every profile once; the primary is ``primary``."""

    type_name: ClassVar[str] = "run-all-handler"
    Params = NoParams

    def __init__(self, primary: str = "default") -> None:
        self.name, self.primary = "run-all", primary

    def pick_profiles(self, cycle, request, profiles, results):  # type: ignore[no-untyped-def]
        return [n for n in profiles if n not in results]

    def process_results(self, cycle, request, results) -> SchedulingResult:  # type: ignore[no-untyped-def]
        return SchedulingResult(dict(results), self.primary)
