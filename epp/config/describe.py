"""Render a built :class:`~epp.config.loader.Pipeline` as text, for ``epp check-config``."""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from epp.config.schema import EndpointPickerConfig
from epp.flowcontrol.config import FlowControlConfig
from epp.framework.plugins import Admitter, Handle, PassiveHealth, Plugin, SaturationDetector
from epp.scheduling.parsers import claims_of
from epp.scheduling.scheduler import Scheduler

__all__ = ["BuiltPipeline", "describe_pipeline"]


class BuiltPipeline(Protocol):
    """What :func:`describe_pipeline` reads of a built pipeline (:class:`epp.config.loader.Pipeline` has it; the
    loader imports this module, so the type is stated here rather than imported)."""

    config: EndpointPickerConfig
    handle: Handle
    scheduler: Scheduler
    parser: Plugin
    admitters: list[Admitter]
    feature_gates: frozenset[str]
    discovery: Plugin | None
    health: PassiveHealth | None
    saturation_detector: SaturationDetector
    flow_control: FlowControlConfig | None
    source: str


def describe_pipeline(pipeline: BuiltPipeline) -> str:
    """Profiles with their filters, weighted scorers and picker, the admitters, passive health; then every plugin
    with resolved parameters."""
    sched = pipeline.scheduler
    lines = [f"config: {pipeline.source}",
             f"apiVersion: {pipeline.config.api_version}",
             f"featureGates: {sorted(pipeline.feature_gates) or '[]'}",
             f"profileHandler: {_ref(sched.handler)}",
             _parsers(pipeline.parser),
             f"saturationDetector: {_ref(pipeline.saturation_detector)}"]
    if pipeline.discovery is not None:
        lines.append(f"discovery: {_ref(pipeline.discovery)}")
    if sched.producers:
        lines.append("dataProducers: " + ", ".join(_ref(p) for p in sched.producers))
    if pipeline.admitters:
        lines.append("admitters: " + ", ".join(_ref(a) for a in pipeline.admitters))
    lines.append(f"passiveHealth: {_ref(pipeline.health)}")
    lines.append("schedulingProfiles:")
    for prof in sched.profiles.values():
        lines.append(f"  - {prof.name}")
        lines.append("      filters: " + (", ".join(_ref(f) for f in prof.filters) or "(none)"))
        lines.append("      scorers: " + (", ".join(f"{_ref(w.scorer)} x{w.weight:g}" for w in prof.scorers)
                                         or "(none)"))
        lines.append(f"      picker: {_ref(prof.picker)}")
    lines.append("plugins:")
    for plugin in pipeline.handle.plugins():
        lines.append(f"  - {_ref(plugin)} {orjson.dumps(_params(plugin)).decode()}")
    if pipeline.flow_control is not None:
        lines.append("flowControl: " + orjson.dumps(pipeline.flow_control.model_dump(by_alias=True, mode="json"))
                     .decode())
    return "\n".join(lines)


def _parsers(parser: Any) -> str:
    """``parser: <ref>``, or ``parsers: <ref>, ...`` for a parser list (with what each claims)."""
    listed = getattr(parser, "parsers", None)
    if listed is None:
        return f"parser: {_ref(parser)}"
    return "parsers: " + ", ".join(f"{_ref(p)} [{', '.join(claims_of(p)) or 'every other path'}]" for p in listed)


def _ref(plugin: Plugin | None) -> str:
    if plugin is None:
        return "(none)"
    return plugin.name if plugin.name == plugin.type_name else f"{plugin.name} ({plugin.type_name})"


def _params(plugin: Plugin) -> dict[str, Any]:
    params = getattr(plugin, "params", None)
    if params is None:
        return {}
    return params.model_dump(by_alias=True, mode="json")
