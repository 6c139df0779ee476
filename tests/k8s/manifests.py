"""The Kubernetes manifests under ``config/manifests`` as the tests see them: rendered by the real ``kubectl kustomize``
(a directory of the tree, or a kustomization composed in a temporary directory from the components), then read as
objects, and EPP's container turned into the ``epp serve`` command line a kubelet would run, with ``$(VAR)``
references expanded from the container's environment as the kubelet expands them.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "config" / "manifests"
KUBECTL = shutil.which("kubectl")

# Every directory a user applies with `kubectl apply -k`.
OVERLAYS = ("base", "overlays/envoy", "overlays/ha", "overlays/gateway", "overlays/simulated-pool",
            "overlays/scheduler-extender", "examples", "examples/vllm-pool", "examples/gateway")
# EPP's flags that open a port, each with the containerPort name the manifests give it.
PORT_FLAGS = {"--grpc-port": "grpc-ext-proc", "--grpc-health-port": "grpc-health", "--metrics-port": "http-metrics",
              "--http-port": "http", "--xds-port": "grpc-xds", "--scheduler-extender-port": "http-extender"}
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class Rendered:
    """The objects of one rendered kustomization."""

    def __init__(self, source: str, objects: list[dict[str, Any]]) -> None:
        self.source = source
        self.objects = objects

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        """The object of ``kind`` named ``name``, or of ``kind`` whose generated name starts with ``name-``."""
        found = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        found = found or [o for o in self.all(kind) if re.fullmatch(rf"{re.escape(name)}-[a-z0-9]{{10}}",
                                                                     o["metadata"]["name"])]
        assert len(found) == 1, f"{self.source}: expected one {kind} {name}, found {len(found)}"
        return found[0]

    def has(self, kind: str, name: str) -> bool:
        return any(o["metadata"]["name"] == name for o in self.all(kind))


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize DIRECTORY`` (offline), parsed."""
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@functools.cache
def render(name: str) -> Rendered:
    """A directory of ``config/manifests`` (e.g. ``overlays/ha``), rendered once per session."""
    return Rendered(name, kustomize(MANIFESTS / name))


def compose(workdir: Path, components: Sequence[str], namespace: str = "inference") -> Rendered:
    """Render base plus ``components`` (names under ``config/manifests/components``), as a user composes them in
    their own kustomization. Kustomize takes relative paths only, so they are relative to ``workdir``."""
    rel = Path(os.path.relpath(MANIFESTS, workdir))
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "namespace": namespace, "resources": [str(rel / "base")],
                     "components": [str(rel / "components" / c) for c in components]}
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return Rendered("base + " + " + ".join(components), kustomize(workdir))


# -- EPP's container ---------------------------------------------------------------------------------------------


@dataclass
class Container:
    """One container of a workload, with what the kubelet gives it: the Pod's namespace and name for the downward
    API, and the volumes it mounts."""

    workload: dict[str, Any]
    spec: dict[str, Any]

    @property
    def pod_spec(self) -> dict[str, Any]:
        return self.workload["spec"]["template"]["spec"]

    @property
    def namespace(self) -> str:
        return str(self.workload["metadata"]["namespace"])

    def env(self, pod_name: str) -> dict[str, str]:
        """The container's environment variables (literal values and the downward API fields used here)."""
        out: dict[str, str] = {}
        fields = {"metadata.namespace": self.namespace, "metadata.name": pod_name}
        for var in self.spec.get("env") or []:
            if "value" in var:
                out[var["name"]] = var["value"]
            else:
                path = var["valueFrom"]["fieldRef"]["fieldPath"]
                assert path in fields, f"downward API field {path} is not modelled by these tests"
                out[var["name"]] = fields[path]
        return out

    def argv(self, pod_name: str) -> list[str]:
        """``command + args`` with ``$(VAR)`` expanded as the kubelet does (an unknown variable stays as written)."""
        env = self.env(pod_name)
        words = list(self.spec.get("command") or []) + list(self.spec.get("args") or [])
        return [_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), w) for w in words]

    def container_ports(self) -> dict[str, int]:
        return {p["name"]: int(p["containerPort"]) for p in self.spec.get("ports") or []}

    def config_maps(self) -> Iterator[tuple[str, str]]:
        """``(mountPath, ConfigMap name)`` for each ConfigMap volume the container mounts."""
        volumes = {v["name"]: v for v in self.pod_spec.get("volumes") or []}
        for mount in self.spec.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                yield mount["mountPath"], volume["configMap"]["name"]


def container(rendered: Rendered, deployment: str, name: str) -> Container:
    workload = rendered.get("Deployment", deployment)
    specs = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(specs) == 1, f"{rendered.source}: Deployment {deployment} has no container {name}"
    return Container(workload, specs[0])


def flag_values(argv: Sequence[str]) -> dict[str, str]:
    """``--flag=value`` words as a dict (the manifests write every flag that way)."""
    out = {}
    for word in argv:
        assert word.startswith("--") and "=" in word, f"{word!r}: the manifests write flags as --flag=value"
        key, _, value = word.partition("=")
        assert key not in out, f"{key} given twice"
        out[key] = value
    return out


def epp_flags(c: Container, pod_name: str = "epp-0") -> dict[str, str]:
    """The flags of EPP's ``epp serve`` command line."""
    argv = c.argv(pod_name)
    assert argv[:2] == ["epp", "serve"], f"EPP's container runs {argv[:2]}, not epp serve"
    return flag_values(argv[2:])


def subjects_rules(rendered: Rendered, account: str, namespace: str) -> list[dict[str, Any]]:
    """The RBAC rules granted to ServiceAccount ``namespace/account`` by the rendered (Cluster)RoleBindings."""
    rules: list[dict[str, Any]] = []
    for kind, role_kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        for binding in rendered.all(kind):
            if not any(s["kind"] == "ServiceAccount" and s["name"] == account and s.get("namespace") == namespace
                       for s in binding["subjects"]):
                continue
            ref = binding["roleRef"]
            assert ref["kind"] == role_kind or ref["kind"] == "ClusterRole", f"{kind} binds a {ref['kind']}"
            role = rendered.get(ref["kind"], ref["name"])
            if kind == "RoleBinding":
                assert binding["metadata"]["namespace"] == namespace
            rules.extend(role["rules"])
    return rules


def resource_grants(rules: Sequence[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    """``(verb, apiGroup, resource)`` for every combination the resource rules allow (no wildcards here)."""
    out = set()
    for rule in rules:
        if "nonResourceURLs" in rule:
            continue
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    out.add((verb, group, resource))
    return out


def url_grants(rules: Sequence[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """``(path, verb)`` for every non-resource URL the rules allow."""
    return {(url, verb) for rule in rules for url in rule.get("nonResourceURLs") or [] for verb in rule["verbs"]}


def envoy_config_command() -> list[str]:
    """The ``epp envoy-config ...`` command written in ``components/envoy/kustomization.yaml``'s comments (lines
    continued with a backslash), which generated ``components/envoy/envoy.yaml``."""
    text = (MANIFESTS / "components" / "envoy" / "kustomization.yaml").read_text()
    lines = [line.lstrip("# ").rstrip() for line in text.splitlines() if line.startswith("#")]
    start = next(i for i, line in enumerate(lines) if line.startswith("epp envoy-config"))
    words: list[str] = []
    for line in lines[start:]:
        words += line.rstrip("\\").split()
        if not line.endswith("\\"):
            break
    return words
