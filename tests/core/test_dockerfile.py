"""The Dockerfile and .dockerignore, read as text (``python -m bench.image`` builds and runs the image itself).

Checked: both stages build from the ``BASE_IMAGE`` argument (default ``python:3.11-slim``); the build stage copies
every folder setup.py installs a package from, and the build context (after .dockerignore, evaluated as Docker
does: the last matching pattern wins, ``!`` re-includes) holds them but not the tests or the benchmarks other than
the simulator; the image runs ``epp serve`` with a config file the image holds, as user 65532, exposing EPP's ports.
"""

from __future__ import annotations

import ast
import fnmatch
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINES = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()
         if line.strip() and not line.startswith("#")]
IGNORE = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
          if line.strip() and not line.startswith("#")]


def _instructions(name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in LINES if line.split(None, 1)[0] == name]


def _copied() -> set[str]:
    """The context paths the Dockerfile's COPY instructions read (``--from`` copies excluded)."""
    out: set[str] = set()
    for args in _instructions("COPY"):
        if not args.startswith("--from"):
            out.update(args.split()[:-1])
    return out


def _excluded(path: str) -> bool:
    """Whether .dockerignore leaves ``path`` out of the context: it, or a folder above it, matches a pattern
    (``**/name`` at any depth, any other pattern from the context's root)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in IGNORE:
        negated, pattern = pattern.startswith("!"), pattern.lstrip("!")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(prefix.rsplit("/", 1)[-1], pattern[3:]) for prefix in prefixes)
        else:
            hit = any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes)
        if hit:
            excluded = not negated
    return excluded


def _package_dirs() -> set[str]:
    """The folders setup.py's ``package_dir`` installs from, plus ``epp`` itself."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "package_dir":
            return {"epp", *ast.literal_eval(node.value).values()}
    raise AssertionError("setup.py has no package_dir")


def test_both_stages_build_from_the_base_image_argument() -> None:
    assert LINES[0] == "ARG BASE_IMAGE=python:3.11-slim"
    froms = _instructions("FROM")
    assert len(froms) == 2 and all(f.split()[0] == "${BASE_IMAGE}" for f in froms)


def test_the_build_stage_copies_every_installed_package_and_the_project_files() -> None:
    copied = _copied()
    assert _package_dirs() | {"pyproject.toml", "setup.py", "README.md"} <= copied
    assert not any(path == "bench" or path == "tests" or path.startswith("tests/") for path in copied)


def test_the_context_holds_what_is_copied_and_not_the_tests_or_benchmarks() -> None:
    for path in (*_copied(), "bench/sim/server.py", "epp/cli/serve.py", "config/default.yaml"):
        assert (ROOT / path).exists(), path
        assert not _excluded(path), path
    for path in ("tests", "tests/core/test_dockerfile.py", "bench/image.py", "bench/__init__.py", ".git", ".venv",
                 "docs/kubernetes.md", "epp/__pycache__/x.pyc", "plugins/scorers/__pycache__/queue.cpython-311.pyc"):
        assert _excluded(path), path


def test_the_image_serves_as_an_unprivileged_user_on_epps_ports() -> None:
    assert _instructions("USER") == ["65532:65532"]
    assert _instructions("EXPOSE") == ["9002 9003 9090"]
    (entrypoint,) = _instructions("ENTRYPOINT")
    assert json.loads(entrypoint) == ["epp", "serve", "--config", "/etc/epp/config/default.yaml"]
    assert "config /etc/epp/config" in _instructions("COPY") and (ROOT / "config" / "default.yaml").is_file()


def test_the_extras_are_a_build_argument_defaulting_to_fast() -> None:
    """``EXTRAS`` (default ``fast``) picks the package extras both install lines use, so ``--build-arg
    EXTRAS=fast,tokenizer`` gives an image with the local tokenizer and the default one stays as small as before."""
    assert "EXTRAS=fast" in _instructions("ARG")
    installs = [line for line in LINES if "pip install" in line]
    assert len(installs) == 2 and all("[${EXTRAS}]" in line for line in installs)
