"""``python -m bench.token_ids`` end to end on a few requests: both backends run, give the same ids, and the table
has a row for each."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.routing.tokenizer import build
from bench.token_ids import main


async def test_both_backends_give_the_same_ids_and_a_row_each(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = build(tmp_path / "tok", vocab=1024)
    await main(argparse.Namespace(workload="multi-turn", requests=12, concurrency=2, workers=2, tokenizer=folder))
    out = capsys.readouterr().out
    assert "Ids equal in both backends for 12 of 12 requests." in out
    rows = [line for line in out.splitlines() if line.startswith(("| vllm", "| local"))]
    assert len(rows) == 2 and all(line.rstrip().endswith("| 0 |") for line in rows)  # no failures
