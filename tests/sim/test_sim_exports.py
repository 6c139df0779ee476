"""The public surface of `epp_sim` that other components rely on."""

from __future__ import annotations

import inspect

import epp_sim


def test_exported_members() -> None:
    assert {"SimConfig", "SimServer", "SimPool"} <= set(epp_sim.__all__)
    for name in epp_sim.__all__:
        assert hasattr(epp_sim, name), name


def test_server_contract() -> None:
    server = epp_sim.SimServer(epp_sim.SimConfig())
    for method in ("start", "stop", "set_hung", "set_failure_rate"):
        assert callable(getattr(server, method)), method
    assert inspect.iscoroutinefunction(server.start) and inspect.iscoroutinefunction(server.stop)
    assert server.engine.num_running == 0 and server.engine.num_waiting == 0


def test_config_rejects_unknown_fields() -> None:
    try:
        epp_sim.SimConfig(no_such_field=1)  # type: ignore[call-arg]
    except ValueError as exc:
        assert "no_such_field" in str(exc)
    else:
        raise AssertionError("unknown field accepted")
