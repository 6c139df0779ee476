"""Virtual environments for the tools the benchmark runs but the project does not depend on: the peer routers
(``vllm-router``, ``sglang-router``) and matplotlib for the plots.

Each tool gets its own venv under ``$EPP_BENCH_CACHE`` (default ``~/.cache/epp-bench``) ``/venvs/<name>``, so its
dependencies never meet EPP's. :func:`ensure` returns the venv if it already holds the pinned requirement (recorded
in a marker file once ``pip install`` succeeded) and otherwise creates it and installs the requirement only when
asked (``install=True``); else it raises :class:`MissingTool` saying how to get it. :func:`installed_version` reads
the installed distribution's version from its ``.dist-info`` directory, without running the venv's Python.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MissingTool", "Tool", "TOOLS", "cache_dir", "ensure", "installed_version", "venv_dir"]

MARKER = ".epp-bench-requirement"


class MissingTool(RuntimeError):
    """A tool's venv is missing or holds another requirement, and installing was not asked for."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool installed into a venv of its own: the venv's ``name``, the pip ``requirement`` and its
    distribution's name."""

    name: str
    requirement: str
    distribution: str


TOOLS = {tool.name: tool for tool in [
    Tool("vllm-router", "vllm-router==0.1.17", "vllm_router"),
    Tool("sglang-router", "sglang-router==0.3.2", "sglang_router"),
    Tool("plots", "matplotlib>=3.7", "matplotlib"),
]}
"""The pinned versions the benchmark was written against (their CLI flags are the ones it passes)."""


def cache_dir() -> Path:
    return Path(os.environ.get("EPP_BENCH_CACHE") or Path.home() / ".cache" / "epp-bench")


def venv_dir(tool: Tool) -> Path:
    return cache_dir() / "venvs" / tool.name


def installed_version(venv: Path, distribution: str) -> str | None:
    """The version of ``distribution`` installed in ``venv`` (its dist-info directory), or None."""
    wanted = re.sub(r"[-_.]+", "_", distribution).lower()
    for info in venv.glob("lib/python*/site-packages/*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        if re.sub(r"[-_.]+", "_", name).lower() == wanted:
            return version
    return None


def ready(tool: Tool) -> bool:
    """The tool's venv exists and a successful install of exactly its requirement is recorded there."""
    venv = venv_dir(tool)
    marker = venv / MARKER
    return (venv / "bin" / "python").exists() and marker.exists() and marker.read_text().strip() == tool.requirement


def ensure(tool: Tool, *, install: bool, log: Path = Path(os.devnull)) -> Path:
    """The venv of ``tool``, created and installed first (pip's output to ``log``) when ``install`` and it is not
    ready."""
    venv = venv_dir(tool)
    if ready(tool):
        return venv
    if not install:
        raise MissingTool(f"{tool.name} is not installed in {venv}; run with --peers (or --plots install) to "
                          f"install {tool.requirement} there")
    print(f"installing {tool.requirement} into {venv} ...", file=sys.stderr, flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            if not (venv / "bin" / "python").exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=out, stderr=out)
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", tool.requirement],
                           check=True, stdout=out, stderr=out)
        except subprocess.CalledProcessError as exc:
            raise MissingTool(f"installing {tool.requirement} into {venv} failed ({exc}); see {log}") from exc
    (venv / MARKER).write_text(tool.requirement + "\n")
    return venv
