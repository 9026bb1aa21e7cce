"""``strata bench level0`` on the ci zoo: every arm and detector is printed, the arms' lines are what
they say, and the last line parses."""

from __future__ import annotations

import re

import pytest

from strata_tools.bench import level0
from strata_tools.cli.main import main
from strata_tools.task.suite import load_suite
from strata_tools.zoo.build import ZooPaths


def test_bench_level0_prints_every_arm_and_detector(
    zoo: ZooPaths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STRATA_ZOO_PRESET", zoo.config.preset)
    monkeypatch.setenv("STRATA_CACHE_DIR", str(zoo.root.parent.parent))
    code = main(["bench", "level0", "--prompts", "12", "--train-prompts", "60", "--seeds", "1", "--threads", "1",
                 "--max-new-tokens", "24"])
    assert code == 0
    out = capsys.readouterr().out
    rows = {m.group(1).strip(): m for m in re.finditer(
        r"^  (\S.{0,16}?)\s+(\d\.\d{3})\s+(-|[+-]\d\.\d{3} ± \d\.\d{3})\s+(\d+\.\d%)\s+([01]\.\d{3})\s+(\d+\.\d%)$",
        out, re.MULTILINE)}
    assert set(rows) == set(level0.ARMS)
    assert rows["none"].group(6) == "0.0%" and rows["true intent"].group(6) == "100.0%"
    for name in ("keywords", "likelihood risk", "head topic risk", "learned failure", "keywords + learned"):
        assert re.search(rf"^  {re.escape(name)}\s+(-|\d\.\d{{3}})\s+\d+\.\d%$", out, re.MULTILINE), name
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"level0 served_vs_none=[+-]\d\.\d{3} head_vs_none=[+-]\d\.\d{3} intent_vs_none=[+-]\d\.\d{3} "
                        r"keyword_auc=(-|\d\.\d{3}) learned_auc=(-|\d\.\d{3})", last), last


def test_each_arm_writes_its_own_directions_line() -> None:
    from svc_probe.core import ProbeResult

    records = load_suite("fresh")[:2]
    result = ProbeResult((("give_code", 0.5), ("give_steps", 0.3), ("summarize", 0.2)), 0.5, 0.1, False, "")
    probed = {"likelihood": [result, result], "head": [result, result]}
    assert level0._lines("none", records, probed) == [(), ()]
    assert level0._lines("true intent", records, probed) == [(r.intent,) for r in records]
    assert level0._lines("likelihood top-3", records, probed)[0] == ("give_code", "give_steps", "summarize")
    assert level0._lines("head top-1", records, probed)[1] == ("give_code",)


def test_a_detector_flags_its_highest_scores_at_the_keywords_rate() -> None:
    assert level0._top_share([0.1, 0.9, 0.5, 0.7], 0.5) == [False, True, False, True]
    detector = level0._detector("x", [0.1, 0.9, 0.5, 0.7], [False, True, True, False], 0.5)
    assert detector.caught == 0.5 and detector.auc == 0.75
