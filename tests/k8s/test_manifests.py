"""The manifests under ``config/manifests``, rendered by the real ``kubectl kustomize``: every object fits the
Kubernetes models or its CRD's schema, EPP's command line is one ``epp serve`` parses with exactly the flags it
knows, and the ports, probes, files, names and references agree across objects. Running EPP with these arguments is
``test_manifests_run.py``."""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.cli.main import build_parser
from epp.envoy.process import find_envoy
from epp_sim.cli import build_configs, parse_args

from .manifests import (
    KUBECTL,
    MANIFESTS,
    OVERLAYS,
    PORT_FLAGS,
    ROOT,
    Rendered,
    compose,
    container,
    envoy_config_command,
    epp_flags,
    render,
    resource_grants,
    subjects_rules,
    url_grants,
)
from .strict import StrictError, check_schema, load, schema

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

EPP_OVERLAYS = [o for o in OVERLAYS if not o.startswith("examples")]
COMPONENTS = ("envoy", "gateway", "ha", "scheduler-extender", "simulated-pool")


def serve_parser() -> argparse.ArgumentParser:
    """``epp serve``'s own parser (its option strings are what the manifests may use, unabbreviated)."""
    root = build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


# -- every object, strictly ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_object_fits_its_model_or_crd_schema(name: str) -> None:
    rendered = render(name)
    assert rendered.objects
    for obj in rendered.objects:
        load(obj)


def test_all_components_compose_into_one_valid_set(tmp_path: Path) -> None:
    """Every component at once (kustomize fails on two patches or resources that clash)."""
    rendered = compose(tmp_path, COMPONENTS)
    for obj in rendered.objects:
        load(obj)
    flags = epp_flags(container(rendered, "epp", "epp"))
    assert {"--http-port", "--xds-port", "--scheduler-extender-port", "--ha-enable-leader-election"} <= set(flags)


Mutation = Callable[[dict[str, Any]], object]
DEPLOYMENT = ("base", "Deployment", "epp")
POOL = ("examples/vllm-pool", "InferencePool", "vllm-pool")


@pytest.mark.parametrize(("where", "mutate", "message"), [
    (DEPLOYMENT, lambda o: o["spec"].update(replica=2), r"spec: unknown field\(s\) \['replica'\]"),
    (DEPLOYMENT, lambda o: o["spec"]["template"]["spec"].update(ports=[]), r"template.spec: unknown field"),
    (DEPLOYMENT, lambda o: o["spec"].pop("selector"), r"spec: Invalid value for `selector`"),
    (DEPLOYMENT, lambda o: o["spec"].update(replicas="2"), r"spec.replicas: expected int"),
    (DEPLOYMENT, lambda o: o["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(containerPort="9002"),
     r"ports\[0\].containerPort: expected int"),
    (POOL, lambda o: o["spec"].update(targetPortNumber=8000), r"spec: unknown field 'targetPortNumber'"),
    (POOL, lambda o: o["spec"]["endpointPickerRef"].update(failureMode="Open"), r"'Open' is not one of"),
    (("base", "ServiceMonitor", "epp"), lambda o: o["spec"]["endpoints"][0].update(bearerTokenSecrets={}),
     r"endpoints\[0\]: unknown field 'bearerTokenSecrets'"),
    (("examples/gateway", "HTTPRoute", "vllm-route"), lambda o: o["spec"]["rules"][0]["backendRefs"][0].pop("name"),
     r"backendRefs\[0\]: required field\(s\) missing: \['name'\]"),
], ids=["misspelt", "misplaced", "required", "type", "nested-type", "crd-unknown", "crd-enum", "monitor-unknown",
        "crd-required"])
def test_the_strict_checks_catch_what_the_api_server_would_drop_or_refuse(
        where: tuple[str, str, str], mutate: Mutation, message: str) -> None:
    """The checker itself, on broken copies of rendered objects."""
    source, kind, name = where
    obj = copy.deepcopy(render(source).get(kind, name))
    mutate(obj)
    with pytest.raises(StrictError, match=message):
        load(obj)


@pytest.mark.parametrize("name", EPP_OVERLAYS)
def test_rbac_subjects_and_config_maps_resolve(name: str) -> None:
    """Bindings name the ServiceAccount in its namespace, roles that exist, and volumes name ConfigMaps that exist
    (kustomize renames generated ConfigMaps with a hash; a stale reference would not be renamed)."""
    rendered = render(name)
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        for binding in rendered.all(kind):
            assert rendered.has(binding["roleRef"]["kind"], binding["roleRef"]["name"]), binding["roleRef"]
            for subject in binding["subjects"]:
                sa = rendered.get("ServiceAccount", subject["name"])
                assert subject["namespace"] == sa["metadata"]["namespace"] == "inference"
    for workload in rendered.all("Deployment"):
        for volume in workload["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in volume:
                assert rendered.has("ConfigMap", volume["configMap"]["name"]), volume


# -- EPP's command line -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", EPP_OVERLAYS)
def test_epp_args_are_known_flags_that_epp_serve_parses(name: str) -> None:
    rendered = render(name)
    flags = epp_flags(container(rendered, "epp", "epp"))
    parser = serve_parser()
    unknown = sorted(set(flags) - set(parser._option_string_actions))
    assert not unknown, f"{name}: flags epp serve does not have (argparse would take a prefix): {unknown}"
    args = build_parser().parse_args(["serve", *(f"{k}={v}" for k, v in flags.items())])
    assert args.pool == "vllm-pool" and args.pool_namespace == "inference"
    assert args.grpc_port == 9002 and args.health_port == 9003 and args.metrics_port == 9090


@pytest.mark.parametrize("name", EPP_OVERLAYS)
def test_the_config_file_is_the_config_maps_key_and_stays_config_default(name: str) -> None:
    rendered = render(name)
    epp = container(rendered, "epp", "epp")
    path = epp_flags(epp)["--config-file"]
    mounts = {mount: cm for mount, cm in epp.config_maps()}
    directory, _, key = path.rpartition("/")
    assert directory in mounts, f"--config-file {path} is not in a mounted ConfigMap ({mounts})"
    data = rendered.get("ConfigMap", mounts[directory])["data"]
    assert data[key] == (ROOT / "config" / "default.yaml").read_text()


def test_the_manifests_copy_of_the_config_is_byte_identical() -> None:
    assert (MANIFESTS / "base" / "default.yaml").read_bytes() == (ROOT / "config" / "default.yaml").read_bytes()


@pytest.mark.parametrize("name", EPP_OVERLAYS)
def test_ports_in_args_match_container_ports_probes_and_the_service(name: str) -> None:
    rendered = render(name)
    epp = container(rendered, "epp", "epp")
    flags = epp_flags(epp)
    ports = epp.container_ports()
    opened = {PORT_FLAGS[f]: int(v) for f, v in flags.items() if f in PORT_FLAGS}
    assert opened == ports, f"{name}: ports EPP opens {opened} != containerPorts {ports}"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert epp.spec[probe]["grpc"]["port"] == ports["grpc-health"], probe
    service = rendered.get("Service", "epp")
    assert service["spec"]["selector"].items() <= epp.workload["spec"]["template"]["metadata"]["labels"].items()
    by_target = {p["targetPort"]: p for p in service["spec"]["ports"]}
    assert set(by_target) == set(ports), f"{name}: Service ports {sorted(by_target)} != containerPorts"
    for port_name, port in by_target.items():
        assert port["name"] == port_name and port["port"] == ports[port_name]
        assert port["appProtocol"] == ("http2" if port_name in ("grpc-ext-proc", "grpc-xds") else
                                       "kubernetes.io/h2c" if port_name == "grpc-health" else "http")
    for pool in rendered.all("InferencePool"):
        ref = pool["spec"]["endpointPickerRef"]
        assert ref["name"] == "epp" and ref["port"]["number"] == by_target["grpc-ext-proc"]["port"]


@pytest.mark.parametrize("name", EPP_OVERLAYS)
def test_probes_use_the_health_service_names_epp_answers(name: str) -> None:
    """``liveness`` for startup and liveness (SERVING while the process runs, so a pool that does not exist yet
    does not restart EPP), ``readiness`` for readiness (synced, and the leader with leader election): the only
    names that stay valid with ``--ha-enable-leader-election``, where other names answer SERVICE_UNKNOWN."""
    epp = container(render(name), "epp", "epp")
    assert epp.spec["startupProbe"]["grpc"]["service"] == "liveness"
    assert epp.spec["livenessProbe"]["grpc"]["service"] == "liveness"
    assert epp.spec["readinessProbe"]["grpc"]["service"] == "readiness"


@pytest.mark.parametrize("name", EPP_OVERLAYS)
def test_pods_run_hardened_and_grace_covers_drain_and_shutdown(name: str) -> None:
    rendered = render(name)
    epp = container(rendered, "epp", "epp")
    args = build_parser().parse_args(["serve", *(f"{k}={v}" for k, v in epp_flags(epp).items())])
    grace = epp.pod_spec["terminationGracePeriodSeconds"]
    assert grace > args.drain_timeout + args.shutdown_grace, "the kubelet would SIGKILL EPP while it drains"
    for workload in rendered.all("Deployment"):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert epp.pod_spec["securityContext"]["runAsUser"] == 65532
    tmp = [m for m in epp.spec["volumeMounts"] if m["mountPath"] == "/tmp"]
    volumes = {v["name"]: v for v in epp.pod_spec["volumes"]}
    assert tmp and "emptyDir" in volumes[tmp[0]["name"]], "EPP writes its TLS key files under /tmp"


# -- one overlay at a time ------------------------------------------------------------------------------------------


def test_base_runs_one_replica_with_a_pdb_that_never_blocks_a_drain() -> None:
    rendered = render("base")
    assert rendered.get("Deployment", "epp")["spec"]["replicas"] == 1
    pdb = rendered.get("PodDisruptionBudget", "epp")["spec"]
    assert pdb["maxUnavailable"] == 1 and "minAvailable" not in pdb
    granted = resource_grants(subjects_rules(rendered, "epp", "inference"))
    assert not any(resource == "leases" for _, _, resource in granted), "leases belong to the ha component"


def test_ha_runs_two_replicas_with_leader_election_leases_and_a_pdb() -> None:
    rendered = render("overlays/ha")
    deployment = rendered.get("Deployment", "epp")
    assert deployment["spec"]["replicas"] == 2
    assert epp_flags(container(rendered, "epp", "epp"))["--ha-enable-leader-election"] == "true"
    # Only the leader is Ready: a rollout that waits for new Ready pods before stopping old ones would never end.
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == "100%"
    pdb = rendered.get("PodDisruptionBudget", "epp")["spec"]
    assert pdb["minAvailable"] == 1 and "maxUnavailable" not in pdb
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow", "the never-Ready follower must stay evictable"
    role = rendered.get("Role", "epp-leader-election")
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "create", "update"]}]


def test_the_service_monitor_scrapes_with_a_token_allowed_to_get_metrics() -> None:
    """ServiceMonitor -> Secret -> its ServiceAccount -> a ClusterRoleBinding -> GET /metrics, and the endpoint's
    port is EPP's metrics port with the token check on."""
    rendered = render("base")
    monitor = rendered.get("ServiceMonitor", "epp")
    service = rendered.get("Service", "epp")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["port"] == "http-metrics"
    secret = rendered.get("Secret", endpoint["authorization"]["credentials"]["name"])
    assert secret["type"] == "kubernetes.io/service-account-token"
    account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert url_grants(subjects_rules(rendered, account, "inference")) == {("/metrics", "get")}
    assert epp_flags(container(rendered, "epp", "epp"))["--metrics-endpoint-auth"] == "true"


def test_the_simulated_pool_is_selected_by_its_inference_pool_on_the_sims_port() -> None:
    rendered = render("overlays/simulated-pool")
    pool = rendered.get("InferencePool", "vllm-pool")
    sim = container(rendered, "epp-sim", "epp-sim")
    labels = sim.workload["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == list(sim.container_ports().values())
    argv = sim.argv("epp-sim-0")
    assert argv[0] == "epp-sim"
    configs, ports = build_configs(parse_args(argv[1:]))
    assert ports == [8000] and configs[0].model == "sim-model"
    assert sim.spec["image"] == container(rendered, "epp", "epp").spec["image"] == "epp:latest"


def test_the_envoy_bootstrap_is_what_the_documented_command_generates(tmp_path: Path) -> None:
    """``components/envoy/envoy.yaml`` is the output of the command in its kustomization.yaml, byte for byte."""
    component = MANIFESTS / "components" / "envoy"
    command = envoy_config_command()
    assert command[:2] == ["epp", "envoy-config"]
    assert command[-2:] == ["-o", "config/manifests/components/envoy/envoy.yaml"]
    out = tmp_path / "envoy.yaml"
    done = subprocess.run([sys.executable, "-m", "epp.cli.main", *command[1:-2], "-o", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == (component / "envoy.yaml").read_bytes(), "regenerate envoy.yaml with the command"
    rendered = render("overlays/envoy")
    config_map = rendered.get("ConfigMap", "epp-envoy-config")
    assert config_map["data"]["envoy.yaml"] == out.read_text()
    envoy = container(rendered, "epp-envoy", "envoy")
    assert envoy.argv("epp-envoy-0")[:3] == ["envoy", "--config-path", "/etc/envoy/envoy.yaml"]
    listener = yaml.safe_load(out.read_text())["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert envoy.container_ports() == {"http": listener["port_value"]}
    mounts = dict(envoy.config_maps())
    assert mounts == {"/etc/envoy": config_map["metadata"]["name"]}
    flags = epp_flags(container(rendered, "epp", "epp"))
    assert ("--epp", f"epp:{flags['--grpc-port']}") in zip(command, command[1:])
    assert ("--xds", f"epp:{flags['--xds-port']}") in zip(command, command[1:])
    binary = find_envoy()
    if binary is not None:  # Envoy itself loads it (names are not resolved in validate mode)
        done = subprocess.run([str(binary), "--mode", "validate", "-c", str(out), "--log-level", "error"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_scheduler_configuration_calls_epps_extender_service() -> None:
    rendered = render("overlays/scheduler-extender")
    config = yaml.safe_load(rendered.get("ConfigMap", "epp-scheduler-config")["data"]["kube-scheduler-config.yaml"])
    check_schema(config, schema("kubescheduler-config-v1.yaml"), "KubeSchedulerConfiguration")
    (extender,) = config["extenders"]
    service = rendered.get("Service", "epp")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http-extender")
    assert extender["urlPrefix"] == f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port}"
    assert (extender["filterVerb"], extender["prioritizeVerb"]) == ("filter", "prioritize")
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is True and extender["weight"] > 0
    flags = epp_flags(container(rendered, "epp", "epp"))
    assert int(flags["--scheduler-extender-port"]) == port


def test_the_example_route_sends_to_the_example_pool_through_the_example_gateway() -> None:
    rendered: Rendered = render("examples")
    route = rendered.get("HTTPRoute", "vllm-route")
    gateway = rendered.get("Gateway", "inference-gateway")
    pool = rendered.get("InferencePool", "vllm-pool")
    (parent,) = route["spec"]["parentRefs"]
    assert (parent["kind"], parent["name"]) == ("Gateway", gateway["metadata"]["name"])
    assert parent["sectionName"] in {listener["name"] for listener in gateway["spec"]["listeners"]}
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io", "InferencePool", pool["metadata"]["name"])
    assert {o["metadata"]["namespace"] for o in rendered.objects} == {"inference"}
