"""``python -m svc_scheduler``: the front door (gRPC Scheduler), its statistics worker and its loops.

    python -m svc_scheduler --grpc-port 50051 --k 10 --min-similarity 0.75

Every ``SchedulerSettings`` field is a flag (and a ``STRATA_*`` variable); see docs/scheduler.md.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from strata.bus import Publisher, Worker
from strata.bus.admin import LagReader
from strata.config import add_settings_flags, parse_settings
from strata.content_store import ContentStore
from strata.contract.models import ModelNotConfiguredError, model_path
from strata.epoch import mark_start
from strata.models.budget import TokenBudget
from strata.rpc import ServiceBinding, token_table
from strata.rpc_auth import CallerIdentity
from strata.service import ServiceParts, run_service
from strata.telemetry import setup_logging
from svc_scheduler.backlog import BacklogGauge
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.encoder import Encoder
from svc_scheduler.engine import SchedulerEngine
from svc_scheduler.servicer import SERVICE_NAME, SchedulerServicer, add_to_server
from svc_scheduler.store import SchedulerStore, connect
from svc_scheduler.watch import WatchFeed, WatchHub
from svc_scheduler.worker import IndexSync, StatsUpdater

log = logging.getLogger(__name__)


def tier_budgets(settings: SchedulerSettings) -> list[TokenBudget]:
    """The tiers' models as the prompt token check reads them (tokenizer and positions, no weights)."""
    if not settings.check_prompt_tokens:
        return []
    budgets = []
    for name, role, configured, flag in (("Level-1", "level1", settings.level1_model, "--level1-model"),
                                         ("Level-2", "level2", settings.level2_model, "--level2-model")):
        try:
            path = model_path(role, configured, settings.cache_dir, settings.zoo_preset, flag)
        except ModelNotConfiguredError as exc:
            log.warning("prompt token check: %s; prompts are not checked against the %s model", exc, name)
            continue
        budget = TokenBudget.of_model(name, path)
        twin = next((b for b in budgets if b.reads_like(budget)), None)
        if twin is not None:  # the same tokenizer, template and positions: one check per prompt serves both
            log.info("prompt token check: the %s model reads as the %s model does", name, twin.name)
            continue
        budgets.append(budget)
        log.info("prompt token check: %s model reads %d positions (%s)", name, budget.n_positions, path)
    return budgets


def with_card_thresholds(settings: SchedulerSettings, card: Mapping[str, Any]) -> SchedulerSettings:
    """``settings`` with the thresholds the encoder's card re-measured in its vector space, where not set.

    A threshold set explicitly (flag, environment) wins over the card, and says so.
    """
    thresholds = card.get("thresholds", {})
    chosen = {name: value for name, value in thresholds.items() if name not in settings.model_fields_set}
    for name in sorted(set(thresholds) - set(chosen)):
        log.warning("encoder card suggests %s=%s for its vector space; the configured %s is kept", name,
                    thresholds[name], getattr(settings, name))
    if chosen:
        log.info("encoder card thresholds applied: %s", ", ".join(f"{k}={v}" for k, v in sorted(chosen.items())))
    return settings.model_copy(update=chosen) if chosen else settings


def build_parts(settings: SchedulerSettings, encoder: Encoder | None = None) -> tuple[ServiceParts, SchedulerEngine]:
    """Everything one scheduler replica runs (tests start it in-process with ``start_service``)."""
    replica = f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
    encoder = encoder or Encoder.from_settings(settings)
    settings = with_card_thresholds(settings, getattr(encoder, "card", {}))
    client = connect(settings)
    mark_start(client, "svc_scheduler")  # an empty Redis is recognisable later (strata recover)
    store = SchedulerStore(client, settings)
    content = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    publisher = Publisher(settings, client_id=f"svc-scheduler-{replica}")
    # The door sheds rollouts while the tiers behind it are too far behind (svc_scheduler/backlog.py).
    backlog = BacklogGauge(settings, lambda: LagReader(settings, client_id=f"svc-scheduler-backlog-{replica}",
                                                        timeout_ms=2000))
    engine = SchedulerEngine(settings, encoder, store, content, publisher, shed=backlog.shed)
    # Positioned at the end before the index is rebuilt, so no announcement falls in between.
    index_sync = IndexSync(settings, engine, client_id=f"svc-scheduler-index-{replica}")
    with contextlib.suppress(ConnectionError):  # Redis down: Submit answers UNAVAILABLE, rebuilds when it is back
        engine.ensure_ready()
    hub = WatchHub(settings.watch_buffer_s, settings.watch_buffer_max_prompts, settings.watch_buffer_max_events)
    feed = WatchFeed(settings, hub, client_id=f"svc-scheduler-watch-{replica}")
    stop_servicer = threading.Event()
    servicer = SchedulerServicer(engine, hub, settings, stop_servicer, tier_budgets(settings),
                                 CallerIdentity(token_table(settings)))
    stats_worker = Worker(settings, settings.stats_group_id, StatsUpdater(store, settings).handlers(), publisher,
                          client_id=f"svc-scheduler-stats-{replica}")
    parts = ServiceParts(
        name="svc_scheduler",
        settings=settings,
        bindings=[ServiceBinding(add_to_server, servicer, SERVICE_NAME)],
        grpc_port=settings.grpc_port,
        workers=[stats_worker],
        loops=[index_sync.run, feed.run, backlog.run],
        on_stopping=[stop_servicer.set],  # open Watch streams end as soon as the service is told to stop
        on_stop=[publisher.close, client.close],
        stream_slots=settings.max_watch_streams,
    )
    return parts, engine


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m svc_scheduler", description=__doc__.splitlines()[0])
    parser.add_argument("--json-logs", action="store_true", help="one JSON object per log line")
    add_settings_flags(parser, SchedulerSettings)
    settings, args = parse_settings(parser, SchedulerSettings, argv)
    setup_logging(settings.log_level, json_lines=args.json_logs, debug_rollout=settings.debug_rollout)
    parts, _engine = build_parts(settings)
    return run_service(parts)


if __name__ == "__main__":
    sys.exit(main())
