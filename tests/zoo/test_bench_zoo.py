"""``strata bench zoo`` on the ci zoo: every figure it promises is printed, the last line parses."""

from __future__ import annotations

import re

import pytest

from strata.cli.main import main
from strata.zoo.build import ZooPaths


def test_bench_zoo_prints_sizes_oracle_ratio_spearman_and_prompt_match(
    zoo: ZooPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", "zoo", "--preset", zoo.config.preset, "--cache-dir", str(zoo.root.parent.parent),
                 "--prompts", "8", "--rm-prompts", "8", "--max-new-tokens", "24"])
    assert code == 0
    out = capsys.readouterr().out
    for role in ("probe", "level1", "level2", "rm_strong", "rm_light"):
        assert re.search(rf"^{role}\s+[0-9.]+M\s+\d+", out, re.MULTILINE), role
    assert re.search(r"^rm_strong prompt match: [01]\.\d{3} of 8 reference answers", out, re.MULTILINE)
    last = out.strip().splitlines()[-1]
    fields = dict(item.split("=") for item in last.split()[1:])
    assert last.startswith("zoo l2_over_l1_oracle=")
    assert set(fields) >= {"l2_over_l1_oracle", "rm_strong_spearman", "rm_light_spearman", "rm_strong_match"}
    assert 0.0 <= float(fields["rm_strong_match"]) <= 1.0
