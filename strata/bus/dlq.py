"""Dead letters: read a ``<topic>.dlq``, parse its headers into records, replay them to the source.

A dead letter is the original key and value of an event that could not be decoded or kept failing,
with where it came from and why in ``strata-dlq-*`` headers (written by ``strata.bus.worker``).
Everything here deals in hashes, sizes and reasons; texts live in Redis and never pass through.

Replay bookkeeping: what was replayed is stored as commits of the consumer group
``strata-dlq-replay`` on the DLQ topic, so it lives in Kafka next to the dead letters, needs no
extra topic or state file, and ``kafka-consumer-groups --describe --group strata-dlq-replay`` shows
it (the lag is what is left to replay). Per DLQ partition the committed offset means "everything
below was replayed" and the commit metadata lists the replayed offsets above it as ranges
(``"5-9,12"``), because an operator may replay single offsets out of order and a dead letter that
cannot be replayed (its dropped value is past retention) must not hold back the ones behind it.
The mark is written after the broker acknowledged the republished events (every
``_MARK_EVERY`` events and at the end, also when the run fails half-way), so a crash in between
replays a few events twice at worst, which downstream idempotence by hash absorbs.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from google.protobuf.json_format import MessageToDict
from kafka.structs import OffsetAndMetadata, TopicPartition

from strata.bus.errors import is_too_large
from strata.bus.producer import Publisher
from strata.bus.scan import tool_consumer
from strata.bus.security import KafkaTarget, kafka_connection
from strata.bus.serde import PoisonMessageError, decode
from strata.bus.topics import DLQ_SUFFIX, Topic
from strata.errors import CliError

log = logging.getLogger(__name__)

REPLAY_GROUP = "strata-dlq-replay"
REPLAYED_FROM = "strata-dlq-replayed-from"  # header of a replayed event: "<dlq topic>@<position>"
_H = "strata-dlq-"  # prefix of the headers the worker writes
_DROPPED = re.compile(r"(\d+) bytes, sha256 ([0-9a-f]{64})")
# Kafka refuses commit metadata over offset.metadata.max.bytes (4096 by default).
_MAX_METADATA = 4000
_MARK_EVERY = 100
ELIDE_OVER = 200  # characters: longer strings are shown as their length and sha256


@dataclass(frozen=True)
class DeadLetter:
    """One record of a DLQ topic, its headers parsed."""

    dlq_topic: str
    partition: int             # of the DLQ topic (Strata creates DLQs with one partition)
    offset: int                # in the DLQ topic
    timestamp_ms: int          # when it was dead-lettered
    key: bytes | None          # the original key: the prompt hash (or the version of a control event)
    value: bytes | None        # the original bytes; b"" when they were dropped
    headers: tuple[tuple[str, bytes], ...]
    source_topic: str          # header, else the DLQ name minus ".dlq"
    source_partition: int | None
    source_offset: int | None
    stage: str                 # "decode" | "handler" ("" when the header is missing)
    error: str
    attempts: int | None
    group: str                 # the consumer group that gave up on it
    dropped: str | None        # "<size> bytes, sha256 <digest>; ..." when the value was too large to copy

    @classmethod
    def from_record(cls, record: Any) -> DeadLetter:
        headers = tuple((name, bytes(value or b"")) for name, value in record.headers or ())
        found = {name: value.decode("utf-8", "replace") for name, value in headers}
        return cls(
            dlq_topic=record.topic, partition=record.partition, offset=record.offset,
            timestamp_ms=record.timestamp, key=record.key, value=record.value, headers=headers,
            source_topic=found.get(_H + "source-topic") or record.topic.removesuffix(DLQ_SUFFIX),
            source_partition=_int_or_none(found.get(_H + "source-partition")),
            source_offset=_int_or_none(found.get(_H + "source-offset")),
            stage=found.get(_H + "stage", ""), error=found.get(_H + "error", ""),
            attempts=_int_or_none(found.get(_H + "attempts")), group=found.get(_H + "group", ""),
            dropped=found.get(_H + "value-dropped"),
        )

    @property
    def position(self) -> str:
        """How the CLI names it: the offset, with ``partition:`` in front beyond partition 0."""
        return format_position(self.partition, self.offset)

    @property
    def source_position(self) -> str:
        """``partition@offset`` in the source topic, ``?`` for what the headers do not say."""
        part = "?" if self.source_partition is None else self.source_partition
        return f"{part}@{'?' if self.source_offset is None else self.source_offset}"

    @property
    def dropped_digest(self) -> tuple[int, str] | None:
        """(size, sha256) of a dropped value, from the worker's note."""
        found = _DROPPED.match(self.dropped or "")
        return (int(found.group(1)), found.group(2)) if found else None

    @property
    def timestamp(self) -> str:
        return iso_time(self.timestamp_ms)


@dataclass(frozen=True)
class ReplayMark:
    """Which offsets of one DLQ partition were replayed: every offset below ``below``, and ``also``."""

    below: int = 0
    also: frozenset[int] = frozenset()

    def __contains__(self, offset: object) -> bool:
        return isinstance(offset, int) and (offset < self.below or offset in self.also)

    def count(self, beginning: int, end: int) -> int:
        """Replayed offsets in ``[beginning, end)``."""
        return max(0, min(self.below, end) - beginning) + sum(beginning <= o < end for o in self.also)

    def add(self, offsets: Iterable[int], beginning: int) -> ReplayMark:
        """With ``offsets`` replayed too; what retention deleted (below ``beginning``) counts as done."""
        also = set(self.also) | set(offsets)
        below = max(self.below, beginning)
        while below in also:
            below += 1
        return ReplayMark(below, frozenset(o for o in also if o > below))

    def metadata(self) -> str:
        """``also`` as ranges (``"5-9,12"``); the highest ranges are left out past Kafka's limit
        (they would then be replayed again by a later ``--all``: harmless, and logged)."""
        text = ""
        for first, last in _ranges(self.also):
            part = str(first) if first == last else f"{first}-{last}"
            if len(text) + len(part) + 1 > _MAX_METADATA:
                log.warning("replay mark too long for Kafka's commit metadata: offsets from %d on are not "
                            "recorded and a later replay --all republishes them", first)
                break
            text = f"{text},{part}" if text else part
        return text

    @classmethod
    def parse(cls, committed: OffsetAndMetadata | None) -> ReplayMark:
        if committed is None or committed.offset < 0:
            return cls()
        also: set[int] = set()
        for part in filter(None, (committed.metadata or "").split(",")):
            first, _, last = part.partition("-")
            if not (first.isdigit() and (not last or last.isdigit())):
                log.warning("ignoring commit metadata %r of group %s: not offset ranges", committed.metadata,
                            REPLAY_GROUP)
                return cls(committed.offset)
            also.update(range(int(first), int(last or first) + 1))
        return cls(committed.offset, frozenset(o for o in also if o > committed.offset))


@dataclass(frozen=True)
class DlqSummary:
    """One DLQ topic at a glance, from offsets and the replay group's commits (no record is read)."""

    dlq_topic: str
    exists: bool
    dead_letters: int = 0   # end minus beginning offsets, over its partitions
    replayed: int = 0

    @property
    def pending(self) -> int:
        return self.dead_letters - self.replayed


@dataclass(frozen=True)
class ReplayOutcome:
    letter: DeadLetter
    status: str             # "replayed" | "would replay" | "already replayed" | "not replayable"
    detail: str = ""        # why not, or what was special (value fetched from the source)
    value_size: int | None = None


@dataclass
class ReplayReport:
    dlq_topic: str
    selected: int
    outcomes: list[ReplayOutcome] = field(default_factory=list)

    def with_status(self, status: str) -> list[ReplayOutcome]:
        return [o for o in self.outcomes if o.status == status]


class SourceUnavailable(Exception):
    """The original bytes of a dropped value cannot be had from the source topic any more."""


# -- topics and positions ---------------------------------------------------------------------------


def resolve_topic(name: str, topics: Sequence[Topic[Any]]) -> Topic[Any]:
    """The topic named ``name`` or its DLQ twin ``name.dlq``; CliError listing the known ones."""
    wanted = name.removesuffix(DLQ_SUFFIX)
    for topic in topics:
        if topic.name == wanted:
            return topic
    known = ", ".join(t.name for t in topics)
    raise CliError(f"unknown topic {name!r}; known topics (or their {DLQ_SUFFIX} twins): {known}")


def format_position(partition: int, offset: int) -> str:
    return str(offset) if partition == 0 else f"{partition}:{offset}"


def parse_position(text: str) -> tuple[int, int]:
    """``"12"`` -> (0, 12); ``"1:12"`` -> (1, 12)."""
    part, _, offset = text.rpartition(":")
    if not offset.isdigit() or (part and not part.isdigit()):
        raise ValueError(f"not an offset: {text!r} (OFFSET or PARTITION:OFFSET)")
    return int(part or 0), int(offset)


# -- what may be shown ------------------------------------------------------------------------------


def iso_time(timestamp_ms: int) -> str:
    return datetime.fromtimestamp(timestamp_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def digest_note(data: bytes) -> str:
    return f"{len(data)} B, sha256 {hashlib.sha256(data).hexdigest()}"


def shown_key(key: bytes | None) -> str:
    """The key as text when it looks like a hash or version (short, printable), else its digest."""
    if key is None:
        return "-"
    text = key.decode("utf-8", "replace")
    if len(text) <= 80 and text.isprintable() and " " not in text:
        return text
    return f"<{digest_note(key)}>"


def one_line(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def elide(value: Any, limit: int = ELIDE_OVER) -> Any:
    """``value`` (a MessageToDict tree) with every string over ``limit`` characters replaced by its
    length and sha256: events carry hashes, but nothing that looks like a text leaves this module."""
    if isinstance(value, dict):
        return {key: elide(item, limit) for key, item in value.items()}
    if isinstance(value, list):
        return [elide(item, limit) for item in value]
    if isinstance(value, str) and len(value) > limit:
        digest = hashlib.sha256(value.encode("utf-8")).hexdigest()
        return f"<elided: {len(value)} chars, sha256 {digest}>"
    return value


def decoded_event(topic: Topic[Any], key: bytes | None, value: bytes | None) -> dict[str, Any]:
    """The event as an elided dict; PoisonMessageError when it does not decode."""
    message = decode(topic, value, key)
    return elide(MessageToDict(message, preserving_proto_field_name=True))


def shown_header(name: str, value: bytes) -> str:
    text = value.decode("utf-8", "replace")
    if len(text) > ELIDE_OVER or not text.isprintable():
        head = one_line(text, ELIDE_OVER) if text.isprintable() else base64.b64encode(value[:48]).decode()
        return f"{head} [{digest_note(value)}]"
    return text


# -- Kafka --------------------------------------------------------------------------------------------


class DeadLetterQueues:
    """Reads DLQ topics and source records, and keeps the replay marks (group ``strata-dlq-replay``).

    Short timeouts throughout: a recovery tool must say within seconds that Kafka is unreachable.
    """

    def __init__(self, cluster: KafkaTarget, client_id: str = "strata-dlq", timeout_s: float = 20.0) -> None:
        self.cluster = cluster
        self.address = kafka_connection(cluster)["bootstrap_servers"]
        self._timeout_s = timeout_s
        self._consumer = tool_consumer(cluster, client_id, group_id=REPLAY_GROUP)

    def close(self) -> None:
        self._consumer.close(autocommit=False)

    def __enter__(self) -> DeadLetterQueues:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- offsets and marks -----------------------------------------------------------------------

    def partitions(self, name: str) -> list[TopicPartition]:
        """The topic's partitions; empty when it does not exist."""
        return [TopicPartition(name, p) for p in sorted(self._consumer.partitions_for_topic(name) or ())]

    def bounds(self, name: str) -> dict[int, tuple[int, int]]:
        """partition -> (beginning, end): the offsets the topic still holds."""
        parts = self.partitions(name)
        if not parts:
            return {}
        beginning, end = self._consumer.beginning_offsets(parts), self._consumer.end_offsets(parts)
        return {tp.partition: (beginning[tp], end[tp]) for tp in parts}

    def dlq_bounds(self, topic: Topic[Any]) -> dict[int, tuple[int, int]]:
        """``bounds`` of the topic's DLQ; CliError when it does not exist."""
        bounds = self.bounds(topic.dlq)
        if not bounds:
            raise CliError(f"{topic.dlq} does not exist on Kafka at {self.address} (create the topics: "
                           "`strata infra up`)")
        return bounds

    def marks(self, dlq_topic: str) -> dict[int, ReplayMark]:
        return {tp.partition: ReplayMark.parse(self._consumer.committed(tp, metadata=True))
                for tp in self.partitions(dlq_topic)}

    def summary(self, topic: Topic[Any]) -> DlqSummary:
        bounds = self.bounds(topic.dlq)
        if not bounds:
            return DlqSummary(topic.dlq, exists=False)
        marks = self.marks(topic.dlq)
        return DlqSummary(
            topic.dlq, exists=True,
            dead_letters=sum(end - begin for begin, end in bounds.values()),
            replayed=sum(marks[p].count(begin, end) for p, (begin, end) in bounds.items()),
        )

    def mark_replayed(self, dlq_topic: str, partition: int, offsets: Iterable[int]) -> None:
        """Record ``offsets`` of one DLQ partition as replayed (a commit of the replay group)."""
        offsets = list(offsets)
        if not offsets:
            return
        tp = TopicPartition(dlq_topic, partition)
        mark = ReplayMark.parse(self._consumer.committed(tp, metadata=True))
        mark = mark.add(offsets, self._consumer.beginning_offsets([tp])[tp])
        self._consumer.commit({tp: OffsetAndMetadata(mark.below, mark.metadata(), -1)})

    # -- records ---------------------------------------------------------------------------------

    def _records(self, tp: TopicPartition, start: int, end: int) -> Iterator[Any]:
        """The records of ``tp`` in ``[start, end)`` (fewer where compaction or retention removed some)."""
        if start >= end:
            return
        self._consumer.assign([tp])
        self._consumer.seek(tp, start)
        deadline = time.monotonic() + self._timeout_s
        while self._consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise CliError(f"could not read {tp.topic}[{tp.partition}] up to offset {end} from Kafka at "
                               f"{self.address} within {self._timeout_s:.0f} s")
            for record in self._consumer.poll(timeout_ms=500).get(tp, ()):
                if record.offset >= end:
                    return
                yield record

    def dead_letters(self, topic: Topic[Any]) -> list[DeadLetter]:
        """Every dead letter the DLQ still holds, partition by partition, in offset order."""
        bounds = self.dlq_bounds(topic)
        return [DeadLetter.from_record(record) for part, (begin, end) in bounds.items()
                for record in self._records(TopicPartition(topic.dlq, part), begin, end)]

    def dead_letter(self, topic: Topic[Any], partition: int, offset: int) -> DeadLetter:
        """The dead letter at ``partition:offset``; CliError when the DLQ does not hold it."""
        check_in_range(topic.dlq, self.dlq_bounds(topic), partition, offset)
        for record in self._records(TopicPartition(topic.dlq, partition), offset, offset + 1):
            return DeadLetter.from_record(record)
        raise CliError(f"{topic.dlq} has no record at {format_position(partition, offset)} (compacted away)")

    def source_value(self, letter: DeadLetter) -> bytes:
        """The original bytes of a dead letter whose value was dropped, read back from the source
        topic and checked against the digest in the note; SourceUnavailable when they cannot be."""
        expected = letter.dropped_digest
        if letter.source_partition is None or letter.source_offset is None or expected is None:
            raise SourceUnavailable("value dropped and its source position or digest unknown")
        tp, offset = TopicPartition(letter.source_topic, letter.source_partition), letter.source_offset
        bounds = self.bounds(letter.source_topic).get(tp.partition)
        if bounds is None:
            raise SourceUnavailable(f"value dropped and source {tp.topic}[{tp.partition}] does not exist")
        if not bounds[0] <= offset < bounds[1]:
            raise SourceUnavailable(f"value dropped and source offset {offset} no longer retained")
        for record in self._records(tp, offset, offset + 1):
            value = record.value or b""
            if (len(value), hashlib.sha256(value).hexdigest()) != expected:
                raise SourceUnavailable(f"value dropped and source offset {offset} holds other bytes "
                                        "(sha256 differs)")
            return value
        raise SourceUnavailable(f"value dropped and source offset {offset} no longer retained")


def check_in_range(dlq_topic: str, bounds: dict[int, tuple[int, int]], partition: int, offset: int) -> None:
    """CliError unless the DLQ still holds ``partition:offset``."""
    if partition not in bounds:
        raise CliError(f"{dlq_topic} has no partition {partition}; it has partitions {', '.join(map(str, bounds))}")
    begin, end = bounds[partition]
    where = format_position(partition, offset)
    if begin >= end:
        raise CliError(f"offset {where} is out of range: {dlq_topic} holds no dead letters")
    if not begin <= offset < end:
        held = f"{format_position(partition, begin)}-{format_position(partition, end - 1)}"
        raise CliError(f"offset {where} is out of range: {dlq_topic} holds offsets {held}")


# -- replay -------------------------------------------------------------------------------------------


def replay(dlq: DeadLetterQueues, topic: Topic[Any], positions: Sequence[tuple[int, int]] | None,
           again: bool = False, dry_run: bool = False, publisher: Publisher | None = None) -> ReplayReport:
    """Republish dead letters of ``topic`` (``positions``, or all when None) to their source topic.

    Already replayed ones are skipped unless ``again``; ``dry_run`` reads and checks everything and
    publishes nothing. The publisher is made here when none is given.
    """
    if positions is None:
        letters = dlq.dead_letters(topic)
    else:
        bounds = dlq.dlq_bounds(topic)
        for partition, offset in positions:
            check_in_range(topic.dlq, bounds, partition, offset)
        letters = [dlq.dead_letter(topic, partition, offset) for partition, offset in sorted(set(positions))]
    report = ReplayReport(topic.dlq, selected=len(letters))
    marks = dlq.marks(topic.dlq)
    own_publisher = publisher is None and not dry_run and bool(letters)
    if own_publisher:
        publisher = Publisher(dlq.cluster, client_id="strata-dlq-replay", linger_ms=0)
    done: dict[int, list[int]] = {}
    try:
        for letter in letters:
            mark = marks.get(letter.partition, ReplayMark())
            outcome = _replay_one(dlq, topic, letter, mark, again, dry_run, publisher)
            report.outcomes.append(outcome)
            if outcome.status == "replayed":
                done.setdefault(letter.partition, []).append(letter.offset)
                if len(done[letter.partition]) >= _MARK_EVERY:
                    dlq.mark_replayed(topic.dlq, letter.partition, done.pop(letter.partition))
    finally:
        for partition, offsets in done.items():
            dlq.mark_replayed(topic.dlq, partition, offsets)
        if own_publisher and publisher is not None:
            publisher.close()
    return report


def _replay_one(dlq: DeadLetterQueues, topic: Topic[Any], letter: DeadLetter, mark: ReplayMark, again: bool,
                dry_run: bool, publisher: Publisher | None) -> ReplayOutcome:
    if letter.offset in mark and not again:
        return ReplayOutcome(letter, "already replayed")
    value, detail = letter.value, ""
    if letter.dropped is not None:
        try:
            value = dlq.source_value(letter)
        except SourceUnavailable as exc:
            return ReplayOutcome(letter, "not replayable", str(exc))
        detail = f"value read back from {letter.source_topic}[{letter.source_partition}]@{letter.source_offset}"
    try:
        decode(topic, value, letter.key)
    except PoisonMessageError as exc:
        # Poison stays poison: republished, it would only come back to the DLQ after the retries.
        return ReplayOutcome(letter, "not replayable", f"undecodable, it would be dead-lettered again ({exc})")
    if not dlq.partitions(letter.source_topic):
        return ReplayOutcome(letter, "not replayable", f"source topic {letter.source_topic} does not exist")
    size = None if value is None else len(value)
    if dry_run:
        return ReplayOutcome(letter, "would replay", detail, size)
    assert publisher is not None
    headers = [(REPLAYED_FROM, f"{letter.dlq_topic}@{letter.position}".encode())]
    try:
        publisher.publish_raw(letter.source_topic, letter.key, value, headers)
    except Exception as exc:
        if not is_too_large(exc):
            raise
        # A value that only just fitted: the bookkeeping is in the replay group, the header is a courtesy.
        publisher.publish_raw(letter.source_topic, letter.key, value)
        detail = "; ".join(filter(None, [detail, f"without the {REPLAYED_FROM} header (too large with it)"]))
    return ReplayOutcome(letter, "replayed", detail, size)


def _ranges(offsets: Iterable[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if ranges and offset == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], offset)
        else:
            ranges.append((offset, offset))
    return ranges


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.lstrip("-").isdigit() else None

