"""Hot reload of the scheduling profiles (``--watch-config-file``): what a reload may change, what it refuses, and a
running EPP that changes where it routes when its config file changes, with the reload metrics."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import openai
import pytest

from epp.config.loader import load_config
from epp.config.reload import (
    ConfigReloader,
    ConfigWatcher,
    ReloadMetrics,
    UnsupportedReload,
    build_scheduler_for_reload,
)
from epp.errors import ConfigError
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.builtins import default_registry
from epp_sim import SimConfig, SimPool

from ..conftest import eventually

BASE = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: only-a
  type: by-label
  parameters: {label: pool-part, validValues: [a]}
- name: only-b
  type: by-label
  parameters: {label: pool-part, validValues: [b]}
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: only-a
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: max-score-picker
"""


def _startup(tmp_path: Path, text: str = BASE):  # type: ignore[no-untyped-def]
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(path, default_registry()), path


def _reload(pipeline, text: str):  # type: ignore[no-untyped-def]
    return build_scheduler_for_reload(text, "config.yaml", pipeline)


def test_a_reload_changes_weights_order_and_filters_over_the_startup_plugins(tmp_path: Path) -> None:
    pipeline, _ = _startup(tmp_path)
    text = BASE.replace("pluginRef: only-a", "pluginRef: only-b").replace("weight: 2", "weight: 5")
    profile = _reload(pipeline, text).profiles["default"]
    handle = pipeline.handle
    assert profile.filters == [handle.plugin("only-b")]
    assert [(s.scorer, s.weight) for s in profile.scorers] == [
        (handle.plugin("queue-scorer"), 5.0), (handle.plugin("kv-cache-utilization-scorer"), 1.0)]
    assert profile.picker is handle.plugin("max-score-picker")
    swapped = text.replace("  - pluginRef: queue-scorer\n    weight: 5\n", "") + \
        "  - pluginRef: queue-scorer\n    weight: 5\n"
    reordered = _reload(pipeline, swapped).profiles["default"]
    assert [s.scorer.name for s in reordered.scorers] == ["kv-cache-utilization-scorer", "queue-scorer"]


def test_a_reload_changes_the_picker_and_a_profile_without_one_keeps_its_startup_picker(tmp_path: Path) -> None:
    pipeline, _ = _startup(tmp_path, BASE.replace("  - pluginRef: max-score-picker\n", "  - pluginRef: random-picker\n"))
    assert pipeline.scheduler.profiles["default"].picker is pipeline.handle.plugin("random-picker")
    changed = _reload(pipeline, BASE).profiles["default"]
    assert changed.picker is pipeline.handle.plugin("max-score-picker")
    without = _reload(pipeline, BASE.replace("  - pluginRef: max-score-picker\n", "")).profiles["default"]
    # the first declared picker would be max-score-picker; the reload keeps the one the profile started with
    assert without.picker is pipeline.handle.plugin("random-picker")


def test_the_new_scheduler_keeps_the_startup_handler_producers_and_timer(tmp_path: Path) -> None:
    pipeline, _ = _startup(tmp_path)
    pipeline.scheduler.timer = lambda *args: None
    new = _reload(pipeline, BASE.replace("weight: 2", "weight: 3"))
    assert new.handler is pipeline.scheduler.handler
    assert new.producers == pipeline.scheduler.producers and new.producers
    assert new.timer is pipeline.scheduler.timer


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("validValues: [b]", "validValues: [c]"), "fields outside schedulingProfiles changed (plugins)"),
    (lambda t: t.replace("- type: random-picker\n", "- type: random-picker\n- type: lora-affinity-scorer\n"),
     "(plugins)"),
    (lambda t: t + "featureGates: [flowControl]\n", "(featureGates)"),
    (lambda t: t.replace("- name: default", "- name: renamed"), "scheduling profile names changed"),
    (lambda t: t[:t.index("schedulingProfiles:")], "scheduling profiles removed"),
])
def test_changes_only_a_restart_can_make_are_unsupported(tmp_path: Path, edit, words: str) -> None:  # type: ignore[no-untyped-def]
    pipeline, _ = _startup(tmp_path)
    with pytest.raises(UnsupportedReload) as err:
        _reload(pipeline, edit(BASE))
    assert words in str(err.value)


@pytest.mark.parametrize("text, words", [
    (BASE.replace("pluginRef: only-a", "pluginRef: nowhere"), "unknown plugin 'nowhere'"),
    (BASE + "  - pluginRef: random-picker\n", "two pickers"),
    (BASE.replace("weight: 2", "weight: [2]"), "weight"),
    (BASE.replace("schedulingProfiles:", "schedulingProfiles: ["), "config.yaml"),
])
def test_a_candidate_that_does_not_build_is_invalid(tmp_path: Path, text: str, words: str) -> None:
    pipeline, _ = _startup(tmp_path)
    with pytest.raises(ConfigError) as err:
        _reload(pipeline, text)
    assert not isinstance(err.value, UnsupportedReload)
    assert words in str(err.value)


class _Director:
    def __init__(self) -> None:
        self.schedulers: list[object] = []

    def use_scheduler(self, scheduler: object) -> None:
        self.schedulers.append(scheduler)


def test_the_reloader_counts_each_result_and_keeps_the_running_scheduler_on_failure(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    pipeline, path = _startup(tmp_path)
    registry, director = CollectorRegistry(), _Director()
    reloader = ConfigReloader(pipeline, director, ReloadMetrics(registry), str(path))
    first = pipeline.scheduler
    assert registry.get_sample_value("llm_d_epp_config_active_generation") == 1
    assert reloader.apply(b"\xff\xfe") == "invalid"
    assert reloader.apply(BASE.replace("validValues: [b]", "validValues: [c]").encode()) == "unsupported"
    assert reloader.apply(None, "cannot read") == "read_error"
    assert pipeline.scheduler is first and director.schedulers == []
    assert reloader.apply(BASE.replace("weight: 2", "weight: 4").encode()) == "success"
    assert director.schedulers == [pipeline.scheduler] and pipeline.scheduler is not first
    for result in ("invalid", "unsupported", "read_error", "success"):
        assert registry.get_sample_value("llm_d_epp_config_reload_total", {"result": result}) == 1
    assert registry.get_sample_value("llm_d_epp_config_active_generation") == 2
    assert registry.get_sample_value("llm_d_epp_config_last_reload_success_timestamp_seconds") > 0


def test_the_watcher_reports_each_new_content_once_and_an_unreadable_spell_once(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"one")
    seen: list[tuple[bytes | None, str | None]] = []
    watcher = ConfigWatcher(path, b"one", lambda content, error: seen.append((content, error)))
    watcher.poll()
    assert seen == []
    staged = tmp_path / "config.yaml.new"  # a rename over the file, as an editor or kubectl's atomic writer does
    staged.write_bytes(b"two")
    os.replace(staged, path)
    watcher.poll()
    watcher.poll()
    path.unlink()
    watcher.poll()
    watcher.poll()
    path.write_bytes(b"two")  # back with the content already seen: nothing new to apply
    watcher.poll()
    path.write_bytes(b"three")
    watcher.poll()
    assert [content for content, _ in seen] == [b"two", None, b"three"]
    assert "cannot read" in (seen[1][1] or "")


def test_a_configmap_style_symlink_swap_is_seen(tmp_path: Path) -> None:
    """Kubernetes updates a mounted ConfigMap by pointing ``..data`` at a new directory."""
    for version, text in (("v1", b"old"), ("v2", b"new")):
        (tmp_path / version).mkdir()
        (tmp_path / version / "config.yaml").write_bytes(text)
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "config.yaml").symlink_to("..data/config.yaml")
    seen: list[bytes | None] = []
    watcher = ConfigWatcher(tmp_path / "config.yaml", b"old", lambda content, error: seen.append(content))
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    watcher.poll()
    assert seen == [b"new"]


# --- a running EPP ---------------------------------------------------------------------------------------------


def _served(server) -> int:  # type: ignore[no-untyped-def]
    return sum(server.engine.stats.finished.values())


async def test_a_running_epp_routes_by_the_new_profile_after_the_file_changes(tmp_path: Path) -> None:
    async with SimPool([SimConfig(model="sim-model", time_scale=0.01, seed=i) for i in range(2)]) as pool:
        lines = ["endpoints:"]
        for part, server in zip("ab", pool.servers):
            lines += [f"  - name: sim-{part}", "    address: 127.0.0.1", f"    port: {server.port}",
                      f"    labels: {{pool-part: {part}}}"]
        endpoints = tmp_path / "endpoints.yaml"
        endpoints.write_text("\n".join(lines) + "\n")
        config = tmp_path / "config.yaml"
        config.write_text(BASE)
        app = EppApp(ServeOptions(config=str(config), watch_config_file=True, endpoints_file=str(endpoints),
                                  host="127.0.0.1", grpc_port=None, health_port=None, metrics_port=0, http_port=0,
                                  plaintext=True, refresh_interval=0.05))
        await app.start()
        client = openai.AsyncOpenAI(base_url=app.gateway.url + "/v1", api_key="unused", max_retries=0)
        try:
            await app.wait_ready()

            async def ask() -> None:
                await client.completions.create(model="sim-model", prompt="hello", max_tokens=2)

            await asyncio.gather(*(ask() for _ in range(3)))
            assert [_served(s) for s in pool.servers] == [3, 0]
            staged = tmp_path / "config.yaml.new"
            staged.write_text(BASE.replace("pluginRef: only-a", "pluginRef: only-b"))
            os.replace(staged, config)
            await eventually(lambda: app.director is not None and app.director.scheduler.profiles["default"].filters ==
                         [app.pipeline.handle.plugin("only-b")])
            await asyncio.gather(*(ask() for _ in range(3)))
            assert [_served(s) for s in pool.servers] == [3, 3]
            config.write_text(BASE.replace("validValues: [a]", "validValues: [z]"))  # needs a restart: refused
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{app.metrics_port}/metrics"

                async def scrape() -> str:
                    async with session.get(url) as resp:
                        return await resp.text()

                async def refused() -> str | None:
                    text = await scrape()
                    return text if 'llm_d_epp_config_reload_total{result="unsupported"} 1.0' in text else None

                text = await eventually(refused, "the unsupported change counted", interval=0.1)

            assert 'llm_d_epp_config_reload_total{result="success"} 1.0' in text
            assert "llm_d_epp_config_active_generation 2.0" in text
            await ask()
            assert [_served(s) for s in pool.servers] == [3, 4]  # still the last good profile
        finally:
            await client.close()
            await app.stop()


def test_serve_refuses_watch_config_file_without_a_config_file() -> None:
    import argparse

    from epp.cli.serve import add_parser, options_from_args

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--watch-config-file", "--endpoints", "e.yaml"])
    with pytest.raises(ValueError, match="--watch-config-file needs --config-file"):
        options_from_args(args)
    args = parser.parse_args(["serve", "--watch-config-file=true", "--config-text", "{}", "--endpoints", "e.yaml"])
    with pytest.raises(ValueError, match="--config-text"):
        options_from_args(args)
    args = parser.parse_args(["serve", "--watch-config-file=false", "--endpoints", "e.yaml"])
    assert options_from_args(args).watch_config_file is False


def test_a_candidate_that_fails_outside_the_config_rules_counts_as_invalid(tmp_path: Path) -> None:
    """A profile handler whose check raises something other than a ConfigError must not stop later reloads."""
    from prometheus_client import CollectorRegistry

    pipeline, path = _startup(tmp_path)

    def broken_check(profiles: object) -> None:
        raise RuntimeError("handler bug")

    pipeline.scheduler.handler.check_profiles = broken_check  # type: ignore[attr-defined]
    registry, director = CollectorRegistry(), _Director()
    reloader = ConfigReloader(pipeline, director, ReloadMetrics(registry), str(path))
    assert reloader.apply(BASE.replace("weight: 2", "weight: 4").encode()) == "invalid"
    assert director.schedulers == []
    assert registry.get_sample_value("llm_d_epp_config_reload_total", {"result": "invalid"}) == 1
