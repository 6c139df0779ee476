"""The current reference's metric names (llm-d-router ``pkg/epp/metrics``, ``llm_d_router_metrics.go``, subsystem
``llm_d_epp``): which ``llm_d_epp_*`` family stands for each legacy one, and a check of an exposition against it."""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

LLMD = "llm_d_epp_"
_FP = ("fairness_id", "priority")

_FLOW = ("request_queue_duration_seconds", "request_enqueue_duration_seconds", "dispatch_cycle_duration_seconds",
         "queue_size", "queue_bytes", "pool_saturation")

# legacy family (as the text parser names it: counters without ``_total``) -> (its llm-d family, legacy label ->
# llm-d label, whether the legacy HELP starts with "[Deprecated: Use <llm-d name>] "): same labels, same series.
RENAMED: dict[str, tuple[str, dict[str, str], bool]] = {
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

# legacy request family -> (its llm-d family, the llm-d labels the legacy one lacks): the same observations, whose
# llm-d series summed over those labels are the legacy series. Legacy HELP: "[Deprecated: Use <llm-d name>] ...".
SPLIT: dict[str, tuple[str, tuple[str, ...]]] = {
    "inference_objective_request": (LLMD + "request", ("fairness_id",)),
    "inference_objective_request_error": (LLMD + "request_error", _FP),
    "inference_objective_request_duration_seconds": (LLMD + "request_duration_seconds", _FP),
    "inference_objective_request_sizes": (LLMD + "request_size_bytes", _FP),
    "inference_objective_response_sizes": (LLMD + "response_size_bytes", _FP),
    "inference_objective_input_tokens": (LLMD + "request_input_tokens", _FP),
    "inference_objective_output_tokens": (LLMD + "request_output_tokens", _FP),
    "inference_objective_prompt_cached_tokens": (LLMD + "request_cached_tokens", _FP),
    "inference_objective_running_requests": (LLMD + "request_running", ("target_model_name", *_FP)),
    "inference_objective_normalized_time_per_output_token_seconds": (LLMD + "request_ntpot_seconds", _FP),
}

# llm-d families with no legacy one (EPP-observed latency, as the reference records it).
NEW_ONLY = {LLMD + n for n in ("request_ttft_seconds", "request_streaming_tpot_seconds",
                               "request_streaming_itl_seconds", "std_dev_kv_cache_utilization", "std_dev_queue_size",
                               "std_dev_running_requests", "endpoint_ejections", "ejected_endpoints")}

LEGACY_HELP = {
    "inference_pool_ready_pods": "The number of ready pods in the inference server pool.",
    "inference_pool_per_pod_queue_size": "The total number of requests pending in the model server queue for each "
                                         "underlying pod.",
}


def check_llmd_twins(text: str) -> set[str]:
    """Assert that every legacy family of the text exposition ``text`` has its llm-d family with the same type and
    (RENAMED) HELP (the legacy one marked Deprecated where the reference marks it) and samples (label names
    renamed), or (SPLIT) samples that summed over the llm-d family's extra labels are the legacy ones. Every llm-d
    family must be one of these or NEW_ONLY. Returns the legacy families checked."""
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
    for legacy, (new, extra) in SPLIT.items():
        if legacy not in fams:
            continue
        old, llmd = fams[legacy], fams[new]
        full = new + ("_total" if old.type == "counter" else "")
        assert old.type == llmd.type and old.documentation.startswith(f"[Deprecated: Use {full}] "), legacy
        summed: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
        for s in llmd.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in extra))
            summed[(s.name.replace(new, legacy, 1), labels)] += s.value
        legacy_samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in old.samples}
        assert summed.keys() == legacy_samples.keys(), legacy
        assert all(summed[k] == pytest.approx(v) for k, v in legacy_samples.items()), legacy  # summed in another order
        checked.add(legacy)
    known = {new for new, _, _ in RENAMED.values()} | {new for new, _ in SPLIT.values()} | NEW_ONLY
    latency = {LLMD + n for n in ("request_predicted_ttft_seconds", "request_tpot_seconds",
                                  "request_predicted_tpot_seconds", "request_slo_violation")}
    assert {n for n in fams if n.startswith(LLMD)} <= known | latency
    assert not any(n.startswith("llm_d_router_epp_") for n in fams)
    return checked
