"""A bench's logs outlive the purge of its state dir (issue 64): copied to the reports, newest runs kept."""

from __future__ import annotations

import os
from pathlib import Path

from strata_tools.bench.infra import keep_logs


def run_dir(root: Path, name: str) -> Path:
    state = root / name
    for path, text in {"logs/svc_reward.log": "reward tier=1 prompt=ab12", "kafka/logs/server.log": "started",
                       "kafka/data/strata.rewards-0/00000000000000000000.log": "SEGMENT",
                       "redis/redis.log": "ready", "redis/appendonlydir/appendonly.aof": "DATA"}.items():
        (state / path).parent.mkdir(parents=True, exist_ok=True)
        (state / path).write_text(text)
    return state


def test_logs_are_copied_without_the_data(tmp_path: Path) -> None:
    kept = keep_logs(run_dir(tmp_path, "run"), tmp_path / "reports", "tiers", "abc")
    assert kept == tmp_path / "reports" / "logs" / "tiers-abc"
    copied = sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file())
    assert copied == ["kafka/logs/server.log", "logs/svc_reward.log", "redis/redis.log"]
    assert (kept / "logs" / "svc_reward.log").read_text() == "reward tier=1 prompt=ab12"


def test_only_the_newest_runs_of_a_bench_are_kept(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    for i in range(4):
        kept = keep_logs(run_dir(tmp_path, f"run{i}"), reports, "tiers", f"r{i}", keep=2)
        assert kept is not None
        os.utime(kept, (1000 + i, 1000 + i))  # distinct ages, whatever the file system's clock resolution
    keep_logs(run_dir(tmp_path, "other"), reports, "peers", "p0", keep=2)
    assert sorted(p.name for p in (reports / "logs").iterdir()) == ["peers-p0", "tiers-r2", "tiers-r3"]


def test_a_run_without_logs_keeps_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert keep_logs(tmp_path / "empty", tmp_path / "reports", "tiers", "x") is None
