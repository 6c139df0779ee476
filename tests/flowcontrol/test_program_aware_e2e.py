"""``program-aware-fairness`` end to end: EppApp's HTTP gateway with flow control over two simulated servers, two
programs (fairness ids) kept backlogged on a saturated pool: ``heavy`` sends long prompts with long answers,
``light`` short ones. Under ``las`` the program with less attained service (weighted tokens) goes first, so light
gets many more requests served than heavy; the control, ``round-robin-fairness-policy`` on the same load, serves
the two about equally often."""

from __future__ import annotations

from pathlib import Path

import orjson

from bench.tenant_load import Tenant, drive_tenants, simulated_gateway

CONFIG = """\
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters: {maxConcurrency: 2}
- type: POLICY
saturationDetector: {pluginRef: concurrency-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
flowControl:
  defaultPriorityBand: {fairnessPolicyRef: POLICY}
  tenants:
    defaults: {maxQueued: 500}
"""

TARGET_COMPLETIONS = 120
BODIES = {
    "heavy": orjson.dumps({"model": "m", "prompt": "heavy program prompt " * 60, "max_tokens": 48}),
    "light": orjson.dumps({"model": "m", "prompt": "light", "max_tokens": 4}),
}


async def test_las_serves_the_light_program_more_than_round_robin(tmp_path: Path) -> None:
    las, attained = await _run(tmp_path, "program-aware-fairness")
    rr, _ = await _run(tmp_path, "round-robin-fairness-policy")
    las_ratio, rr_ratio = las["light"] / max(1, las["heavy"]), rr["light"] / max(1, rr["heavy"])
    print("las", las, round(las_ratio, 2), "rr", rr, round(rr_ratio, 2), "attained", attained)
    assert rr_ratio < 2.0, rr
    assert las_ratio > 2 * rr_ratio and las_ratio >= 3.0, (las, rr)
    # the plugin's metrics reach the app's registry, under the reference's names
    assert attained["heavy"] is not None and attained["light"] is not None
    assert attained["heavy"] > attained["light"] > 0


async def _run(tmp_path: Path, policy: str) -> tuple[dict[str, int], dict[str, float | None]]:
    config = tmp_path / f"{policy}.yaml"
    config.write_text(CONFIG.replace("POLICY", policy))
    async with simulated_gateway(config) as app:
        served = await _drive(app.gateway.url)
        attained = {p: app.metrics_registry.get_sample_value("llm_d_epp_program_aware_attained_service_tokens",
                                                             {"program_id": p}) for p in BODIES}
        return served, attained


async def _drive(url: str) -> dict[str, int]:
    """Eight closed-loop clients per program (more than the pool's 4 slots) until enough completions."""
    results = await drive_tenants(url, {p: Tenant(body, 8) for p, body in BODIES.items()}, TARGET_COMPLETIONS)
    return {p: r.served for p, r in results.items()}
