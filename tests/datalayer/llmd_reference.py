"""The current reference's metric names (llm-d-router ``pkg/epp/metrics``, ``llm_d_router_metrics.go``): which
``llm_d_router_epp_*`` family stands for each legacy one, and a check of an exposition against it."""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

LLMD = "llm_d_router_epp_"
NTPOT = "normalized_time_per_output_token_seconds"

_OBJECTIVE = ("request", "request_error", "request_duration_seconds", "request_sizes", "response_sizes",
              "input_tokens", "output_tokens", "prompt_cached_tokens", "running_requests")
_FLOW = ("request_queue_duration_seconds", "request_enqueue_duration_seconds", "dispatch_cycle_duration_seconds",
         "queue_size", "queue_bytes", "pool_saturation")

# legacy family (as the text parser names it: counters without ``_total``) -> (its llm-d family, legacy label ->
# llm-d label, whether the legacy HELP starts with "[Deprecated: Use <llm-d name>] "). The HELP text after that
# mark is the llm-d family's, except where LEGACY_HELP gives the reference's own wording.
RENAMED: dict[str, tuple[str, dict[str, str], bool]] = {
    **{f"inference_objective_{n}": (LLMD + n, {}, True) for n in _OBJECTIVE},
    "inference_pool_ready_pods": (LLMD + "ready_endpoints", {}, True),
    **{f"inference_pool_{n}": (LLMD + n, {}, True)
       for n in ("average_kv_cache_utilization", "average_queue_size", "average_running_requests")},
    "inference_pool_per_pod_queue_size": (LLMD + "per_endpoint_queue_size",
                                          {"model_server_pod": "model_server_endpoint"}, False),
    "inference_extension_scheduler_e2e_duration_seconds": (LLMD + "scheduler_e2e_duration_seconds", {}, True),
    "inference_extension_scheduler_attempts": (LLMD + "scheduler_attempts", {"pod_name": "endpoint_name"}, True),
    "inference_extension_plugin_duration_seconds": (LLMD + "plugin_duration_seconds", {}, True),
    "inference_extension_model_rewrite_decisions": (LLMD + "model_rewrite_decisions", {}, False),
    "inference_extension_info": (LLMD + "info", {}, False),
    **{f"inference_extension_flow_control_{n}": (f"{LLMD}flow_control_{n}", {}, True) for n in _FLOW},
    "llm_d_inference_scheduler_datalayer_poll_errors": (LLMD + "datalayer_poll_errors", {}, True),
    "llm_d_inference_scheduler_datalayer_extract_errors": (LLMD + "datalayer_extract_errors", {}, True),
}


LEGACY_HELP = {
    "inference_pool_ready_pods": "The number of ready pods in the inference server pool.",
    "inference_pool_per_pod_queue_size": "The total number of requests pending in the model server queue for each "
                                         "underlying pod.",
}


def check_llmd_twins(text: str) -> set[str]:
    """Assert that every legacy family of the text exposition ``text`` has its llm-d family with the same type,
    HELP (the legacy one marked Deprecated where the reference marks it) and samples (label names renamed); the
    NTPOT family's llm-d twin has two more labels, so its samples are compared summed over them. Every llm-d
    family must be one of these. Returns the legacy families checked."""
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    checked = set()
    for legacy, (new, renames, marked) in RENAMED.items():
        if legacy not in fams:
            continue
        old, twin = fams[legacy], fams[new]
        full = new + ("_total" if old.type == "counter" else "")
        help_text = LEGACY_HELP.get(legacy, twin.documentation)
        assert (old.type, old.documentation) == (twin.type, (f"[Deprecated: Use {full}] " if marked else "")
                                                 + help_text), legacy
        renamed = sorted((s.name.replace(legacy, new, 1), sorted((renames.get(k, k), v) for k, v in s.labels.items()),
                          s.value) for s in old.samples)
        assert renamed == sorted((s.name, sorted(s.labels.items()), s.value) for s in twin.samples), legacy
        checked.add(legacy)
    legacy_ntpot = "inference_objective_" + NTPOT
    if legacy_ntpot in fams:
        old, twin = fams[legacy_ntpot], fams[LLMD + NTPOT]
        assert old.documentation == f"[Deprecated: Use {LLMD}{NTPOT}] {twin.documentation}"
        summed: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
        for s in twin.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("fairness_id", "priority")))
            summed[(s.name.replace(LLMD, "inference_objective_", 1), labels)] += s.value
        legacy_samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in old.samples}
        assert summed.keys() == legacy_samples.keys()
        assert all(summed[k] == pytest.approx(v) for k, v in legacy_samples.items())  # sums in another order
        checked.add(legacy_ntpot)
    known = {new for new, _, _ in RENAMED.values()} | {LLMD + NTPOT}
    latency = {LLMD + n for n in ("request_ttft_seconds", "request_predicted_ttft_seconds", "request_tpot_seconds",
                                  "request_predicted_tpot_seconds", "request_slo_violation")}
    assert {n for n in fams if n.startswith(LLMD)} <= known | latency
    return checked
