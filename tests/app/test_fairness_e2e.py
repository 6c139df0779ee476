"""Flow control end to end: HTTP gateway + simulator, a flooding tenant (weight 1) against a steady tenant
(weight 2) on a saturated pool. The steady tenant gets about twice the service and waits less."""

from __future__ import annotations

from pathlib import Path

import orjson

from bench.tenant_load import Tenant, drive_tenants, simulated_gateway

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters: {maxConcurrency: 3}
- type: weighted-fair-fairness-policy
saturationDetector: {pluginRef: concurrency-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
flowControl:
  priorityBands:
  - {priority: 0, fairnessPolicyRef: weighted-fair-fairness-policy}
  tenants:
    defaults: {weight: 1, maxQueued: 500}
    flood: {weight: 1}
    steady: {weight: 2}
"""

TARGET_COMPLETIONS = 180


async def test_weighted_fair_share_under_saturation(tmp_path: Path) -> None:
    served, latency = await _run(tmp_path, CONFIG)
    ratio = served["steady"] / served["flood"]
    print("served", served, "ratio", round(ratio, 2))
    assert 1.6 <= ratio <= 2.5, (served, ratio)
    p99 = {t: sorted(v)[int(len(v) * 0.99) - 1] for t, v in latency.items()}
    print("p99 latency", p99)
    assert p99["steady"] < p99["flood"], p99


async def test_without_flow_control_share_follows_client_count_not_weight(tmp_path: Path) -> None:
    """Control: the same load with the gate off; 12 steady vs 16 flood clients get roughly 12:16."""
    served, _ = await _run(tmp_path, CONFIG.replace("featureGates: [flowControl]\n", ""))
    ratio = served["steady"] / served["flood"]
    assert ratio < 1.2, (served, ratio)


async def _run(tmp_path: Path, text: str) -> tuple[dict[str, int], dict[str, list[float]]]:
    config = tmp_path / "fc.yaml"
    config.write_text(text)
    async with simulated_gateway(config) as app:
        return await _drive(app.gateway.url)


async def _drive(url: str) -> tuple[dict[str, int], dict[str, list[float]]]:
    """Both tenants stay backlogged (more closed-loop clients than the pool's 6 slots) until enough completions."""
    body = orjson.dumps({"model": "m", "prompt": "fairness " * 20, "max_tokens": 8})
    results = await drive_tenants(url, {"flood": Tenant(body, 16), "steady": Tenant(body, 12)}, TARGET_COMPLETIONS)
    return {t: r.served for t, r in results.items()}, {t: r.latencies for t, r in results.items()}
