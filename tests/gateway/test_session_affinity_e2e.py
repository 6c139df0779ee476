"""Sessions stick to one endpoint through the real HTTP gateway and simulated servers, with the stateful
session-affinity algorithms (``session_id_header`` scorer, ``session_id`` filter)."""

from __future__ import annotations

import orjson
import pytest

from ..conftest import eventually
from .helpers import chat, sim, spec_for

SCORER_CONFIG = """\
plugins:
- type: session-affinity-scorer
  parameters: {algorithm: session_id_header, headerName: x-session-id}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: session-affinity-scorer
  - pluginRef: max-score-picker
"""

FILTER_CONFIG = """\
plugins:
- type: session-affinity-filter
  parameters: {strategy: session_id}
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: session-affinity-filter
  - pluginRef: random-picker
"""


async def _send(st, session: str | None) -> tuple[int, str]:
    """One chat request (with ``x-session-id`` when ``session``); its status and the endpoint that served it."""
    headers = {"x-session-id": session} if session else {}
    done = len(st.recorder.done)
    async with st.session.post(st.url + "/v1/chat/completions", data=orjson.dumps(chat(max_tokens=2)),
                               headers=headers) as resp:
        await resp.read()
        assert "x-session-token" not in resp.headers and "x-session-id" not in resp.headers  # nothing written back
        status = resp.status
    await eventually(lambda: len(st.recorder.done) > done, what="the request's completion")
    _, endpoint, _ = st.recorder.done[done]
    assert endpoint is not None
    return status, endpoint.name


@pytest.mark.parametrize("config,spread", [(SCORER_CONFIG, True), (FILTER_CONFIG, False)],
                         ids=["scorer-session-id-header", "filter-session-id"])
async def test_each_session_sticks_to_the_endpoint_that_first_served_it(sims, stack, config, spread):
    servers = await sims(sim(), sim(), sim())
    st = await stack(config, [spec_for(s, f"sim-{i}") for i, s in enumerate(servers)])
    sessions = [f"conversation-{i}" for i in range(3)]
    first = {}
    for sid in sessions:
        status, first[sid] = await _send(st, sid)
        assert status == 200
    if spread:  # the scorer places each new session on the endpoint bound by the fewest sessions
        assert sorted(first.values()) == ["sim-0", "sim-1", "sim-2"]
    for _ in range(4):
        for sid in sessions:
            assert await _send(st, sid) == (200, first[sid])
    assert (await _send(st, None))[0] == 200  # a request without a session is routed as usual
    assert st.inflight() == 0
