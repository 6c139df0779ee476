"""The public surface of `bench.sim` that other components rely on."""

from __future__ import annotations

import inspect

import bench.sim


def test_exported_members() -> None:
    assert {"SimConfig", "SimServer", "SimPool"} <= set(bench.sim.__all__)
    for name in bench.sim.__all__:
        assert hasattr(bench.sim, name), name


def test_server_contract() -> None:
    server = bench.sim.SimServer(bench.sim.SimConfig())
    for method in ("start", "stop", "set_hung", "set_failure_rate"):
        assert callable(getattr(server, method)), method
    assert inspect.iscoroutinefunction(server.start) and inspect.iscoroutinefunction(server.stop)
    assert server.engine.num_running == 0 and server.engine.num_waiting == 0


def test_config_rejects_unknown_fields() -> None:
    try:
        bench.sim.SimConfig(no_such_field=1)  # type: ignore[call-arg]
    except ValueError as exc:
        assert "no_such_field" in str(exc)
    else:
        raise AssertionError("unknown field accepted")
