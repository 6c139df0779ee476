"""Build EPP's image without Docker or Docker Hub, then run ``epp serve`` from it against a simulated pool.

Run as root: ``python -m bench.image`` (``--rebuild-base`` to debootstrap the base again, ``--keep`` to leave the
run's container for inspection, ``--tag``, ``--work DIR``, ``--mirror URL``, ``--extras fast,tokenizer`` for the
Dockerfile's ``EXTRAS``; the wheelhouse holds both). Needs buildah, podman (to import the
base and list what a container changed) and debootstrap. Timed steps: a Debian bookworm base with python3 and its
venv module (debootstrap, imported once as ``localhost/debian-py:bookworm``, then reused); a wheelhouse of EPP and
its dependencies built by this interpreter (bookworm's python3 is 3.11 too); ``buildah bud`` of the repository's
Dockerfile on that base with the wheelhouse mounted at /wheels; the image's size and contents; a simulated pool
(epp-sim) on the host; ``epp serve`` in a container of the image (``buildah run --isolation chroot``: host network,
the image's user, /tmp a tmpfs); one chat completion through its gateway and the endpoint that served it; SIGTERM,
and the files the run changed in the container. ``podman run`` cannot start containers on this VM (crun refuses
cgroups in hybrid mode), hence ``buildah run``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASE = "localhost/debian-py:bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
# What the Dockerfile's build stage copies: the package sources and the simulator (installed as epp_sim).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "epp", "plugins", "bench/sim")
# Dropped from the base as Debian's slim images do (dpkg path-exclude), licence files kept.
SLIM_EXCLUDE = ("/usr/share/doc/*", "/usr/share/groff/*", "/usr/share/info/*", "/usr/share/linda/*",
                "/usr/share/lintian/*", "/usr/share/locale/*", "/usr/share/man/*")
SLIM_INCLUDE = ("/usr/share/doc/*/copyright",)
MODEL = "sim-model"  # the simulator's default served model
RUN_CONTAINER = "epp-image-run"


class StepTimer:
    """Numbered, timed steps: each prints its title, its lines indented, and how long it took."""

    def __init__(self, total: int) -> None:
        self.total, self.n, self.started = total, 0, time.monotonic()

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        self.n += 1
        print(f"[{self.n}/{self.total}] {title}", flush=True)
        t0 = time.monotonic()
        yield
        print(f"      ({time.monotonic() - t0:.1f} s)", flush=True)

    def done(self) -> None:
        print(f"total {time.monotonic() - self.started:.1f} s", flush=True)


def say(line: str) -> None:
    print(f"      {line}", flush=True)


def run(cmd: list[str], *, log: Path | None = None, timeout: float = 1800, check: bool = True) -> str:
    """``cmd``'s stdout (stdout and stderr written to ``log``); on failure, exit showing the last lines."""
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout)
    out = (proc.stdout + proc.stderr).decode(errors="replace")
    if log is not None:
        log.write_text(out)
    if check and proc.returncode != 0:
        tail = "\n".join(out.splitlines()[-25:])
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc.stdout.decode(errors="replace")


# -- the base image ----------------------------------------------------------------------------------------------


def debian_mirror() -> str:
    """The bookworm mirror apt uses here (deb822 ``.sources`` or one-line ``.list`` files), else deb.debian.org."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in text.split("\n\n"):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
                if "bookworm" in fields.get("Suites", "").split() and fields.get("URIs"):
                    return fields["URIs"].split()[0]
        elif path.suffix == ".list" or path.name == "sources.list":
            for line in text.splitlines():
                m = re.match(r"deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", line)
                if m:
                    return m.group(1)
    return "http://deb.debian.org/debian"


def image_id(name: str) -> str:
    """The ID of the image ``name``, or "" if there is none."""
    return run(["podman", "image", "inspect", "--format", "{{.Id}}", name], check=False).strip()


def drop_replaced(old_id: str, name: str) -> None:
    """Remove the image ``name`` was before a rebuild (now untagged), unless a container or image still uses it."""
    if old_id and old_id != image_id(name):
        run(["buildah", "rmi", old_id], check=False)


def slim(rootfs: Path) -> None:
    """Drop apt's caches and the excluded paths, and tell dpkg to keep excluding them in derived images."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*"):
        for path in rootfs.glob(pattern):
            _remove(path, set())
    keep = {path for pattern in SLIM_INCLUDE for path in rootfs.glob(pattern.lstrip("/"))}
    for pattern in SLIM_EXCLUDE:
        for path in rootfs.glob(pattern.lstrip("/")):
            _remove(path, keep)
    rules = [f"path-exclude {p}" for p in SLIM_EXCLUDE] + [f"path-include {p}" for p in SLIM_INCLUDE]
    (rootfs / "etc/dpkg/dpkg.cfg.d/slim").write_text("\n".join(rules) + "\n")


def _remove(path: Path, keep: set[Path]) -> None:
    """``path`` and what it holds, but for ``keep`` (and the directories leading to it)."""
    if path in keep:
        return
    if path.is_dir() and not path.is_symlink():
        for child in list(path.iterdir()):
            _remove(child, keep)
        if not any(path.iterdir()):
            path.rmdir()
    else:
        path.unlink()


def build_base(work: Path, mirror: str) -> None:
    """debootstrap a minimal bookworm with :data:`PACKAGES`, slim it, import it as :data:`BASE`."""
    rootfs = work / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    say(f"debootstrap --variant=minbase --include={','.join(PACKAGES)} bookworm from {mirror}")
    run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", "bookworm", str(rootfs), mirror],
        log=work / "debootstrap.log")
    slim(rootfs)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(["podman", "import", "-", BASE], stdin=tar.stdout, capture_output=True)
    if tar.wait() != 0 or imported.returncode != 0:
        raise SystemExit(f"podman import failed: {imported.stderr.decode(errors='replace')}")
    image_id = imported.stdout.decode().strip().splitlines()[-1]
    say(f"imported {BASE} ({image_id[:19]})")
    shutil.rmtree(rootfs)


# -- wheelhouse and image ----------------------------------------------------------------------------------------


def build_wheelhouse(work: Path) -> Path:
    """Wheels of EPP (built from a copy of :data:`SOURCES`, keeping the checkout clean) and its dependencies."""
    src, wheels = work / "src", work / "wheels"
    for path in (src, wheels):
        shutil.rmtree(path, ignore_errors=True)
    for rel in SOURCES:
        origin, dest = REPO / rel, src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_dir():
            shutil.copytree(origin, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, dest)
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), f"{src}[fast,tokenizer]"],
        log=work / "wheel.log")
    files = sorted(wheels.glob("*.whl"))
    size = sum(f.stat().st_size for f in files)
    say(f"{len(files)} wheels, {size / 1e6:.1f} MB in {wheels}")
    return wheels


def build_image(work: Path, wheels: Path, tag: str, extras: str) -> None:
    say(f"buildah bud --isolation chroot --build-arg BASE_IMAGE={BASE} --build-arg EXTRAS={extras} "
        f"--volume {wheels}:/wheels:ro -t {tag} .")
    run(["buildah", "bud", "--isolation", "chroot", "--build-arg", f"BASE_IMAGE={BASE}",
         "--build-arg", f"EXTRAS={extras}",
         "--volume", f"{wheels}:/wheels:ro", "--tag", tag, "--file", str(REPO / "Dockerfile"), str(REPO)],
        log=work / "build.log")
    say(f"built {tag}; log in {work / 'build.log'}")


def image_bytes(name: str) -> int:
    return int(run(["podman", "image", "inspect", "--format", "{{.Size}}", name]).strip())


def report_size(tag: str) -> None:
    total, base = image_bytes(tag), image_bytes(BASE)
    say(f"{tag}: {total / 1e6:.0f} MB ({BASE} {base / 1e6:.0f} MB + EPP's layers {(total - base) / 1e6:.0f} MB)")
    for line in run(["buildah", "images", "--format", "{{.Name}}:{{.Tag}}  {{.ID}}  {{.Size}}"]).splitlines():
        if line.startswith((tag, BASE)):
            say(f"buildah images: {line}")


# What the image holds, checked from inside a container of it (as its user).
_CONTENTS = """
import importlib.util as u, os, sys, epp, epp_sim
site = os.path.dirname(os.path.dirname(epp.__file__))
print("user", os.getuid(), "python", sys.version.split()[0], "epp", epp.__version__, "in", site)
print("importable: epp_sim", u.find_spec("epp_sim") is not None, "| bench", u.find_spec("bench") is not None,
      "| tests", u.find_spec("tests") is not None, "| pip", u.find_spec("pip") is not None,
      "| tokenizers", u.find_spec("tokenizers") is not None, "| jinja2", u.find_spec("jinja2") is not None)
writable = [d for d in ("/", "/etc", "/opt/epp", site, "/etc/epp/config", "/tmp", "/var/tmp") if os.access(d, os.W_OK)]
print("writable by this user:", " ".join(writable))
"""


def check_contents(tag: str) -> None:
    container = run(["buildah", "from", tag]).strip()
    try:
        for line in run(["buildah", "run", "--isolation", "chroot", container, "--", "python3", "-c",
                         _CONTENTS]).splitlines():
            say(line)
        config = json.loads(run(["buildah", "inspect", "--type", "image", tag]))["OCIv1"]["config"]
        say(f"user {config.get('User')}, ports {' '.join(sorted(config.get('ExposedPorts', {})))}, "
            f"entrypoint {' '.join(config.get('Entrypoint', []))}")
    finally:
        run(["buildah", "rm", container])


# -- running it ----------------------------------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_pool(servers: int) -> tuple[subprocess.Popen[bytes], list[tuple[str, int]]]:
    """``epp-sim pool`` on free ports; its (name, port) pairs once each server prints that it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "epp_sim.cli", "pool", "--servers", str(servers),
                             "--base-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: queue.Queue[bytes] = queue.Queue()
    # A thread drains the pool's output for as long as it runs (a full pipe would stall it).
    threading.Thread(target=_drain, args=(proc, lines), daemon=True).start()
    ports: list[int] = []
    deadline = time.monotonic() + 30
    while len(ports) < servers:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic())).decode()
        except queue.Empty:
            break
        say(line.strip())
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        if m:
            ports.append(int(m.group(1)))
    if len(ports) < servers:
        proc.kill()
        raise SystemExit("the simulated pool did not start")
    return proc, [(f"sim-{i}", port) for i, port in enumerate(ports)]


def _drain(proc: subprocess.Popen[bytes], lines: queue.Queue[bytes]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)


def http(method: str, url: str, body: dict[str, object] | None = None,
         timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def wait_ready(url: str, proc: subprocess.Popen[bytes], seconds: float) -> bytes:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"epp serve exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            status, _, body = http("GET", url, timeout=1)
            if status == 200:
                return body
        time.sleep(0.1)
    raise SystemExit(f"{url} not ready after {seconds:.0f} s")


def serve_command(container: str, endpoints: Path, ports: dict[str, int]) -> list[str]:
    """``buildah run`` of the image's entrypoint (``buildah run`` does not use it: spelled out) with the run's
    flags: plaintext ext_proc, the gateway, and ports free on this host (its network is the host's)."""
    return ["buildah", "run", "--isolation", "chroot", "--volume", f"{endpoints}:/etc/epp/endpoints.yaml:ro",
            "--mount", "type=tmpfs,destination=/tmp", container, "--",
            "epp", "serve", "--config", "/etc/epp/config/default.yaml", "--endpoints", "/etc/epp/endpoints.yaml",
            "--plaintext", "--grpc-port", str(ports["grpc"]), "--health-port", str(ports["health"]),
            "--metrics-port", str(ports["metrics"]), "--http-port", str(ports["http"]), "--drain-timeout", "0"]


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                out += [int(child), *descendants(int(child))]
    return out


def epp_pid(runner: int) -> int | None:
    """The ``epp serve`` interpreter under ``buildah run`` (pid ``runner``): it gets the SIGTERM, as a kubelet
    would send it (buildah itself answers SIGTERM by killing its child)."""
    for pid in descendants(runner):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"python3") and b"serve" in argv:
                return pid
    return None


def stop(proc: subprocess.Popen[bytes], pid: int | None, grace: float = 15) -> int:
    """SIGTERM to ``pid`` (else to ``proc``), then ``proc``'s exit code; killed if it outlives ``grace``."""
    os.kill(pid if pid is not None else proc.pid, signal.SIGTERM)
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def metric_lines(url: str, *names: str) -> list[str]:
    _, _, body = http("GET", url)
    return [line for line in body.decode().splitlines() if line.startswith(names)]


def served_counts(pool: list[tuple[str, int]]) -> dict[str, float]:
    """Requests each simulated server finished (its own ``vllm:request_success_total``, all reasons)."""
    counts = {}
    for name, port in pool:
        lines = metric_lines(f"http://127.0.0.1:{port}/metrics", "vllm:request_success_total")
        counts[name] = sum(float(line.rsplit(" ", 1)[1]) for line in lines)
    return counts


def route_one(ports: dict[str, int], pool: list[tuple[str, int]]) -> None:
    """One chat completion through the gateway: the answer, and which server took it (EPP's scheduler attempts
    and the servers' own counters)."""
    before = served_counts(pool)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello from the image"}], "max_tokens": 12}
    t0 = time.monotonic()
    status, headers, raw = http("POST", f"http://127.0.0.1:{ports['http']}/v1/chat/completions", body)
    say(f"POST /v1/chat/completions -> {status} in {(time.monotonic() - t0) * 1000:.1f} ms, "
        f"x-request-id {headers.get('x-request-id')}")
    say(f"response: {raw.decode()}")
    after = served_counts(pool)
    for line in metric_lines(f"http://127.0.0.1:{ports['metrics']}/metrics", "llm_d_epp_scheduler_attempts_total",
                             "llm_d_epp_request_total"):
        say(f"EPP /metrics: {line}")
    took = [f"{name} (127.0.0.1:{port})" for name, port in pool if after[name] > before[name]]
    say(f"served by: {', '.join(took) or 'none'} (servers' vllm:request_success_total before {before}, "
        f"after {after})")
    if status != 200 or not took:
        raise SystemExit("the request was not routed")


def changed_files(container: str) -> None:
    lines = run(["podman", "diff", container]).splitlines()
    say("files the run changed in the container (podman diff; /etc/epp/endpoints.yaml is the bind mount's "
        "mount point, /tmp a tmpfs):")
    for line in lines:
        say(f"  {line}")


def start_epp(tag: str, work: Path, pool: list[tuple[str, int]]) -> tuple[str, subprocess.Popen[bytes], dict[str, int]]:
    """A container of ``tag`` running ``epp serve`` against ``pool``, once its gateway answers ``/ready``:
    (container, the ``buildah run`` process, EPP's ports)."""
    endpoints = work / "endpoints.yaml"
    endpoints.write_text("endpoints:\n" + "".join(f"  - {{name: {name}, address: 127.0.0.1, port: {port}}}\n"
                                                  for name, port in pool))
    ports = dict(zip(("grpc", "health", "metrics", "http"), free_ports(4)))
    container = run(["buildah", "from", "--name", RUN_CONTAINER, tag]).strip()
    cmd = serve_command(container, endpoints, ports)
    say(" ".join(cmd))
    with (work / "epp.log").open("wb") as log:
        runner = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready = wait_ready(f"http://127.0.0.1:{ports['http']}/ready", runner, 60)
    except BaseException:
        stop(runner, epp_pid(runner.pid))
        run(["buildah", "rm", container])
        raise
    say(f"GET /ready: {ready.decode()}")
    return container, runner, ports


def show_log(path: Path, start: int = 0) -> int:
    """Print ``path``'s lines from ``start`` on; the number of lines it has."""
    lines = path.read_text().splitlines()
    for line in lines[start:]:
        say(f"epp: {line}")
    return len(lines)


def run_from_image(args: argparse.Namespace, timer: StepTimer) -> None:
    with timer.step("simulated pool on the host (epp-sim pool --servers 2 --base-port 0)"):
        pool_proc, pool = start_pool(2)
    try:
        with timer.step(f"epp serve from {args.tag} (buildah run --isolation chroot, host network)"):
            container, runner, ports = start_epp(args.tag, args.work, pool)
            shown = show_log(args.work / "epp.log")
        try:
            with timer.step("one chat completion through EPP's gateway"):
                route_one(ports, pool)
        finally:
            with timer.step("stop: SIGTERM to epp serve, then the pool"):
                say(f"epp serve (buildah run) exited with {stop(runner, epp_pid(runner.pid))}")
                show_log(args.work / "epp.log", shown)
                say(f"epp-sim pool exited with {stop(pool_proc, None)}")
                changed_files(container)
                if args.keep:
                    say(f"kept container {container} (buildah rm {container})")
                else:
                    run(["buildah", "rm", container])
    finally:
        if pool_proc.poll() is None:
            stop(pool_proc, None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.image", description=__doc__.split("\n\n")[0])
    p.add_argument("--rebuild-base", action="store_true", help=f"debootstrap {BASE} again")
    p.add_argument("--keep", action="store_true", help="leave the run's container (buildah containers)")
    p.add_argument("--tag", default="localhost/epp:dev")
    p.add_argument("--extras", default="fast", help="the Dockerfile's EXTRAS (fast,tokenizer: the local tokenizer)")
    p.add_argument("--work", type=Path, default=Path("/tmp/epp-image"), help="scratch directory")
    p.add_argument("--mirror", default=None, help="Debian mirror (default: the one apt uses)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: debootstrap and buildah's chroot isolation need it")
    missing = [tool for tool in ("buildah", "podman", "debootstrap") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"missing: {' '.join(missing)} (apt-get install -y buildah podman debootstrap)")
    args.work.mkdir(parents=True, exist_ok=True)
    timer = StepTimer(8)
    with timer.step(f"base image {BASE}"):
        old_base = image_id(BASE)
        if old_base and not args.rebuild_base:
            say("present, reused (--rebuild-base to debootstrap it again)")
        else:
            build_base(args.work, args.mirror or debian_mirror())
    with timer.step("wheelhouse (pip wheel of EPP[fast,tokenizer] and its dependencies)"):
        wheels = build_wheelhouse(args.work)
    with timer.step(f"image {args.tag} (buildah bud of ./Dockerfile)"):
        old_image = image_id(args.tag)
        run(["buildah", "rm", RUN_CONTAINER], check=False)  # left by an earlier --keep: it holds the old image
        build_image(args.work, wheels, args.tag, args.extras)
        drop_replaced(old_image, args.tag)
        drop_replaced(old_base, BASE)
    with timer.step("image size and contents"):
        report_size(args.tag)
        check_contents(args.tag)
    run_from_image(args, timer)
    timer.done()
    return 0


if __name__ == "__main__":
    sys.exit(main())
