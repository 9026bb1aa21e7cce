"""strata bench edge's verdict: its last line, and a failing exit when a prompt was refused late."""

from __future__ import annotations

import pytest

from strata_tools.bench.edge import Flood, Phase, report


def phases(idle_ms: list[float], load_ms: list[float], load_health_ok: int) -> list[Phase]:
    idle = Phase("idle", submit_ms=idle_ms, health_ms=[1.0] * len(idle_ms), health_ok=len(idle_ms))
    load = Phase("load", submit_ms=load_ms, health_ms=[1.0] * len(load_ms), health_ok=load_health_ok)
    return [idle, load]


def test_the_last_line_holds_the_ratio_the_health_share_and_the_late_refusals(capsys: pytest.CaptureFixture[str]
                                                                              ) -> None:
    rc = report(phases([10.0, 20.0], [30.0, 40.0], 1), Flood(accepted=["a"], calls=5), dead=[], unsettled=[])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "edge submit_p99_ratio=2.00 health_ok=0.500 refused_late=0"
    assert rc == 0


def test_a_prompt_refused_late_or_never_served_fails_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert report(phases([10.0], [10.0], 1), Flood(), dead=["r1"], unsettled=[]) == 1
    assert capsys.readouterr().out.strip().endswith("refused_late=1")
    assert report(phases([10.0], [10.0], 1), Flood(), dead=[], unsettled=["r2"]) == 1
