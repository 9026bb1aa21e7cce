"""Kafka and Redis for one bench run: its own on free ports (the default), or the configured ones."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TypeVar

from strata.config import StrataSettings

S = TypeVar("S", bound=StrataSettings)


def _start_infra(settings: StrataSettings) -> None:
    from kafka.errors import KafkaError

    from strata.bus import topics
    from strata.bus.admin import groups_reading
    from strata.errors import CliError
    from strata_tools.infra import InfraError, up

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
    import shutil

    from strata_tools.infra import down
    from strata_tools.infra.process import free_port, free_port_block

    own = settings.kafka_managed or settings.redis_managed
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
                down(settings, purge=True)
            shutil.rmtree(settings.state_dir, ignore_errors=True)
