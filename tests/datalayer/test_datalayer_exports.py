"""The data layer's public surface: every ``__all__`` name exists and every public definition is exported."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = ["epp.datalayer.parsing", "epp.datalayer.http", "epp.datalayer.scraper", "epp.datalayer.static", "epp.datalayer.kubernetes", "epp.datalayer.k8s_objects",
           "epp.datalayer.wiring", "epp.metrics", "plugins.datalayer.metrics_source",
           "plugins.datalayer.core_metrics_extractor"]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist_and_public_definitions_are_exported(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert all(hasattr(module, n) for n in exported), [n for n in exported if not hasattr(module, n)]
    defined_here = {n for n, obj in vars(module).items()
                    if not n.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
                    and getattr(obj, "__module__", None) == name}
    assert defined_here <= exported, sorted(defined_here - exported)


def test_package_reexports_the_wiring_api() -> None:
    import epp.datalayer as pkg

    assert all(hasattr(pkg, n) for n in pkg.__all__)
    for name in ("Scraper", "ScrapeConfig", "MetricsExtractor", "StaticFileDiscovery", "KubernetesDiscovery",
                 "build_scraper", "scrape_settings"):
        assert name in pkg.__all__
