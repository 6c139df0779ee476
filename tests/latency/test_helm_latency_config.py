"""The reference Helm chart's latency-predictor config (``inferenceExtension.latencyPredictor.enabled``, rendered in
``tests/fixtures/configs/gie/helm_latency-predictor-rendered.yaml``) loads unchanged and wires the whole family:
the producer runs after the prefix producer it reads, the profile filters strict affinity → SLO tier → loose
affinity, scores by latency headroom, picks weighted-random, and the admitter is asked before scheduling."""

from __future__ import annotations

from pathlib import Path

from epp.config.loader import build_pipeline, load_raw
from epp.runtime.builtins import default_registry

RENDERED = Path(__file__).parent.parent / "fixtures/configs/gie/helm_latency-predictor-rendered.yaml"


def test_the_helm_latency_predictor_config_loads_and_wires_the_family() -> None:
    pipeline = build_pipeline(*load_raw(RENDERED.read_text(), str(RENDERED)), default_registry(entry_points=False))
    profile = pipeline.scheduler.profiles["default"]
    assert [f.name for f in profile.filters] == ["strict-affinity-filter", "slo-headroom-tier-filter",
                                                 "loose-affinity-filter"]
    assert [(ws.scorer.name, ws.weight) for ws in profile.scorers] == [("latency-scorer", 1.0)]
    assert profile.picker is not None and profile.picker.type_name == "weighted-random-picker"
    assert [a.type_name for a in pipeline.admitters] == ["latency-slo-admitter"]
    producers = [p.type_name for p in pipeline.scheduler.producers]
    assert producers.index("approx-prefix-cache-producer") < producers.index("predicted-latency-producer")
    [strict, _, loose] = profile.filters
    assert (strict.params.affinity_threshold, loose.params.affinity_threshold) == (0.99, 0.80)
