"""``slo-deadline-ordering-policy``: the ``x-llm-d-router-slo-ttft-ms`` header (and its deprecated alias
``x-slo-ttft-ms``) as the reference parses it, the dispatch order it gives (through the controller, and end to end
through EPP's gateway in front of the simulator), and its config."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import ClassVar

import aiohttp
import orjson
import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.flowcontrol import FlowController
from epp.flowcontrol.policies import BUILTIN_ORDERING, SLO_TTFT_HEADER, SloDeadlineOrdering, slo_ttft_ms
from epp.framework.endpoint import EndpointSpec
from epp.framework.plugins import Handle, SchedulingResult
from epp.framework.request import InferenceRequest
from epp.plugins.flowcontrol import SloDeadlineOrderingPolicy
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.builtins import default_registry
from epp_sim import SimConfig, SimPool

from ..conftest import eventually
from .helpers import Clients, FakeClock, FakeDetector, controller

MAX_MS = (2**63 - 1) // 1_000_000


@pytest.mark.parametrize("value, ms", [
    ("250", 250), ("0", 0), ("-0", 0), ("+7", 7), ("007", 7), (" 40\t", 40), ("\u00a040\u3000", 40),
    (str(MAX_MS), MAX_MS),
    (None, None), ("", None), ("   ", None), ("abc", None), ("1.5", None), ("1e3", None), ("1_000", None),
    ("0x10", None), ("1 000", None), ("-1", None), ("\u0661\u0662", None), ("\x1c5", None),
    (str(MAX_MS + 1), None), ("9223372036854775808", None),
], ids=["plain", "zero", "minus-zero", "plus-sign", "leading-zeros", "ascii-space", "unicode-space", "largest",
        "missing", "empty", "blank", "word", "fraction", "exponent", "underscore", "hex", "inner-space",
        "negative", "arabic-digits", "separator-not-trimmed", "duration-overflow", "int64-overflow"])
def test_header_parses_as_go_parse_int_base_10(value: str | None, ms: int | None) -> None:
    headers = {} if value is None else {SLO_TTFT_HEADER: value}
    assert slo_ttft_ms(headers) == ms


@pytest.mark.parametrize("headers, ms", [
    ({"x-llm-d-router-slo-ttft-ms": "12"}, 12),
    ({"x-slo-ttft-ms": "12"}, 12),
    ({"x-llm-d-router-slo-ttft-ms": "3", "x-slo-ttft-ms": "12"}, 3),
    ({"x-llm-d-router-slo-ttft-ms": "", "x-slo-ttft-ms": "12"}, None),
    ({"x-llm-d-router-slo-tpot-ms": "12", "x-slo-tpot-ms": "12"}, None),
], ids=["current-name", "deprecated-alias", "both-current-wins", "present-empty-current-wins", "tpot-is-not-ttft"])
def test_current_name_first_then_the_deprecated_alias(headers: dict[str, str], ms: int | None) -> None:
    # As the reference's GetLowerCaseHeaderValue: the first name present decides, even with an empty value. The
    # names are lower-case here as both front ends deliver them (the end-to-end test sends mixed case).
    assert slo_ttft_ms(headers) == ms


def test_registered_for_configs_and_by_name_for_programmatic_use() -> None:
    plugin = default_registry(entry_points=False).create("slo-deadline-ordering-policy", "slo", None, Handle())
    assert isinstance(plugin, SloDeadlineOrderingPolicy) and plugin.name == "slo"
    assert isinstance(BUILTIN_ORDERING["slo-deadline-ordering-policy"], SloDeadlineOrdering)
    assert isinstance(BUILTIN_ORDERING["slo-deadline"], SloDeadlineOrdering)


# -- dispatch order through the controller ----------------------------------------------------------------------

def _band(fairness: str = "global-strict") -> dict:
    return {"priorityBands": [{"priority": 0, "fairnessPolicyRef": fairness, "orderingPolicyRef": "slo-deadline"}]}


async def _drain(cfg: dict, sends: list[tuple[float, str, str, str | None]]) -> list[str]:
    """Queue each ``(seconds after the previous, tenant, id, x-slo-ttft-ms)`` on a saturated pool, then dispatch one
    at a time; the ids in dispatch order."""
    clock, detector = FakeClock(), FakeDetector(1.0)
    clients = Clients(controller(cfg, clock=clock, detector=detector))
    for gap, tenant, rid, slo in sends:
        clock.advance(gap)
        await clients.send(tenant, request_id=rid, headers={} if slo is None else {SLO_TTFT_HEADER: slo})
    assert await clients.dispatch() == 0
    detector.value = 0.0
    for _ in sends:
        assert await clients.dispatch(limit=1) == 1
    return clients.order


async def test_earliest_slo_deadline_first_then_arrival_for_ties_and_requests_without_one() -> None:
    order = await _drain(_band(), [
        (0.0, "a", "tie-early", "1050"),   # deadline 1.050 s after the first arrival
        (0.5, "a", "none", None),
        (0.4, "a", "invalid", "soon"),
        (0.1, "a", "loose", "100"),        # 1.100
        (0.0, "a", "tie-late", "50"),      # 1.050 again: the earlier arrival goes first
        (0.02, "a", "tight", "10"),        # 1.030, though it arrived last but one
        (0.01, "a", "negative", "-5"),
    ])
    assert order == ["tight", "tie-early", "tie-late", "loose", "none", "invalid", "negative"]


async def test_the_reference_table() -> None:
    """The cases of the reference's ``TestSLODeadline_Less`` (B, C, A; E ties B with an earlier arrival; D last)."""
    order = await _drain(_band(), [
        (0.0, "a", "E", "1050"), (1.0, "a", "A", "100"), (0.0, "a", "B", "50"), (0.0, "a", "D", None),
        (0.02, "a", "C", "50"),
    ])
    assert order == ["E", "B", "C", "A", "D"]


async def test_global_strict_orders_across_flows_round_robin_within_each() -> None:
    sends = [(0.0, "x", "x-loose", "5000"), (0.1, "y", "y-none", None), (0.1, "x", "x-tight", "200"),
             (0.1, "y", "y-tight", "10")]
    assert await _drain(_band("global-strict"), sends) == ["y-tight", "x-tight", "x-loose", "y-none"]
    assert await _drain(_band("round-robin"), sends) == ["x-tight", "y-tight", "x-loose", "y-none"]


# -- end to end: EPP's gateway over a simulated server whose only slot is taken ---------------------------------

E2E_CONFIG = """\
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters: {maxConcurrency: 1}
- type: slo-deadline-ordering-policy
saturationDetector: {pluginRef: concurrency-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
flowControl:
  priorityBands:
  - {priority: 0, orderingPolicyRef: slo-deadline-ordering-policy}
"""

# Enqueued in this order, seconds apart at most; the SLOs are far enough apart that arrival gaps cannot matter. The
# header comes under its current name or its deprecated alias, in any case; with both, the current name decides
# (the alias's 1 ms would put "medium" first).
E2E_SENDS = [("loose", {"X-LLM-D-Router-SLO-TTFT-Ms": "600000"}), ("none", {}), ("tight", {"X-Slo-Ttft-Ms": "1000"}),
             ("invalid", {SLO_TTFT_HEADER: "soon"}), ("medium", {SLO_TTFT_HEADER: "60000", "x-slo-ttft-ms": "1"}),
             ("negative", {"x-slo-ttft-ms": "-1"})]
E2E_ORDER = ["tight", "medium", "loose", "none", "invalid", "negative"]


class DispatchRecorder:
    """PreRequest hook: request ids in the order EPP scheduled them (right after flow control admitted each)."""

    type_name: ClassVar[str] = "test-dispatch-recorder"

    def __init__(self) -> None:
        self.name = "dispatch-recorder"
        self.ids: list[str] = []

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self.ids.append(request.request_id)


async def _post(session: aiohttp.ClientSession, url: str, rid: str, slo: dict[str, str]) -> int:
    headers = {"content-type": "application/json", "x-request-id": rid, **slo}
    body = orjson.dumps({"model": "m", "prompt": "deadline", "max_tokens": 4})
    async with session.post(url + "/v1/completions", data=body, headers=headers) as resp:
        await resp.read()
        return resp.status


async def test_queued_requests_reach_the_simulator_in_slo_deadline_order(tmp_path: Path) -> None:
    config = tmp_path / "epp.yaml"
    config.write_text(E2E_CONFIG)
    async with SimPool([SimConfig(model="m", time_scale=0.01)]) as pool:
        [server] = pool.servers
        app = EppApp(ServeOptions(config=str(config), endpoints=[EndpointSpec("s0", "127.0.0.1", server.port)],
                                  host="127.0.0.1", grpc_port=None, health_port=None, metrics_port=None, http_port=0,
                                  refresh_interval=None))
        await app.start()
        recorder = DispatchRecorder()
        app.pipeline.pre_request.append(recorder)
        ctrl = app.admission
        assert isinstance(ctrl, FlowController)
        try:
            server.set_hung(True)  # the first request holds the only slot until the simulator answers again
            async with aiohttp.ClientSession() as session:
                url = app.gateway.url
                tasks = {"blocker": asyncio.create_task(_post(session, url, "blocker", {SLO_TTFT_HEADER: "0"}))}
                await eventually(lambda: recorder.ids == ["blocker"], "the blocker in flight")
                for n, (rid, slo) in enumerate(E2E_SENDS, 1):
                    tasks[rid] = asyncio.create_task(_post(session, url, rid, slo))
                    await eventually(lambda: ctrl.queued == n, f"{rid} queued")
                server.set_hung(False)
                statuses = {rid: await task for rid, task in tasks.items()}
        finally:
            await app.stop()
    assert statuses == dict.fromkeys(statuses, 200)
    assert recorder.ids == ["blocker", *E2E_ORDER]


# -- config -----------------------------------------------------------------------------------------------------

HEAD = "featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n"
DECLARED = HEAD + textwrap.dedent("""\
    - type: slo-deadline-ordering-policy
    flowControl:
      priorityBands:
      - {priority: 0, orderingPolicyRef: slo-deadline-ordering-policy}
    """)


def _load(text: str):  # type: ignore[no-untyped-def]
    return build_pipeline(*load_raw(text, "fc.yaml"), default_registry(entry_points=False))


def test_a_band_naming_the_declared_policy_uses_that_plugin() -> None:
    pipeline = _load(DECLARED)
    policy = pipeline.flow_policies.ordering["slo-deadline-ordering-policy"]
    assert isinstance(policy, SloDeadlineOrderingPolicy)
    assert policy is pipeline.handle.plugin("slo-deadline-ordering-policy")


def test_like_every_non_default_policy_it_must_be_declared() -> None:
    text = HEAD + "flowControl:\n  priorityBands: [{priority: 0, orderingPolicyRef: slo-deadline-ordering-policy}]\n"
    with pytest.raises(ConfigError, match="no ordering policy registered for name 'slo-deadline-ordering-policy'"):
        _load(text)


def test_a_parameter_is_an_error_naming_the_plugin_and_field() -> None:
    text = DECLARED.replace("- type: slo-deadline-ordering-policy\n",
                            "- type: slo-deadline-ordering-policy\n  parameters: {header: x-ttft}\n")
    with pytest.raises(ConfigError) as err:
        _load(text)
    assert (err.value.plugin, err.value.field, err.value.line) == ("slo-deadline-ordering-policy", "header", 5)
    assert "plugin 'slo-deadline-ordering-policy' (type: slo-deadline-ordering-policy)" in str(err.value)


@pytest.mark.parametrize("params, code", [("", 0), ("  parameters: {header: x-ttft}\n", 2)], ids=["ok", "bad"])
def test_check_config(tmp_path: Path, params: str, code: int) -> None:
    path = tmp_path / "fc.yaml"
    path.write_text(DECLARED.replace("- type: slo-deadline-ordering-policy\n",
                                     "- type: slo-deadline-ordering-policy\n" + params))
    res = subprocess.run([sys.executable, "-m", "epp.cli.main", "check-config", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == code, res.stderr
    if code == 0:
        assert "slo-deadline-ordering-policy" in res.stdout
    else:
        assert "fc.yaml:5" in res.stderr and "'header'" in res.stderr and "Traceback" not in res.stderr
