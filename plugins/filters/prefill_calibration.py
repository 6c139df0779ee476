"""The peak-prefill calibration record ``prefix-cache-affinity-filter`` may take its ``peakPrefillThroughput`` from
(llm-d-router's ``prefixcacheaffinity/calibration.go``).

The effective throughput follows ``explicit peakPrefillThroughput > fingerprint-matched record > default``. A record
(JSON, written by llm-d's calibration recipe) is applied only when it is a complete measurement::

    schema_version == 1, status == "OK", valid_samples >= 10,
    peak_prefill_tokens_per_second and median_ttft_seconds positive and finite, chunk_tokens > 0,
    fingerprint non-empty and equal to the configured prefillCalibrationFingerprint

Anything else leaves the default, with the reason; ``prefillCalibrationRequired`` makes that reason a config error.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["SCHEMA_VERSION", "MIN_SAMPLES", "CalibrationSkipped", "calibrated_throughput"]

SCHEMA_VERSION = 1
MIN_SAMPLES = 10


class CalibrationSkipped(Exception):
    """A configured calibration that cannot be applied; the message says why."""


def _positive_finite(record: dict[str, Any], key: str) -> float:
    value = record.get(key)
    if value is None:
        raise CalibrationSkipped(f"{key} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise CalibrationSkipped(f"{key} is not a positive finite number: {value!r}")
    return float(value)


def _check_usable(record: dict[str, Any]) -> float:
    """The record's throughput if it is a complete measurement, else :class:`CalibrationSkipped`."""
    if record.get("schema_version") != SCHEMA_VERSION:
        raise CalibrationSkipped(f"schema_version is {record.get('schema_version')!r}, want {SCHEMA_VERSION}")
    if record.get("status") != "OK":
        raise CalibrationSkipped(f"status is {record.get('status')!r}, want 'OK'")
    throughput = _positive_finite(record, "peak_prefill_tokens_per_second")
    chunk = record.get("chunk_tokens")
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk <= 0:
        raise CalibrationSkipped("chunk_tokens is missing or not positive")
    samples = record.get("valid_samples", 0)
    if not isinstance(samples, int) or samples < MIN_SAMPLES:
        raise CalibrationSkipped(f"valid_samples is {samples!r}, want at least {MIN_SAMPLES}")
    _positive_finite(record, "median_ttft_seconds")
    return throughput


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except OSError as exc:
        raise CalibrationSkipped(f"cannot read {path}: {exc}") from exc
    except ValueError as exc:
        raise CalibrationSkipped(f"malformed calibration record {path}: {exc}") from exc
    if not isinstance(record, dict):
        raise CalibrationSkipped(f"malformed calibration record {path}: not a JSON object")
    return record


def calibrated_throughput(path: str, fingerprint: str, required: bool) -> float | None:
    """The throughput of the record at ``path`` if it applies to ``fingerprint``; ``None`` when no file is set.

    Raises :class:`CalibrationSkipped` when a configured record cannot be applied (or ``required`` is set without a
    file); the caller falls back to the default unless ``required``.
    """
    if not path:
        if required:
            raise CalibrationSkipped("prefillCalibrationRequired is set but prefillCalibrationFile is empty")
        return None
    record = _load(path)
    throughput = _check_usable(record)
    measured = record.get("fingerprint") or ""
    if not measured:
        raise CalibrationSkipped("record carries no fingerprint")
    if not fingerprint:
        raise CalibrationSkipped("no prefillCalibrationFingerprint is configured for this deployment")
    if measured != fingerprint:
        raise CalibrationSkipped(f"record was measured on a different deployment: fingerprint {measured!r}, "
                                 f"want {fingerprint!r}")
    return throughput
