"""What ``pip install .`` puts in site-packages: ``epp`` (plugins as ``epp.plugins``) and the simulator ``epp_sim``.

A wheel is built from a copy of the checkout (so the build leaves nothing in the working tree) with the installed
setuptools, offline, and its top-level names are read from the archive.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", ".mypy_cache", "tests")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src") / "epp"
    shutil.copytree(ROOT, src, ignore=SKIP)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, capture_output=True)
    (built,) = out.glob("epp-*.whl")
    return zipfile.ZipFile(built)


@pytest.fixture(scope="module")
def wheel_names(wheel: zipfile.ZipFile) -> set[str]:
    return set(wheel.namelist())


def test_the_wheel_installs_only_epp_and_the_simulator(wheel_names: set[str]) -> None:
    top = {name.split("/")[0] for name in wheel_names if ".dist-info/" not in name}
    assert top == {"epp", "epp_sim"}


def test_plugins_are_installed_under_epp_and_benchmarks_are_not(wheel_names: set[str]) -> None:
    assert "epp/plugins/scorers/queue.py" in wheel_names
    assert "epp_sim/server.py" in wheel_names
    assert not any(name.startswith(("plugins/", "bench/")) for name in wheel_names)


def test_the_console_scripts_name_installed_modules(wheel: zipfile.ZipFile, wheel_names: set[str]) -> None:
    (entry_points,) = [name for name in wheel_names if name.endswith(".dist-info/entry_points.txt")]
    scripts = wheel.read(entry_points).decode()
    assert "epp = epp.cli.main:main" in scripts
    assert "epp-sim = epp_sim.cli:main" in scripts
