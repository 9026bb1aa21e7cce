"""``strata bench zoo`` on the ci zoo: every figure it promises is printed, the last line parses."""

from __future__ import annotations

import re

import pytest

from strata_tools.cli.main import main
from strata_tools.zoo.build import ZooPaths
from svc_reward.registry import describe


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
    assert set(fields) >= {"l2_over_l1_oracle", "rm_strong_spearman", "rm_light_spearman", "rm_strong_match",
                           "rm_light_match"}
    assert 0.0 <= float(fields["rm_strong_match"]) <= 1.0


def test_bench_rm_compares_the_served_light_rm_with_its_teacher(
    zoo: ZooPaths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STRATA_ZOO_PRESET", zoo.config.preset)
    monkeypatch.setenv("STRATA_CACHE_DIR", str(zoo.root.parent.parent))
    code = main(["bench", "rm", "--batch", "8", "--repeats", "1", "--threads", "1", "--onpolicy-prompts", "40"])
    assert code == 0
    out = capsys.readouterr().out
    # By default the light RM is the zoo's, the one svc_reward serves, distilled from the zoo's strong RM.
    teacher = describe("strong", [zoo.rm_strong]).version
    assert f"light RM {zoo.rm_light}" in out and f"distilled from {teacher}" in out
    assert re.search(r"^fresh \(\d+ pairs\): light vs strong spearman=", out, re.MULTILINE)
    assert re.search(r"^prompt match on \d+ eval prompt swaps: light [01]\.\d{3}, strong [01]\.\d{3}", out,
                     re.MULTILINE)
    # Both RMs on the policy's own answers: of 40 test prompts, those live Level-1 answers, one Level-1 and one
    # Level-2 answer each.
    answered = re.search(r"^on the policy's answers \(test split, (\d+) prompts;", out, re.MULTILINE)
    assert answered and 0 < int(answered.group(1)) <= 40
    assert re.search(r"^strong +-?[01]\.\d{3} +-?[01]\.\d{3} ", out, re.MULTILINE)
    last = out.strip().splitlines()[-1]
    figure = r"(-?[01]\.\d{3}|nan)"
    assert re.fullmatch(rf"rm spearman=-?[01]\.\d{{3}} latency_ratio=\d+\.\d light_match=[01]\.\d{{3}} "
                        rf"onpolicy_l1={figure} onpolicy_l2={figure} bad_auc={figure} pair_acc={figure} "
                        rf"onpolicy_l1_lo={figure} onpolicy_l1_hi={figure} bad_auc_lo={figure} bad_auc_hi={figure}",
                        last), last
    fields = dict(item.split("=") for item in last.split()[1:])
    for name in ("onpolicy_l1", "bad_auc"):
        low, value, high = (float(fields[f"{name}{end}"]) for end in ("_lo", "", "_hi"))
        assert low <= value <= high or "nan" in (fields[f"{name}_lo"], fields[name]), (name, low, value, high)
    assert float(fields["latency_ratio"]) > 1.0  # the grown strong RM costs more than its student
    assert main(["bench", "rm", "--light", str(zoo.rm_light), "--distill"]) == 2  # one or the other
    assert main(["bench", "rm", "--temperature", "0"]) == 2
    assert "--temperature must be > 0, got 0" in capsys.readouterr().err
