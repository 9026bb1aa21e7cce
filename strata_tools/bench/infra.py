"""Kafka and Redis for one bench run: its own on free ports (the default), or the configured ones."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from kafka.errors import KafkaError

from strata.bus import topics
from strata.bus.admin import groups_reading
from strata.config import StrataSettings
from strata.errors import CliError
from strata_tools.infra import InfraError, down, up
from strata_tools.infra.process import free_port, free_port_block

S = TypeVar("S", bound=StrataSettings)

KEPT_LOG_RUNS = 5  # per bench: the newest runs' service logs survive the purge of their state dirs


def keep_logs(run_state_dir: Path, reports: Path, bench: str, run_id: str, keep: int = KEPT_LOG_RUNS) -> Path | None:
    """Copy a bench run's logs (the services', Kafka's and Redis') out of its state dir before it is purged,
    to ``reports/logs/<bench>-<run_id>/``, and drop all but the newest ``keep`` runs of that bench.
    The copy, or None when the run wrote no logs. Logs hold hashes and rewards only (R14)."""
    # The services' logs, Kafka's and Redis' (never their data: Kafka's segments are *.log files too).
    patterns = ("logs/**/*", "kafka/**/logs/*", "kafka/**/*.out", "redis/**/*.log", "redis/**/*.out",
                "sentinel*/**/*.log")
    logs = sorted({f for pattern in patterns for f in run_state_dir.glob(pattern) if f.is_file()})
    if not logs:
        return None
    target = reports / "logs" / f"{bench}-{run_id}"
    for f in logs:
        copy = target / f.relative_to(run_state_dir)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, copy)
    runs = sorted((d for d in target.parent.glob(f"{bench}-*") if d.is_dir()), key=lambda d: d.stat().st_mtime)
    for old in runs[:-keep] if keep > 0 else runs:
        shutil.rmtree(old, ignore_errors=True)
    return target


def _start_infra(settings: StrataSettings) -> None:
    try:
        up(settings)  # starts managed Kafka and Redis, checks external ones, creates the topics
    except (InfraError, KafkaError, OSError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise CliError(f"could not start or reach Kafka ({settings.kafka_address}) and Redis "
                       f"({settings.redis_address_masked}): {first}") from exc
    prompt_topics = (topics.PROMPTS_LEVEL0.name, topics.PROMPTS_LEVEL2.name)
    if live := groups_reading(settings, prompt_topics, "bench-check"):
        raise CliError(f"consumer groups are reading the prompt topics: {'; '.join(live)}: a running stack would "
                       "roll out and score the bench's prompts; stop it first (`strata down`)")


@contextlib.contextmanager
def bench_infra(settings: S, run_id: str, bench: str, cluster: bool = False) -> Iterator[S]:
    """Kafka and Redis for one run. Managed ones (the default) are the bench's own, on free ports
    under a throw-away state dir, purged at the end: the run publishes thousands of prompts and
    rewards, which a later `strata up` would otherwise roll out and learn from. External clusters
    (STRATA_KAFKA_BOOTSTRAP / STRATA_REDIS_URL) are used as they are; the events stay there.
    ``cluster``: three brokers (topics replicated 3 times, 2 in sync) and a Redis primary with a
    replica and three Sentinels, each on a block of free ports."""
    own = settings.kafka_managed or settings.redis_managed
    reports = settings.state_dir / "reports"
    if own:
        state_dir = settings.state_dir / f"bench-{bench}-{run_id}"
        settings = settings.model_copy(update={
            "state_dir": state_dir, "kafka_port": free_port(), "kafka_controller_port": free_port(),
            "redis_port": free_port(), "topic_partitions": 3,
        })
        if cluster:
            kafka_base = free_port_block(6)
            settings = settings.model_copy(update={
                "kafka_brokers": 3, "redis_replicas": 1, "kafka_port": kafka_base,
                "kafka_controller_port": kafka_base + 1, "redis_port": free_port_block(5),
            })
    else:
        print(f"{bench} bench: on the configured Kafka; its prompts and rewards stay on the shared topics",
              flush=True)
    try:
        _start_infra(settings)
        yield settings
    finally:
        if own:
            with contextlib.suppress(Exception):  # best effort: the state dir goes anyway
                down(settings, purge=False)
            with contextlib.suppress(OSError):
                if (kept := keep_logs(settings.state_dir, reports, bench, run_id)) is not None:
                    print(f"{bench} bench: logs of this run kept in {kept}", flush=True)
            shutil.rmtree(settings.state_dir, ignore_errors=True)
