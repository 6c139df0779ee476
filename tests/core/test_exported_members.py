"""Every ``__all__`` names what exists and is the module's public surface (httpx-style guard), for the framework,
the ext_proc transport, the data layer and flow control: one guard, one list."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import epp.flowcontrol

MODULES = ["epp.errors", "epp.headers", "epp.framework.request", "epp.framework.endpoint", "epp.datalayer.datastore", "epp.framework.plugins", "epp.framework.registry", "epp.framework.pool", "epp.runtime.builtins",
           "epp.scheduling.scheduler", "epp.config.loader", "epp.config.schema", "epp.config.wiring", "epp.scheduling.parsers",
           "epp.scheduling.director", "epp.config.yaml_lines", "epp.config.describe",
           "epp.extproc.h2.server", "epp.extproc.h2.connection", "epp.extproc.h2.hpack",
           "epp.extproc.h2.session", "epp.extproc.h2.flow", "epp.extproc.h2.frames", "epp.extproc.h2.limits",
           "epp.extproc.h2.messages", "epp.usage", "epp.usage.shapes", "epp.usage.reader", "epp.usage.restorer",
           "epp.envoy.bootstrap", "epp.envoy.options", "epp.envoy.clusters", "epp.envoy.routes",
           "epp.envoy.local_replies", "epp.envoy.values", "epp.gateway._limits", "epp.gateway._lean_downstream",
           "epp.datalayer.parsing", "epp.datalayer.http", "epp.datalayer.scraper", "epp.datalayer.static",
           "epp.datalayer.engines",
           "epp.datalayer.kubernetes", "epp.datalayer.k8s_objects", "epp.datalayer.leader", "epp.datalayer.wiring",
           "epp.metrics.families", "epp.metrics.instruments", "epp.metrics.pool",
           "epp.gateway._frontend", "epp.gateway._downstream", "epp.runtime.app", "epp.config.units",
           "epp.datalayer.models", "epp.datalayer.polling", "epp.http1.request", "epp.http1.response",
           "epp.metrics.labels", "epp.envoy.xds.eds", "epp.envoy.xds.server",
           "epp.plugins.datalayer.metrics_source", "epp.plugins.datalayer.core_metrics_extractor",
           "epp.plugins.datalayer.models_source", "epp.plugins.datalayer.models_extractor", "epp.plugins.datalayer.file_discovery",
           "epp.plugins.session_binding",
           "epp.flowcontrol", *(f"epp.flowcontrol.{m.name}" for m in pkgutil.iter_modules(epp.flowcontrol.__path__))]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist_and_public_definitions_are_exported(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert all(hasattr(module, n) for n in exported), [n for n in exported if not hasattr(module, n)]
    defined_here = {n for n, obj in vars(module).items()
                    if not n.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
                    and getattr(obj, "__module__", None) == name}
    assert defined_here <= exported, sorted(defined_here - exported)
