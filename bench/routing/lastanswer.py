"""``python -m bench.routing.lastanswer OUT``: where each run's last answer could have gone, and what it would have taken.

Every router delivers a schedule's tokens, so a run's output throughput is set by the time to its last answer's end.
For each run under ``OUT/logs`` this takes the answer that ended last and replays, on each server, that server's time
model (from the run's ``servers.json``) from the moment the answer was sent: the requests the server was computing
or decoding then and those sent to it later, as they were, each one's progress read from ``outcomes.jsonl`` (sent at
``end - e2e``, its tokens spread evenly from its first to its last), stepped as the simulator batches (a token per decoding
sequence, then prompt chunks within ``max_num_batched_tokens``). It prints the E2E observed and replayed on
each server: whether the router sent the answer where it would have ended first, and what the state it had left
offered. An estimate: the answer's prompt is taken as cached as much everywhere as where it went, later requests go
where they went, requests whose server is not known are left out, and preemptions are not replayed. Runs of a P/D
pool (two servers per request) are skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.routing.runner import Outcome
from bench.routing.runs import OUTCOMES, load_outcomes
from epp_sim import TimeModel

__all__ = ["Replay", "Seq", "last_answer", "main", "replay", "replay_run"]


@dataclass
class Seq:
    """One request on the replayed server."""

    sent: float  # seconds after the last answer was sent (negative: before)
    left: float  # output tokens still to come
    context: float  # tokens it attends to
    prefill: float  # prompt tokens still to compute


@dataclass(frozen=True)
class Replay:
    """One run's last answer: its index, the server it went to, its observed E2E and its replayed E2E per server."""

    run: str
    index: int
    server: int
    e2e: float
    replayed: dict[int, float]

    @property
    def best(self) -> int:
        return min(self.replayed, key=lambda k: self.replayed[k])


def last_answer(outcomes: Sequence[Outcome]) -> Outcome | None:
    """The successful answer that ended last (None: none succeeded)."""
    ok = [o for o in outcomes if o.ok and o.e2e is not None]
    return max(ok, key=lambda o: o.end, default=None)


def _state(outcomes: Sequence[Outcome], last: Outcome, server: int) -> list[Seq]:
    """The requests ``server`` served that had not ended when ``last`` was sent, as they stood then."""
    assert last.e2e is not None
    now = last.end - last.e2e
    seqs = []
    for o in outcomes:
        if o is last or not o.ok or o.servers != [server] or o.end <= now or o.e2e is None or o.ttft is None:
            continue
        sent = o.end - o.e2e
        first = sent + o.ttft
        if first <= now:  # decoding: its tokens so far as if evenly spread up to its end
            done = o.completion_tokens * (now - first) / max(o.end - first, 1e-9)
            seqs.append(Seq(0.0, o.completion_tokens - done, o.prompt_tokens + done, 0.0))
        else:  # queued or computing its prompt then (or sent later)
            seqs.append(Seq(sent - now, o.completion_tokens, o.prompt_tokens, o.prompt_tokens - o.cached_tokens))
    return seqs


def replay(seqs: list[Seq], answer: Seq, tm: TimeModel, budget: int) -> float:
    """Seconds until ``answer`` has its last token, stepping ``seqs`` and it from time 0 (the answer's send): each
    step decodes a token of every sequence past its prompt, then computes prompts in the order sent, within
    ``budget`` tokens in all (as vLLM's scheduler, running requests first)."""
    live = sorted(seqs + [answer], key=lambda s: s.sent)
    t = 0.0
    while answer.left > 0:
        joined = [s for s in live if s.sent <= t and s.left > 0]  # never empty: the answer, sent at 0, is in it
        room, step = float(budget), tm.step_overhead_s
        for s in joined:
            if s.prefill <= 0:
                step += tm.decode_s_per_seq + tm.attn_s_per_kv_token * s.context
                s.left -= 1
                s.context += 1
                room -= 1
        for s in joined:
            if s.prefill > 0 and room > 0:
                n = min(s.prefill, room)
                room -= n
                done = s.context - s.prefill  # its cached and computed tokens
                step += tm.prefill_s_per_token * n + tm.prefill_attn_s_per_pair * n * (done + (n + 1) / 2)
                s.prefill -= n
                if s.prefill <= 0:
                    s.left -= 1  # the step that finishes a prompt samples its first token
        t += step
    return t


def replay_run(run: Path) -> Replay | None:
    """The run's last answer replayed on each of its servers (None: no answer, or a P/D pool's run)."""
    outcomes = load_outcomes(run / OUTCOMES)
    last = last_answer(outcomes)
    servers: list[dict[str, Any]] = json.loads((run / "servers.json").read_text())
    if last is None or last.servers is None or len(last.servers) != 1 or last.e2e is None:
        return None
    replayed = {}
    for k, info in enumerate(servers):
        config = info["config"]
        answer = Seq(0.0, last.completion_tokens, last.prompt_tokens, last.prompt_tokens - last.cached_tokens)
        replayed[k] = replay(_state(outcomes, last, k), answer, TimeModel(**config["time_model"]),
                             config["max_num_batched_tokens"])
    return Replay(run.name, last.index, last.servers[0], last.e2e, replayed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.routing.lastanswer", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="a python -m bench.routing --out directory")
    args = parser.parse_args(argv)
    runs = sorted(p for p in (args.out / "logs").iterdir() if (p / OUTCOMES).exists() and (p / "servers.json").exists())
    if not runs:
        print(f"no runs with {OUTCOMES} and servers.json under {args.out / 'logs'}", file=sys.stderr)
        return 2
    print("| run | last answer | server | E2E s | replayed E2E s per server | best |")
    print("|---|---:|---:|---:|---|---:|")
    for run in runs:
        r = replay_run(run)
        if r is None:
            print(f"| {run.name} | skipped: no answer, or a P/D pool's |  |  |  |  |")
            continue
        each = ", ".join(f"{k}: {v:.3f}" for k, v in r.replayed.items())
        print(f"| {r.run} | {r.index} | {r.server} | {r.e2e:.3f} | {each} | {r.best} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
