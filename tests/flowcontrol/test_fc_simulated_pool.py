"""The fairness contract end to end in process: the real background dispatcher in front of a simulated pool.

Uses ``bench.fairness`` (virtual time, seeded), so the run is deterministic and takes no wall-clock waiting.
"""

from __future__ import annotations

import pytest

from bench.fairness import SimSettings, run_scenario

SHORT = SimSettings(seconds=40.0, warmup=10.0)


@pytest.fixture(scope="module")
def weighted() -> dict:
    return run_scenario(SHORT, ("weighted-fair-fairness-policy",))


def test_weighted_fair_shares_the_saturated_pool_two_to_one(weighted: dict) -> None:
    flood, steady = weighted["flood"], weighted["steady"]
    share = steady.served / (steady.served + flood.served)
    assert share == pytest.approx(2 / 3, rel=0.1)
    assert steady.rejected == 0 and flood.rejected > 0  # the flood hits its maxQueued, the steady tenant never


def test_steady_tenant_wait_stays_bounded_while_the_flood_queues(weighted: dict) -> None:
    steady, flood = weighted["steady"], weighted["flood"]
    assert max(steady.waits) < 2.0 < min(flood.waits)


def test_without_flow_control_the_flood_takes_the_pool() -> None:
    off = run_scenario(SHORT, None)
    assert off["steady"].served < 0.1 * off["flood"].served and off["flood"].rejected == 0
