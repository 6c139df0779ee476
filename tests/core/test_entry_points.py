"""Third-party plugins arrive through the ``epp.plugins`` entry-point group (a real installed distribution)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.runtime.builtins import default_registry

PLUGIN_SOURCE = '''
from typing import ClassVar
from epp.framework.plugins import Params

class ConstantScorer:
    """Scores every endpoint with ``value``."""
    type_name: ClassVar[str] = "constant-scorer"

    class Params(Params):
        value: float = 0.5

    def __init__(self, name, params, handle):
        self.name, self.params = name, params

    def score(self, cycle, request, endpoints):
        return [self.params.value] * len(endpoints)
'''


@pytest.fixture
def installed_plugin_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Lay out a distribution (package + dist-info with entry_points.txt) on sys.path, as pip would."""
    (tmp_path / "epp_test_plugin").mkdir()
    (tmp_path / "epp_test_plugin" / "__init__.py").write_text(PLUGIN_SOURCE)
    info = tmp_path / "epp_test_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: epp-test-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[epp.plugins]\nconstant = epp_test_plugin:ConstantScorer\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("epp_test_plugin", None)


def test_entry_point_plugin_is_usable_from_yaml(installed_plugin_dist: Path) -> None:
    registry = default_registry()
    assert "constant-scorer" in registry
    text = textwrap.dedent("""
        plugins:
        - type: constant-scorer
          parameters: {value: 0.25}
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: constant-scorer, weight: 2}]
        """)
    pipeline = build_pipeline(*load_raw(text), registry)
    scorer = pipeline.scheduler.profiles["default"].scorers[0]
    assert scorer.scorer.params.value == 0.25 and scorer.weight == 2


def test_entry_points_can_be_disabled(installed_plugin_dist: Path) -> None:
    assert "constant-scorer" not in default_registry(entry_points=False)
