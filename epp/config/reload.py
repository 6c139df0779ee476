"""Hot reload of the scheduling profiles (``epp serve --config-file F --watch-config-file``).

Only ``schedulingProfiles`` may change, over the plugin instances built at start-up: a reload can reorder filters
and scorers, change weights, move plugins between profiles and change a profile's picker; anything else needs a
restart. A candidate outside those rules is ``unsupported``, one that does not build ``invalid``; either way EPP
keeps serving with the scheduler it has and logs why. A good candidate replaces the Director's scheduler between
requests (a cycle in progress finishes with the one it began with). :class:`ConfigWatcher` polls the file and hands
over each new content (a new SHA-256) once. Reloads are counted in the reference's ``llm_d_epp_config_*`` metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from epp.config.loader import DEFAULT_CONFIG_TEXT, Pipeline, config_error_text, load_raw
from epp.config.schema import EndpointPickerConfig
from epp.config.wiring import build_profiles, check_profiles
from epp.config.yaml_lines import SourceMap
from epp.errors import ConfigError
from epp.framework.plugins import Picker
from epp.scheduling.scheduler import Scheduler, SchedulerProfile

__all__ = ["UnsupportedReload", "build_scheduler_for_reload", "ReloadMetrics", "ConfigReloader", "ConfigWatcher"]

log = logging.getLogger(__name__)


class UnsupportedReload(ConfigError):
    """The candidate changes what only a restart can change (fields outside ``schedulingProfiles``, profile names)."""


def build_scheduler_for_reload(text: str, source: str, startup: Pipeline) -> Scheduler:
    """A new :class:`Scheduler` for ``text`` over ``startup``'s plugin instances, producers and profile handler.

    Raises :class:`UnsupportedReload` or :class:`~epp.errors.ConfigError` (see the module contracts)."""
    if not text.lstrip("\ufeff").strip():
        text = DEFAULT_CONFIG_TEXT  # load_raw's rule: an empty file means the default config
    candidate, smap = load_raw(text, source)
    _check_static_fields(candidate, startup.source_config or startup.config, smap)
    old = startup.scheduler
    profiles = _reload_profiles(candidate, smap, startup)
    check_profiles(old.handler, profiles, smap)  # the start-up handler may refuse them, as it would at start-up
    return Scheduler(profiles, old.handler, old.producers, timer=old.timer)


def _check_static_fields(candidate: EndpointPickerConfig, startup: EndpointPickerConfig, smap: SourceMap) -> None:
    fixed = {"scheduling_profiles"}
    if candidate.model_dump(exclude=fixed) != startup.model_dump(exclude=fixed):
        changed = [name for name in type(candidate).model_fields
                   if name not in fixed and getattr(candidate, name) != getattr(startup, name)]
        where = ", ".join(_alias(name) for name in changed)
        raise UnsupportedReload(f"fields outside schedulingProfiles changed ({where}); they need a restart",
                                source=smap.source, line=smap.line(_alias(changed[0])) if changed else None)
    if startup.scheduling_profiles and not candidate.scheduling_profiles:
        raise UnsupportedReload("scheduling profiles removed; a reload must keep them", source=smap.source)


def _alias(field_name: str) -> str:
    info = EndpointPickerConfig.model_fields[field_name]
    return info.alias or field_name


def _reload_profiles(candidate: EndpointPickerConfig, smap: SourceMap,
                     startup: Pipeline) -> dict[str, SchedulerProfile]:
    """The candidate's profiles over the start-up plugins; their names must be the start-up ones (checked first,
    so every profile has a start-up picker to keep when it names none, and no plugin is created)."""
    pickers: dict[str, Picker] = {
        name: prof.picker for name, prof in startup.scheduler.profiles.items() if prof.picker is not None}
    names = [spec.name for spec in candidate.scheduling_profiles] or ["default"]  # no profiles: one "default"
    if set(names) != set(pickers):
        raise UnsupportedReload(f"scheduling profile names changed (start-up: {', '.join(pickers)}; now: "
                                f"{', '.join(names)}); they need a restart", source=smap.source,
                                line=smap.line("schedulingProfiles"))
    return build_profiles(candidate, smap, startup.handle, pickers.__getitem__)


class ReloadMetrics:
    """The reference's three reload families on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.reloads = Counter("llm_d_epp_config_reload", "Configuration reload activity by result.", ("result",),
                               registry=registry)
        self.generation = Gauge("llm_d_epp_config_active_generation", "Active configuration generation.",
                                registry=registry)
        self.last_success = Gauge("llm_d_epp_config_last_reload_success_timestamp_seconds",
                                  "Unix timestamp of the last successful configuration reload.", registry=registry)


class ConfigReloader:
    """Applies new config file content to a running Director: :meth:`apply` is the watcher's callback."""

    def __init__(self, pipeline: Pipeline, director: Any, metrics: ReloadMetrics, source: str) -> None:
        self.pipeline, self.director, self.metrics, self.source = pipeline, director, metrics, source
        self.generation = 1
        self.metrics.generation.set(1)

    def apply(self, content: bytes | None, error: str | None = None) -> str:
        """Try ``content`` (None with ``error``: the file could not be read); returns the result label counted."""
        if content is None:
            return self._failed("read_error", error or "unreadable")
        try:
            scheduler = build_scheduler_for_reload(_decode(content, self.source), self.source, self.pipeline)
        except UnsupportedReload as exc:
            return self._failed("unsupported", config_error_text(exc))
        except ConfigError as exc:
            return self._failed("invalid", config_error_text(exc))
        except Exception as exc:  # a plugin's own check failing some other way must not stop the watcher
            log.exception("config reload: building the candidate failed")
            return self._failed("invalid", f"{type(exc).__name__}: {exc}")
        self.director.use_scheduler(scheduler)
        self.pipeline.scheduler = scheduler
        self.generation += 1
        self.metrics.reloads.labels("success").inc()
        self.metrics.generation.set(self.generation)
        self.metrics.last_success.set(time.time())
        log.info("config reload applied: generation %d (%s, sha256 %s)", self.generation, self.source,
                 hashlib.sha256(content).hexdigest()[:12])
        return "success"

    def _failed(self, result: str, reason: str) -> str:
        self.metrics.reloads.labels(result).inc()
        log.error("config reload failed (%s), keeping generation %d: %s", result, self.generation, reason)
        return result


def _decode(content: bytes, source: str) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the config file is not UTF-8 text (byte 0x{content[exc.start]:02x} at offset "
                          f"{exc.start})", source=source, line=content.count(b"\n", 0, exc.start) + 1) from exc


class ConfigWatcher:
    """Polls ``path`` every ``interval`` seconds and calls ``on_change(content, None)`` once per new content (by
    SHA-256, starting from ``initial``), or ``on_change(None, reason)`` once per spell of the file being
    unreadable."""

    def __init__(self, path: str | Path, initial: bytes, on_change: Callable[[bytes | None, str | None], Any],
                 interval: float = 1.0) -> None:
        self.path, self.on_change, self.interval = Path(path), on_change, interval
        self._digest = hashlib.sha256(initial).digest()
        self._unreadable = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="config-file-watcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.poll()

    def poll(self) -> None:
        """Read the file once and report a change, if any (the loop's step; tests call it directly)."""
        try:
            content = self.path.read_bytes()
        except OSError as exc:
            if not self._unreadable:
                self._unreadable = True
                self.on_change(None, f"cannot read {self.path}: {exc.strerror}")
            return
        self._unreadable = False
        digest = hashlib.sha256(content).digest()
        if digest != self._digest:
            self._digest = digest
            self.on_change(content, None)
