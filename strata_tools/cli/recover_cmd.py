"""``strata recover redis``: after Redis came back empty, what was lost per prompt and what Kafka rebuilds.

Reads the prompt, rollout and reward topics and the control topics as they are now (no consumer
group, nothing committed), then:

1. says whether this Redis is younger than Kafka's history (the epoch marker, ``strata.epoch``, read
   against the oldest event by ``strata_tools.recover.assess``);
2. lists per prompt hash whether its text and its responses' texts are gone from the content store
   and whether a request was left in flight that the client must submit again (hashes only);
3. rebuilds what Kafka holds, with the owners' own code: the scheduler's reward statistics (every
   ``RewardScored`` folded again by ``svc_scheduler``'s ``StatsUpdater.apply``, whose idempotency
   keys the fold writes anew, so each event counts once), the scheduler's ``versions`` (newest policy,
   promoted RM) and the RM registry's promoted versions.

It writes only when Redis came back empty and nothing was rebuilt since (or with ``--force``), and
never with ``--dry-run``. docs/reliability.md has what cannot be rebuilt and what that means.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import redis
from kafka.errors import KafkaError
from pydantic import ValidationError

from strata import epoch, redis_client
from strata.bus import PoisonMessageError
from strata.bus.scan import TopicScan
from strata.content_store import ContentStore, StoreUnavailableError
from strata.contract.checksums import recorded_policy_version, version_id
from strata.contract.control import ControlEventError, ControlEventUnavailable, check_policy_update, check_rm_update
from strata.errors import CliError
from strata.telemetry import quiet_kafka_logs
from strata.v1 import common_pb2
from strata_tools import recover
from strata_tools.recover import RecoverTopics
from strata_tools.train import request_done

if TYPE_CHECKING:
    from strata.bus.worker import Delivery
    from strata.epoch import Marker
    from strata.v1 import events_pb2
    from strata_tools.recover import LossSummary, PromptLoss, Verdict
    from strata_tools.rm.registry import RmRegistryAdmin
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.store import SchedulerStore
    from svc_scheduler.worker import StatsUpdater

log = logging.getLogger(__name__)

CREATED_BY = "strata recover redis"
NOT_REBUILT = (
    "prompt and response texts and token ids: Kafka carries hashes only; clients submit the prompts marked "
    "RESUBMIT again",
    "the scheduler's embeddings: a running replica keeps its index in memory but never writes a prompt it "
    "holds back to Redis; restart every replica so that all start from the same (empty) index",
    "the cost ledger: cost reports count from the loss on",
    "dedupe claims (generator claims, reward done and escalation keys, learner applied marks): work that was "
    "in flight and is redelivered (at least once) is done again: extra samples, rewards scored twice",
    "the scheduler's counters and skip audits; RM versions registered but never promoted (svc_reward "
    "registers the ones it serves at its next start)",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    recover = subparsers.add_parser("recover", help="rebuild state from Kafka after a loss (hashes, never texts)")
    sub = recover.add_subparsers(dest="recover_what", metavar="WHAT", required=True)
    description = ("Redis came back empty (volume lost, FLUSHALL, a new instance): list per prompt hash what the "
                   "content store lost and which requests must be submitted again, and rebuild what Kafka holds "
                   "(the scheduler's reward statistics and versions, the RM registry's promotions). Writes only "
                   "when the epoch marker says Redis is younger than Kafka's history.")
    redis_parser = sub.add_parser("redis", help="after Redis came back empty: the loss per prompt, and rebuild",
                                  description=description)
    redis_parser.add_argument("--dry-run", action="store_true", help="read and report, write nothing")
    redis_parser.add_argument("--force", action="store_true",
                              help="rebuild also when Redis looks intact or was recovered (a reward whose dedupe "
                              "key expired is then counted twice)")
    redis_parser.add_argument("--json", action="store_true", help="one JSON document: every prompt, the rebuild")
    redis_parser.set_defaults(func=run_redis)


def recover_topics() -> RecoverTopics:
    """The topics ``strata recover`` reads (tests pass their own)."""
    return RecoverTopics()


# -- connections --------------------------------------------------------------------------------------


def _settings() -> SchedulerSettings:
    from svc_scheduler.config import SchedulerSettings

    try:
        return SchedulerSettings()
    except ValidationError as exc:
        raise CliError(f"bad settings: {exc}") from None


@contextmanager
def _connections(settings: SchedulerSettings, verbose: bool) -> Iterator[tuple[redis.Redis, TopicScan]]:
    """Redis and the Kafka reader, checked up front; their failures become one-line errors naming the
    address, without kafka-python's log line per failed connection (unless -v)."""
    where = settings.redis_address_masked
    client = redis_client.connect(settings.redis_address, socket_timeout=5, socket_connect_timeout=3)
    try:
        with quiet_kafka_logs(verbose):
            try:
                client.ping()
            except redis.RedisError as exc:
                raise CliError(f"Redis at {where} does not answer: {exc}") from None
            with TopicScan(settings, client_id="strata-recover") as scan:
                try:
                    yield client, scan
                except KafkaError as exc:
                    raise CliError(f"Kafka at {scan.address}: {exc}") from None
                except (redis.RedisError, StoreUnavailableError) as exc:
                    raise CliError(f"Redis at {where}: {exc}") from None
    finally:
        client.close()


class _Progress:
    """``scanning T: n of m events`` on stderr, at most every two seconds (nothing for a short scan)."""

    def __init__(self, every_s: float = 2.0) -> None:
        self._every_s = every_s
        self._last = time.monotonic()

    def __call__(self, what: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self._last = now
            print(f"recover: {what}: {done} of {total}", file=sys.stderr, flush=True)


# -- the rebuild ----------------------------------------------------------------------------------------


@dataclass
class Rebuild:
    """What Kafka rebuilds: done when ``writing``, else what would be."""

    writing: bool
    statistics: int = 0          # prompts whose statistics were rebuilt (would be: have none now)
    reward_events: int = 0       # reward events of real scorers (reused rewards never fold)
    fold_errors: int = 0         # events the scheduler's code refused (logged)
    policy_version: int | None = None
    rm_version: str | None = None
    rm_registry_promoted: str | None = None
    rm_registry_versions: int = 0  # promoted versions Kafka announces, registered again where missing
    rm_refused: int = 0          # RM announcements refused by the checks
    policy_refused: int = 0      # policy announcements refused by the scheduler's check
    foldable: set[str] = field(default_factory=set)  # prompts with a reward of a real scorer
    changed: set[str] = field(default_factory=set)   # prompts whose statistics this run changed
    rm_at: float = -1.0          # when the newest announcement (rm_version) was published


class Rebuilder:
    """Feeds Kafka's events to the scheduler's own handlers and records the registry's promotions."""

    def __init__(self, store: SchedulerStore, updater: StatsUpdater, registry: RmRegistryAdmin, writing: bool) -> None:
        self.store, self.updater, self.registry = store, updater, registry
        self.result = Rebuild(writing)
        self._promotions: list[events_pb2.RewardModelUpdated] = []

    def reward(self, delivery: Delivery[events_pb2.RewardScored]) -> None:
        message, result = delivery.message, self.result
        if message.scorer == common_pb2.SCORER_REUSED:  # StatsUpdater.apply never folds these either
            return
        result.reward_events += 1
        result.policy_version = max(result.policy_version or 0, message.policy_version)
        result.foldable.add(message.prompt_hash)
        if not result.writing:
            return
        try:
            if self.updater.apply(message):
                result.changed.add(message.prompt_hash)
        except (ConnectionError, redis.RedisError):
            raise  # Redis is down or refuses writes: stop, nothing is half-counted (each event is atomic)
        except Exception as exc:  # the stats worker would dead-letter it: leave it out, say so
            result.fold_errors += 1
            log.warning("%s[%d]@%d (prompt %s) not folded: %s", delivery.topic.name, delivery.partition,
                        delivery.offset, message.prompt_hash[:12], exc)

    def policy(self, delivery: Delivery[events_pb2.PolicyUpdated]) -> None:
        event, result = delivery.message, self.result
        if result.writing:
            try:
                self.updater.on_policy(delivery)  # checks the checkpoint first, as the stats worker does
            except PoisonMessageError as exc:
                result.policy_refused += 1
                log.warning("%s@%d refused: %s", delivery.topic.name, delivery.offset, exc)
            return
        try:  # what on_policy would take: the same check on the same checkpoint
            check_policy_update(event.policy_version, event.checkpoint_path, event.checksum,
                                self.updater.settings.policy_checkpoint_root, recorded_policy_version)
        except ControlEventError:
            result.policy_refused += 1
            return
        except ControlEventUnavailable:
            return
        result.policy_version = max(result.policy_version or 0, event.policy_version)

    def rm(self, delivery: Delivery[events_pb2.RewardModelUpdated]) -> None:
        message, result = delivery.message, self.result
        try:
            check_rm_update(message.rm_version, list(message.ensemble_paths) or [message.path], message.checksum,
                            root=None)
            if version_id("light", message.checksum) != message.rm_version:
                raise ControlEventError(f"rm_version {message.rm_version} is not light-<its checksum>")
        except ControlEventError as exc:
            result.rm_refused += 1
            log.warning("%s@%d refused: %s", delivery.topic.name, delivery.offset, exc)
            return
        at = message.published_at.ToNanoseconds() / 1e9 if message.HasField("published_at") else 0.0
        at = at or delivery.timestamp_ms / 1000  # as StatsUpdater.on_rm: the newest announcement wins
        if at >= result.rm_at:
            result.rm_version, result.rm_at = message.rm_version, at
        self._promotions.append(message)  # offset order: the last one is the latest promotion
        if result.writing:
            self.updater.on_rm(delivery)

    def finish(self) -> Rebuild:
        """The counts, the registry's promotions, and the versions as Redis now holds them."""
        result = self.result
        result.rm_registry_versions = len({m.rm_version for m in self._promotions})
        result.rm_registry_promoted = self._promotions[-1].rm_version if self._promotions else None
        if not result.writing:
            result.statistics = sum(self.store.get_stats(h) is None for h in sorted(result.foldable))
            return result
        result.statistics = len(result.changed)
        for message in self._promotions:
            _register_promoted(self.registry, message)
        if result.rm_registry_promoted is not None and self.registry.promoted() != result.rm_registry_promoted:
            _record_promotion(self.store.client, self.registry, self._promotions[-1])
        versions = self.store.versions()
        result.policy_version, result.rm_version = versions.policy_version, versions.rm_version
        return result


def _register_promoted(registry: RmRegistryAdmin, message: events_pb2.RewardModelUpdated) -> None:
    """The registry entry of a promoted version, from its announcement (idempotent: an entry that
    exists is kept). Kafka does not carry its parent or training config."""
    from svc_reward.registry import RmVersion

    paths = tuple(message.ensemble_paths) or (message.path,)
    registry.register(RmVersion(message.rm_version, "light", paths, message.checksum, dict(message.metrics),
                                config={"source": f"rebuilt from its announcement by {CREATED_BY}"}))


def _record_promotion(client: redis.Redis, registry: RmRegistryAdmin, message: events_pb2.RewardModelUpdated) -> None:
    """The second half of ``RmRegistryAdmin.promote`` (the record; Kafka has the announcement already).

    The registry has no method for it; this writes the keys ``promote`` writes, through its own
    ``_key``, so that the layout stays spelled in one place.
    """
    at = message.published_at.ToNanoseconds() / 1e9 if message.HasField("published_at") else time.time()
    entry = replace(registry.get(message.rm_version), promoted_at=at)
    with client.pipeline() as pipe:
        pipe.set(registry._key("version", entry.version), entry.to_json())
        pipe.set(registry._key("promoted"), entry.version)
        pipe.lpush(registry._key("promotions"), json.dumps({"version": entry.version, "at": at}))
        pipe.execute()


@contextmanager
def _quiet(name: str, verbose: bool) -> Iterator[None]:
    """The scheduler's handlers log each version and mark at INFO: one line per event on a refold."""
    logger = logging.getLogger(name)
    level = logger.level
    if not verbose:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


# -- the command ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    dry_run: bool
    redis: str
    kafka: str
    marker: dict[str, Any] | None
    verdict: Verdict
    events: dict[str, int]      # topic -> events read
    skipped: int                # undecodable or refused for good
    prompts: list[PromptLoss]
    summary: LossSummary
    rebuild: Rebuild


def _write_marker(client: redis.Redis, marker: Marker | None, recovered: bool, where: str) -> Marker:
    """The epoch marker, written when missing, and stamped ``recovered_at`` after a rebuild."""
    if marker is None:
        try:
            marker, _ = epoch.ensure_marker(client, CREATED_BY)
        except ValueError as exc:  # something else under the marker's key: left as it is
            raise CliError(f"Redis at {where}: {exc}") from None
    if recovered:
        now = time.time()
        epoch.mark_recovered(client, now)
        marker = replace(marker, recovered_at=now)
    return marker


def run_redis(args: argparse.Namespace) -> int:
    from strata_tools.rm.registry import RmRegistryAdmin
    from svc_scheduler.store import SchedulerStore
    from svc_scheduler.worker import StatsUpdater

    settings = _settings()
    topics = recover_topics()
    progress = _Progress()
    with _connections(settings, args.verbose) as (client, scan):
        marker = epoch.read_marker(client)
        stamps = [s for s in (scan.oldest_s(t) for t in topics.data) if s is not None]
        content = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
        history, events, skipped, present, checked = recover.History(), {}, 0, set(), set()

        def read(topic: Any, handle: Any, skip: Any = ()) -> None:
            nonlocal skipped
            count = 0
            for delivery in scan.events(topic, progress, skip):
                handle(delivery)
                count += 1
            events[topic.name], skipped = count, skipped + scan.skipped

        def check_texts() -> list[PromptLoss]:
            """Which texts the content store holds, of the hashes read so far; the loss per prompt."""
            todo = sorted(history.hashes() - checked)
            for i, digest in enumerate(todo, 1):
                if content.contains(digest):
                    present.add(digest)
                checked.add(digest)
                progress("texts checked in the content store", i, len(todo))
            return recover.losses(history, present, time.time(), settings.content_ttl_s, request_done)

        for topic in topics.prompts:
            read(topic, lambda d: history.add_routed(d.message, d.timestamp_ms))
        read(topics.rollouts, lambda d: history.add_rollout(d.message, d.timestamp_ms))
        so_far = recover.LossSummary.of(check_texts())  # before anything is written: the verdict decides
        verdict = recover.assess(marker, min(stamps) if stamps else None, so_far.texts_lost + so_far.responses_lost)
        writing = not args.dry_run and (verdict.lost or args.force)
        store = SchedulerStore(client, settings)
        rebuilder = Rebuilder(store, StatsUpdater(store, settings), RmRegistryAdmin(client), writing)
        with _quiet("svc_scheduler.worker", args.verbose):
            read(topics.rewards, lambda d: (history.add_reward(d.message, d.timestamp_ms), rebuilder.reward(d)))
            read(topics.policy, rebuilder.policy, scan.refused(topics.policy))
            read(topics.rm, rebuilder.rm, scan.refused(topics.rm))
            rebuild = rebuilder.finish()
        prompts = check_texts()  # with the prompts only the rewards topic names (skips)

        if not args.dry_run:
            marker = _write_marker(client, marker, writing, settings.redis_address_masked)
    report = Report(args.dry_run, settings.redis_address_masked, scan.address,
                    None if marker is None else asdict(marker), verdict, events, skipped, prompts,
                    recover.LossSummary.of(prompts), rebuild)
    print(json.dumps(as_json(report), indent=2) if args.json else "\n".join(as_text(report)))
    return 0


# -- output ---------------------------------------------------------------------------------------------


def _versions(rebuild: Rebuild) -> str:
    policy = "none" if rebuild.policy_version is None else f"v{rebuild.policy_version}"
    return f"versions policy {policy} rm {rebuild.rm_version or 'none'}"


def summary_line(report: Report) -> str:
    """``redis recovery: 120 prompts seen on Kafka, 37 texts lost, 5 in flight to resubmit; rebuilt ...``."""
    s, r = report.summary, report.rebuild
    if r.writing:
        done = f"rebuilt {r.statistics} prompt statistics"
    elif report.dry_run:
        done = f"would rebuild {r.statistics} prompt statistics"
    else:
        done = f"nothing rebuilt (Redis {report.verdict.state}; --force rebuilds)"
    head = "redis recovery (dry run)" if report.dry_run else "redis recovery"
    return (f"{head}: {s.prompts} prompts seen on Kafka, {s.texts_lost} texts lost, {s.resubmit} in flight to "
            f"resubmit; {done}, {_versions(r)}")


def as_text(report: Report) -> list[str]:
    s, r = report.summary, report.rebuild
    lines = [f"redis {report.redis}, kafka {report.kafka}", f"marker: {report.verdict.detail}"]
    per_topic = ", ".join(f"{name} {n}" for name, n in report.events.items())
    lines.append(f"kafka: {sum(report.events.values())} events ({per_topic}); {report.skipped} undecodable or "
                 "dead-lettered as refused, left out")
    affected = [p for p in report.prompts if p.affected]
    if affected:
        header = ("PROMPT HASH", "TEXT", "RESPONSES LOST", "REQUESTS", "IN FLIGHT", "RESUBMIT")
        rows = [(p.prompt_hash, p.text, f"{p.responses_lost} of {p.responses}", str(p.requests), str(p.in_flight),
                 "yes" if p.resubmit else "no") for p in affected]
        widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                  for row in (header, *rows)]
    untouched = len(report.prompts) - len(affected)
    if untouched:
        lines.append(f"({untouched} prompts with nothing lost and nothing in flight not listed; --json lists all)")
    lines.append(f"texts: {s.texts_lost} prompt texts lost, {s.texts_expired} expired anyway, {s.responses_lost} "
                 f"response texts lost; {s.in_flight} prompts in flight, {s.resubmit} to submit again")
    verb = "rebuilt" if r.writing else "would rebuild" if report.dry_run else "not rebuilt"
    registry = (f"RM registry promoted {r.rm_registry_promoted} ({r.rm_registry_versions} versions announced)"
                if r.rm_registry_promoted else "RM registry: no promotion on Kafka")
    errors = f", {r.fold_errors} events refused by the scheduler's code" if r.fold_errors else ""
    if r.rm_refused or r.policy_refused:
        errors += f", {r.rm_refused + r.policy_refused} control events refused by their checks"
    lines.append(f"{verb}: statistics of {r.statistics} prompts from {r.reward_events} reward events{errors}; "
                 f"{_versions(r)}; {registry}")
    lines.append("not rebuilt (Kafka does not hold it):")
    lines += [f"  - {item}" for item in NOT_REBUILT]
    lines.append(summary_line(report))
    return lines


def as_json(report: Report) -> dict[str, Any]:
    r = report.rebuild
    return {
        "dry_run": report.dry_run, "redis": report.redis, "kafka": report.kafka, "marker": report.marker,
        "verdict": {"state": report.verdict.state, "detail": report.verdict.detail},
        "events": report.events, "skipped_events": report.skipped,
        "prompts": [asdict(p) | {"affected": p.affected} for p in report.prompts],
        "summary": asdict(report.summary),
        "rebuild": {
            "written": r.writing, "statistics": r.statistics, "reward_events": r.reward_events,
            "fold_errors": r.fold_errors, "policy_version": r.policy_version, "rm_version": r.rm_version,
            "rm_registry_promoted": r.rm_registry_promoted, "rm_registry_versions": r.rm_registry_versions,
            "rm_refused": r.rm_refused, "policy_refused": r.policy_refused,
        },
        "not_rebuilt": list(NOT_REBUILT),
        "line": summary_line(report),
    }
