"""The shape of the flow-control plugin classes (the modules' ``__all__`` guard is in
``tests/core/test_exported_members.py``)."""

from __future__ import annotations

import inspect

import pytest

import epp.plugins.flowcontrol
import epp.plugins.saturation
from epp.flowcontrol import FairnessPolicy, OrderingPolicy, UsageLimitPolicy
from epp.framework.plugins import Filter, Handle, Params, PreRequest, ResponseComplete, SaturationDetector
from epp.runtime.builtins import default_registry

PLUGIN_GROUPS = [epp.plugins.saturation, epp.plugins.flowcontrol]
CLASSES = [cls for group in PLUGIN_GROUPS for cls, _ in group.BUILTINS]
ROLES = {
    "utilization-detector": (SaturationDetector, Filter), "concurrency-detector": (SaturationDetector, Filter),
    "fcfs-ordering-policy": (OrderingPolicy,), "edf-ordering-policy": (OrderingPolicy,),
    "slo-deadline-ordering-policy": (OrderingPolicy,),
    "global-strict-fairness-policy": (FairnessPolicy,), "round-robin-fairness-policy": (FairnessPolicy,),
    "weighted-fair-fairness-policy": (FairnessPolicy,), "static-usage-limit-policy": (UsageLimitPolicy,),
    "program-aware-fairness": (FairnessPolicy, PreRequest, ResponseComplete),
}


def test_every_flow_control_plugin_type_is_registered_once() -> None:
    assert {cls.type_name for cls in CLASSES} == set(ROLES)
    assert set(ROLES) <= set(default_registry(entry_points=False).types())


@pytest.mark.parametrize("cls", CLASSES, ids=[c.type_name for c in CLASSES])
def test_plugin_shape_docs_and_role(cls: type) -> None:
    assert issubclass(cls.Params, Params) and cls.Params.model_config.get("extra") == "forbid"
    module = inspect.getmodule(cls)
    assert cls.type_name in (module.__doc__ or "") and "YAML::" in (module.__doc__ or "")
    assert cls.__doc__ and cls.__name__ in module.__all__
    plugin = default_registry(entry_points=False).create(cls.type_name, "instance", None, Handle())
    assert plugin.name == "instance" and isinstance(plugin.params, cls.Params)
    assert all(isinstance(plugin, role) for role in ROLES[cls.type_name])
