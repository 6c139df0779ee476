"""Model-server metric pages -> :class:`~epp.framework.endpoint.Metrics`.

An :class:`~epp.datalayer.engines.EngineConfig` says which series carry queue depth, running requests, KV-cache
usage, LoRA state, cache geometry and custom scalars for one engine; each field lists
:class:`~epp.datalayer.engines.MetricSpec` alternatives and the first one present on the page wins (so vLLM V1 and
V0 pages both read without configuration). Over the series a spec matches (data-parallel engines), queued and
running requests are summed and KV usage is the largest engine's; a non-finite value fails the scrape.
:func:`parse_targeted` (the one EPP uses: it only looks at the lines of the families it needs) and
:func:`parse_with_prometheus_client` (the cross-check) produce the same :class:`Metrics`. A page whose matched
lines do not parse raises :class:`MetricsParseError`; one lacking a required family, or with unusable values, its
subclass :class:`MetricsExtractError`.
"""

from __future__ import annotations

import functools
import math
import re
import time
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from epp.datalayer.engines import (
    BUILTIN_ENGINES,
    DEFAULT_ENGINE,
    CustomMetric,
    EngineConfig,
    MetricSpec,
    unescape_label_value,
)
from epp.framework.endpoint import LoraLoadState, Metrics

__all__ = [
    "MetricSpec", "EngineConfig", "Sample", "MetricsParseError", "MetricsExtractError", "BUILTIN_ENGINES",
    "DEFAULT_ENGINE",
    "SampleLookup", "ScanState", "parse_targeted", "parse_with_prometheus_client", "metrics_from_samples",
    "scan_family",
]


class MetricsParseError(ValueError):
    """The page cannot be turned into Metrics: a required family is missing or a matched line is malformed."""


class MetricsExtractError(MetricsParseError):
    """The page was read, but the engine's metrics cannot be taken from it: a required family is missing or its
    values are unusable."""


class Sample:
    """One series of a family: its labels (parsed on first access), value and optional timestamp (ms).

    The targeted parser keeps the raw ``{...}`` label block and parses it only if a consumer reads ``labels``
    (queue depth and running counts never do), so most matched lines cost one ``float()``.
    """

    __slots__ = ("_raw", "_labels", "value", "timestamp")

    def __init__(self, labels: Mapping[str, str] | bytes, value: float, timestamp: float | None = None) -> None:
        self._labels: Mapping[str, str] | None
        if isinstance(labels, bytes):
            self._raw, self._labels = labels, None
        else:
            self._raw, self._labels = b"", dict(labels)
        self.value = value
        self.timestamp = timestamp

    @property
    def labels(self) -> Mapping[str, str]:
        """The series' labels; ``MetricsParseError`` if the raw label block is malformed."""
        if self._labels is None:
            self._labels = _parse_labels(self._raw)
        return self._labels

    def __repr__(self) -> str:
        return f"Sample({dict(self.labels)!r}, {self.value!r}, {self.timestamp!r})"


SampleLookup = Callable[[str], "list[Sample]"]
"""``lookup(family_name)`` -> the family's samples on the page ([] if absent)."""


# --------------------------------------------------------------------------------------------------------------
# Targeted parser


def parse_targeted(page: bytes | str, config: EngineConfig, now: float | None = None,
                   state: ScanState | None = None) -> Metrics:
    """Parse only the families ``config`` needs from a Prometheus text page (0.0.4 or OpenMetrics).

    ``page`` is the raw body; bytes are parsed without decoding the page (only matched label blocks that a
    consumer reads are decoded, as UTF-8 with replacement). ``state`` (one per endpoint, kept across scrapes)
    makes repeated parses of the same server's pages cheaper; see :class:`ScanState`.
    """
    data = page.encode() if isinstance(page, str) else page
    cache: dict[str, list[Sample]] = {}

    def lookup(name: str) -> list[Sample]:
        found = cache.get(name)
        if found is None:
            if state is None:
                found = scan_family(data, name)
            else:
                found = state.scan(data, name, name in config.optional_families)
            cache[name] = found
        return found

    return metrics_from_samples(lookup, config, now)


_SAMPLE_START = frozenset(b"{ \t")
_HINT_WINDOW = 4096


class ScanState:
    """What one endpoint's previous pages taught the scanner; exact for well-formed pages.

    - *Position hints*: a family found at offset *h* last time is searched from *h* - 4 KiB (histogram values
      change the page's length only a little between scrapes), and verified to start its block; otherwise the
      normal search runs. Families near the end of a page (``vllm:cache_config_info``) no longer cost a scan
      of the whole page.
    - *Absent optional families* (LoRA info without ``--enable-lora``, cache info an engine does not export) are
      looked for again only every ``recheck`` pages (20 = once a second at 50 ms) instead of scanning the whole
      page for them on every scrape. Required families are always searched.
    """

    __slots__ = ("recheck", "_hints", "_absent")

    def __init__(self, recheck: int = 20) -> None:
        self.recheck = recheck
        self._hints: dict[str, int] = {}
        self._absent: dict[str, int] = {}

    def scan(self, data: bytes, name: str, optional: bool) -> list[Sample]:
        """The samples of family ``name`` (as :func:`scan_family`), using and updating the hints."""
        skipped = self._absent.get(name)
        if skipped is not None and skipped < self.recheck:
            self._absent[name] = skipped + 1
            return []
        start = _find_first(data, name.encode(), self._hints.get(name))
        if start < 0:
            self._hints.pop(name, None)
            if optional:
                self._absent[name] = 0
            return []
        self._absent.pop(name, None)
        self._hints[name] = start
        return _read_block(data, name, start)


def scan_family(data: bytes, name: str) -> list[Sample]:
    """The samples of family ``name`` on the page ([] if absent).

    ``bytes.find`` jumps to the family's first sample line, then the family's contiguous block is read (the
    exposition format requires a family's lines to be grouped). HELP/TYPE lines never match because they start
    with ``#``; histogram children (``_bucket``, ``_sum``...) and longer names never match a base name because
    the name must be followed by ``{`` or whitespace.
    """
    start = _find_first(data, name.encode(), None)
    return [] if start < 0 else _read_block(data, name, start)


def _find_first(data: bytes, bname: bytes, hint: int | None) -> int:
    """Offset of the first sample line of ``bname`` (-1 if absent); ``hint`` = its offset on an earlier page."""
    n = len(bname)
    if data.startswith(bname) and _is_sample(data, n):
        return 0
    needle = b"\n" + bname
    if hint is not None and hint > 2 * _HINT_WINDOW:  # near the top, the plain search is as cheap
        lo = hint - 1 - _HINT_WINDOW
        i = _find_needle(data, needle, n, lo, len(data))
        if i != -1:
            prev = data.rfind(b"\n", 0, i) + 1
            if not (data.startswith(bname, prev) and _is_sample(data, prev + n)):
                return i + 1  # the line before is not this family's: this is the block's first line
        else:
            i = _find_needle(data, needle, n, 0, lo + len(needle))
            return -1 if i == -1 else i + 1
    i = _find_needle(data, needle, n, 0, len(data))
    return -1 if i == -1 else i + 1


def _find_needle(data: bytes, needle: bytes, n: int, lo: int, hi: int) -> int:
    i = data.find(needle, lo, hi)
    while i != -1 and not _is_sample(data, i + 1 + n):
        i = data.find(needle, i + 1, hi)
    return i


def _is_sample(data: bytes, pos: int) -> bool:
    return pos < len(data) and data[pos] in _SAMPLE_START


def _read_block(data: bytes, name: str, start: int) -> list[Sample]:
    bname = name.encode()
    n, size = len(bname), len(data)
    samples: list[Sample] = []
    while start < size and data.startswith(bname, start):
        end = data.find(b"\n", start)
        if end == -1:
            end = size
        if start + n < end and data[start + n] in _SAMPLE_START:
            samples.append(_parse_line(data[start + n:end], name))
        start = end + 1
    return samples


def _parse_line(rest: bytes, name: str) -> Sample:
    """``rest`` is the line after the metric name: ``{labels} value [timestamp]`` or `` value [timestamp]``."""
    raw = b""
    if rest.startswith(b"{"):
        close = rest.rfind(b"}")  # the value and timestamp after the label block can contain no '}'
        if close == -1:
            raise MetricsParseError(f"unterminated label block in {name}{rest[:200]!r}")
        raw, rest = rest[1:close], rest[close + 1:]
    parts = rest.split()
    try:
        if len(parts) == 1:
            return Sample(raw, float(parts[0]))
        if len(parts) == 2:
            return Sample(raw, float(parts[0]), float(parts[1]))
    except ValueError:
        pass
    raise MetricsParseError(f"malformed sample line {name}{rest[:200]!r}")


_LABELS_FULL_RE = re.compile(r'(?:\s*[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"\s*,)*'
                             r'(?:\s*[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"\s*)?\s*')
_LABEL_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


@functools.lru_cache(maxsize=4096)
def _parse_labels(raw_bytes: bytes) -> Mapping[str, str]:
    """Label block -> read-only mapping. Cached: info-style series (cache config, LoRA) repeat every scrape."""
    raw = raw_bytes.decode("utf-8", "replace")
    if _LABELS_FULL_RE.fullmatch(raw) is None:
        raise MetricsParseError(f"malformed label block {{{raw[:200]}}}")
    return MappingProxyType({k: unescape_label_value(v) for k, v in _LABEL_PAIR_RE.findall(raw)})


# --------------------------------------------------------------------------------------------------------------
# prometheus_client parser (baseline and cross-check)


def parse_with_prometheus_client(text: str, config: EngineConfig, now: float | None = None) -> Metrics:
    """Same result as :func:`parse_targeted`, using ``prometheus_client``'s full text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = config.families
    found: dict[str, list[Sample]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in wanted:
                    ts = None if s.timestamp is None else float(s.timestamp) * 1000.0
                    found.setdefault(s.name, []).append(Sample(dict(s.labels), float(s.value), ts))
    except Exception as exc:  # the parser raises ValueError, IndexError, TypeError... on garbage
        raise MetricsParseError(f"unparseable metrics page: {exc}") from exc
    return metrics_from_samples(lambda name: found.get(name, []), config, now)


# --------------------------------------------------------------------------------------------------------------
# Samples -> Metrics


def metrics_from_samples(lookup: SampleLookup, config: EngineConfig, now: float | None = None) -> Metrics:
    """Aggregate the samples per ``config`` (see the module docstring) into a Metrics stamped ``now``."""
    try:
        return _aggregate(lookup, config, now)
    except (OverflowError, ValueError) as exc:  # fsum over inf/-inf or out-of-range values
        if isinstance(exc, MetricsParseError):
            raise
        raise MetricsExtractError(f"engine {config.name}: unusable values: {exc}") from exc


def _aggregate(lookup: SampleLookup, config: EngineConfig, now: float | None) -> Metrics:
    missing: list[str] = []
    nonfinite: list[str] = []
    waiting = _required(lookup, config.queued, missing, math.fsum, nonfinite)
    running = _required(lookup, config.running, missing, math.fsum, nonfinite)
    kv = _required(lookup, config.kv_usage, missing, max, nonfinite)
    custom, custom_labels = _custom(lookup, config.custom_metrics, missing)
    if missing:
        raise MetricsExtractError(f"engine {config.name}: page has no {'; no '.join(missing)}")
    if nonfinite:
        raise MetricsExtractError(f"engine {config.name}: non-finite value in {', '.join(nonfinite)}")
    block_size, num_blocks, max_num_seqs = _cache_geometry(lookup, config)
    running_loras, waiting_loras, max_lora = _lora(lookup, config)
    loaded, gpu_loaded, base_model = _residency(lookup, config)
    return Metrics(
        waiting=_count(waiting), running=_count(running), kv_usage=kv,
        block_size=block_size, num_gpu_blocks=num_blocks, running_loras=running_loras,
        waiting_loras=waiting_loras, max_lora=max_lora, max_num_seqs=max_num_seqs,
        update_time=time.monotonic() if now is None else now, loaded_loras=loaded,
        gpu_loaded_loras=gpu_loaded, base_model=base_model, custom=custom, custom_labels=custom_labels,
    )


def _select(lookup: SampleLookup, specs: Sequence[MetricSpec]) -> list[Sample]:
    for spec in specs:
        samples = lookup(spec.name)
        if samples:
            if spec.labels:
                samples = [s for s in samples if spec.matches(s.labels)]
            if samples:
                return samples
    return []


def _required(lookup: SampleLookup, specs: Sequence[MetricSpec], missing: list[str],
              agg: Callable[[list[float]], float], nonfinite: list[str]) -> float:
    """``agg`` over the series of the first spec present; a missing family is added to ``missing`` and a
    non-finite series value to ``nonfinite`` (both 0.0)."""
    if not specs:
        return 0.0
    samples = _select(lookup, specs)
    if not samples:
        missing.append(" or ".join(str(s) for s in specs))
        return 0.0
    values = [s.value for s in samples]
    if not all(math.isfinite(v) for v in values):
        nonfinite.append(" or ".join(str(s) for s in specs))
        return 0.0
    return agg(values)


def _count(value: float) -> int:
    return int(value) if math.isfinite(value) and value > 0 else 0


def _cache_geometry(lookup: SampleLookup, config: EngineConfig
                    ) -> tuple[int | None, int | None, int | None]:
    block_size = num_blocks = max_num_seqs = None
    info = _select(lookup, config.cache_info)
    if info:
        size_keys = (config.block_size_label,) if config.block_size_label else ("block_size", "page_size")
        count_keys = (config.num_blocks_label,) if config.num_blocks_label else ("num_gpu_blocks", "num_pages")
        block_size = _int_label(info[0].labels, *size_keys)
        per_engine = [_int_label(s.labels, *count_keys) for s in info]
        counts = [v for v in per_engine if v is not None]
        if len(counts) == len(per_engine):
            num_blocks = sum(counts)
        max_num_seqs = _int_label(info[0].labels, "max_num_seqs")
    gauge = _select(lookup, config.block_size)
    if gauge and math.isfinite(gauge[0].value):
        block_size = int(gauge[0].value)
    gauge = _select(lookup, config.num_blocks)
    if gauge and all(math.isfinite(s.value) for s in gauge):
        num_blocks = int(math.fsum(s.value for s in gauge))
    return block_size, num_blocks, max_num_seqs


def _int_label(labels: Mapping[str, str], *keys: str) -> int | None:
    for key in keys:
        raw = labels.get(key)
        if raw is not None:
            try:
                return int(float(raw))
            except (ValueError, OverflowError):
                return None
    return None


def _lora(lookup: SampleLookup, config: EngineConfig) -> tuple[frozenset[str], frozenset[str], int]:
    """Running and waiting adapters and GPU slots; the ``lora_gpu_slots`` gauge wins over ``max_lora``."""
    running: frozenset[str] = frozenset()
    waiting: frozenset[str] = frozenset()
    max_lora = 0
    samples = _select(lookup, config.lora)
    if samples:
        newest = max(samples, key=lambda s: s.value if math.isfinite(s.value) else -math.inf)
        labels = newest.labels
        running, waiting = _csv(labels.get("running_lora_adapters", "")), _csv(labels.get("waiting_lora_adapters", ""))
        max_lora = _int_label(labels, "max_lora") or 0
    slots = _largest(_select(lookup, config.lora_gpu_slots))
    return running, waiting, max_lora if slots is None else slots


def _csv(raw: str) -> frozenset[str]:
    return frozenset(x.strip() for x in raw.split(",") if x.strip())


def _largest(samples: list[Sample]) -> int | None:
    """The largest finite value as a count (the busiest engine of a data-parallel server), None if none."""
    values = [s.value for s in samples if math.isfinite(s.value)]
    return _count(max(values)) if values else None


_LEVEL_RANK = {"cpu": 1, "gpu": 2}
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})  # what Go's strconv.ParseBool reads as true


def _residency(lookup: SampleLookup, config: EngineConfig
               ) -> tuple[Mapping[str, LoraLoadState] | None, int, str]:
    """``(loaded_loras, gpu_loaded_loras, base_model)``; loaded is None when neither gauge is on the page.

    A resident series has a positive value (0 = evicted) and an ``adapter_name``; its ``level`` is ``gpu``,
    anything else counts as ``cpu``. Over several engines an adapter takes its highest level, pinned if any
    engine pins it, its largest rank. The GPU count is the count gauge's largest engine, else the number of
    GPU-resident adapters; the base model is the count gauge's ``model_name``.
    """
    loaded_samples = _select(lookup, config.lora_loaded)
    count_samples = _select(lookup, config.lora_gpu_loaded)
    if not loaded_samples and not count_samples:
        return None, 0, ""
    loaded: dict[str, LoraLoadState] = {}
    for sample in loaded_samples:
        name = sample.labels.get("adapter_name", "")
        if name and math.isfinite(sample.value) and sample.value > 0:
            loaded[name] = _merge(loaded.get(name), _load_state(sample.labels))
    gpu = _largest(count_samples)
    if gpu is None:
        gpu = sum(1 for state in loaded.values() if state.level == "gpu")
    base_model = next((m for s in count_samples if (m := s.labels.get("model_name", ""))), "")
    return loaded, gpu, base_model


def _load_state(labels: Mapping[str, str]) -> LoraLoadState:
    level = "gpu" if labels.get("level") == "gpu" else "cpu"
    return LoraLoadState(level, labels.get("pinned", "") in _TRUE, _int_label(labels, "rank") or 0)


def _merge(old: LoraLoadState | None, new: LoraLoadState) -> LoraLoadState:
    if old is None:
        return new
    level = max(old.level, new.level, key=_LEVEL_RANK.__getitem__)
    return LoraLoadState(level, old.pinned or new.pinned, max(old.rank, new.rank))


def _custom(lookup: SampleLookup, metrics: Sequence[CustomMetric], missing: list[str]
            ) -> tuple[dict[str, float], dict[str, str]]:
    """Each custom metric's value, or with ``label_name`` that label's value (one series: the newest timestamp,
    else the first; a non-finite value, or a missing or empty label, is absent)."""
    values: dict[str, float] = {}
    labels: dict[str, str] = {}
    for metric in metrics:
        samples = _select(lookup, metric.specs)
        if not metric.label_name:
            samples = [s for s in samples if math.isfinite(s.value)]
        if samples:
            newest = max(samples, key=lambda s: -math.inf if s.timestamp is None else s.timestamp)
            if not metric.label_name:
                values[metric.attribute_key] = newest.value
                continue
            label = newest.labels.get(metric.label_name, "")
            if label:
                labels[metric.attribute_key] = label
                continue
        if not metric.optional:
            what = f"label {metric.label_name} of " if metric.label_name else ""
            missing.append(f"custom metric {metric.attribute_key} ({what}{' or '.join(str(s) for s in metric.specs)})")
    return values, labels
