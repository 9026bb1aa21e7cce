"""``strata bench scheduler`` end to end on a small slice of the suite, through the session's Kafka and Redis."""

from __future__ import annotations

import argparse
import re

import pytest

from strata.bench import scheduler as bench
from strata.config import StrataSettings

pytestmark = pytest.mark.integration


def test_bench_runs_through_kafka_and_prints_both_rules(infra: StrataSettings, zoo, monkeypatch, capsys) -> None:
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", infra.kafka_address)
    monkeypatch.setenv("STRATA_REDIS_URL", infra.redis_address)
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    # --live: one paraphrase family (7 prompts x 2 passes) through the real tiers of the ci zoo too.
    args = parser.parse_args(["--limit", "40", "--batch", "8", "--policy-step-every", "4",
                              "--latency-sizes", "300", "--latency-queries", "5", "--n-samples", "3",
                              "--live", "--live-families", "1", "--live-audit-share", "0.5"])
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    rows = {m.group(1).strip(): (int(m.group(2)), int(m.group(3)), int(m.group(4)))
            for m in re.finditer(r"^(no skipping|GRESO same-prompt|knn \(Strata\))\s+(\d+)\s+(\d+)\s+\S+\s+(\d+)",
                                 out, re.M)}
    assert set(rows) == {"no skipping", "GRESO same-prompt", "knn (Strata)"}
    assert all(submitted == 80 for submitted, _, _ in rows.values())  # 40 prompts x 2 passes
    live = re.search(r"^knn, real tiers \(zoo \w+\)\s+(\d+)\s+(\d+)\s+\S+\s+(\d+)\s+(\d+)", out, re.M)
    simulated = re.search(r"^knn, simulated tier \(same stream\)\s+(\d+)\s+(\d+)", out, re.M)
    assert live and simulated, out
    assert int(live.group(1)) == int(simulated.group(1)) == 14  # the same stream through both tiers
    assert 7 <= int(live.group(2)) <= 14 and int(live.group(4)) == 14 - int(live.group(2))
    submitted, rollouts, _level2 = rows["knn (Strata)"]
    assert 40 <= rollouts < submitted  # every prompt rolled out once at least; some second passes skipped
    assert "policy v1 -> v3" in out  # 10 batches, a policy step every 4
    last = out.strip().splitlines()[-1]
    match = re.fullmatch(r"scheduler trigger_reduction=(\d\.\d{3}) reuse_mae=(\d\.\d{3}) "
                         r"greso_trigger_reduction=(\d\.\d{3}) live_skip_rate=(\d\.\d{3})", last)
    assert match, last
    assert float(match.group(1)) == pytest.approx(1 - rollouts / submitted, abs=1e-3)
    assert float(match.group(4)) == pytest.approx(int(live.group(4)) / 14, abs=1e-3)
