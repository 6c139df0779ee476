"""The data layer package re-exports its wiring API (each module's own ``__all__`` is guarded with the others in
``tests/core/test_exported_members.py``)."""

from __future__ import annotations


def test_package_reexports_the_wiring_api() -> None:
    import epp.datalayer as pkg

    assert all(hasattr(pkg, n) for n in pkg.__all__)
    for name in ("Scraper", "ScrapeConfig", "MetricsExtractor", "StaticFileDiscovery", "KubernetesDiscovery",
                 "build_scraper", "scrape_settings"):
        assert name in pkg.__all__
