"""``strata dlq list|show|replay``: dead letters by hash and reason, never texts (docs/reliability.md)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kafka.errors import KafkaError

from strata.bus.dlq import (
    DeadLetterQueues,
    SourceUnavailable,
    decoded_event,
    digest_note,
    one_line,
    parse_position,
    replay,
    resolve_topic,
    shown_header,
    shown_key,
)
from strata.bus.producer import PublishError
from strata.bus.serde import PoisonMessageError
from strata.bus.topics import ALL_TOPICS
from strata.config import StrataSettings
from strata.errors import CliError
from strata.telemetry import quiet_kafka_logs

if TYPE_CHECKING:
    from strata.bus.dlq import DeadLetter, ReplayReport
    from strata.bus.topics import Topic


def register(subparsers: argparse._SubParsersAction) -> None:
    dlq = subparsers.add_parser("dlq", help="dead letters: list, show, replay (hashes and reasons, never texts)")
    sub = dlq.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)

    listing = sub.add_parser("list", help="dead letters per DLQ topic; with TOPIC one row per dead letter")
    listing.add_argument("topic", nargs="?", metavar="TOPIC",
                         help="a topic or its DLQ, e.g. strata.rewards.scored or strata.rewards.scored.dlq")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(func=run_list)

    show = sub.add_parser("show", help="one dead letter: its headers and decoded event (long strings elided)")
    show.add_argument("topic", metavar="TOPIC")
    show.add_argument("position", type=_position, metavar="OFFSET",
                      help="its offset in the DLQ (PARTITION:OFFSET beyond partition 0)")
    show.set_defaults(func=run_show)

    replay = sub.add_parser("replay", help="republish dead letters to their source topic, once each")
    replay.add_argument("topic", metavar="TOPIC")
    which = replay.add_mutually_exclusive_group(required=True)
    which.add_argument("--offset", dest="positions", type=_position, nargs="+", action="extend", metavar="N",
                       help="these dead letters (repeatable)")
    which.add_argument("--all", action="store_true", help="every dead letter the DLQ holds")
    replay.add_argument("--again", action="store_true",
                        help="also republish dead letters that were replayed before (skipped by default)")
    replay.add_argument("--dry-run", action="store_true", help="read and check everything, publish nothing")
    replay.set_defaults(func=run_replay)


def known_topics() -> Sequence[Topic[Any]]:
    """The topics whose DLQs ``strata dlq`` reads (tests add their own)."""
    return ALL_TOPICS


def _position(text: str) -> tuple[int, int]:
    try:
        return parse_position(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@contextmanager
def _queues(verbose: bool) -> Iterator[DeadLetterQueues]:
    """The DLQ reader on the configured cluster; Kafka failures become one-line errors, without
    kafka-python's own log lines about each failed connection (unless -v)."""
    with quiet_kafka_logs(verbose), DeadLetterQueues(StrataSettings()) as queues:
        try:
            yield queues
        except (KafkaError, PublishError) as exc:
            raise CliError(f"Kafka at {queues.address}: {exc}") from None


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Columns padded to their widest cell; the last one (a reason) is left as it is."""
    cells = [list(header), *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header) - 1)]
    for row in cells:
        print("  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]).rstrip())


# -- list -------------------------------------------------------------------------------------------


def run_list(args: argparse.Namespace) -> int:
    with _queues(args.verbose) as queues:
        if args.topic is None:
            _list_topics(queues, args.json)
        else:
            _list_letters(queues, resolve_topic(args.topic, known_topics()), args.json)
    return 0


def _list_topics(queues: DeadLetterQueues, as_json: bool) -> None:
    summaries = [queues.summary(topic) for topic in known_topics()]
    if as_json:
        for s in summaries:
            print(json.dumps({"dlq_topic": s.dlq_topic, "exists": s.exists, "dead_letters": s.dead_letters,
                              "replayed": s.replayed, "pending": s.pending}))
        return
    rows = [(s.dlq_topic, s.dead_letters, s.replayed, s.pending) if s.exists
            else (s.dlq_topic, "-", "-", "not created (strata infra up)") for s in summaries]
    _table(("DLQ TOPIC", "DEAD LETTERS", "REPLAYED", "PENDING"), rows)


def _letter_row(letter: DeadLetter, replayed: bool) -> dict[str, Any]:
    return {
        "dlq_topic": letter.dlq_topic, "offset": letter.position, "timestamp": letter.timestamp,
        "key": shown_key(letter.key), "stage": letter.stage or None, "attempts": letter.attempts,
        "group": letter.group or None, "source_topic": letter.source_topic,
        "source_partition": letter.source_partition, "source_offset": letter.source_offset,
        "value_bytes": None if letter.dropped is not None or letter.value is None else len(letter.value),
        "value_dropped": letter.dropped, "replayed": replayed, "error": one_line(letter.error),
    }


def _list_letters(queues: DeadLetterQueues, topic: Topic[Any], as_json: bool) -> None:
    letters = queues.dead_letters(topic)
    marks = queues.marks(topic.dlq)
    rows = [_letter_row(letter, letter.offset in marks[letter.partition]) for letter in letters]
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    replayed = sum(row["replayed"] for row in rows)
    print(f"{topic.dlq}: {len(rows)} dead letters, {replayed} replayed" if rows else f"{topic.dlq}: no dead letters")
    if not rows:
        return
    _table(("OFFSET", "DEAD-LETTERED", "KEY", "STAGE", "ATT", "GROUP", "SOURCE", "VALUE", "REPLAYED", "ERROR"), [
        (row["offset"], row["timestamp"], row["key"], row["stage"] or "-", row["attempts"] or "-",
         row["group"] or "-", letter.source_position,
         "dropped" if row["value_dropped"] is not None else "-" if row["value_bytes"] is None
         else f"{row['value_bytes']} B", "yes" if row["replayed"] else "no", row["error"])
        for row, letter in zip(rows, letters, strict=True)
    ])


# -- show -------------------------------------------------------------------------------------------


def run_show(args: argparse.Namespace) -> int:
    topic = resolve_topic(args.topic, known_topics())
    partition, offset = args.position
    with _queues(args.verbose) as queues:
        letter = queues.dead_letter(topic, partition, offset)
        replayed = letter.offset in queues.marks(topic.dlq)[partition]
        value, origin = letter.value, ""
        if letter.dropped is not None:
            try:
                value = queues.source_value(letter)
                origin = (f"read back from {letter.source_topic}[{letter.source_partition}]@"
                          f"{letter.source_offset}, sha256 matches; ")
            except SourceUnavailable as exc:
                value, origin = None, str(exc)
    print(f"{letter.dlq_topic} offset {letter.position}")
    print(f"  dead-lettered  {letter.timestamp}")
    print(f"  key            {shown_key(letter.key)}")
    if letter.dropped is not None:
        print(f"  value          dropped ({letter.dropped})")
    else:
        print(f"  value          {'none (tombstone)' if letter.value is None else digest_note(letter.value)}")
    print(f"  replayed       {'yes' if replayed else 'no'}")
    print("headers")
    width = max((len(name) for name, _ in letter.headers), default=0)
    for name, raw in letter.headers:
        print(f"  {name.ljust(width)}  {shown_header(name, raw)}")
    _print_event(topic, letter, value, origin)
    return 0


def _print_event(topic: Topic[Any], letter: DeadLetter, value: bytes | None, origin: str) -> None:
    kind = topic.message_type.__name__
    if letter.dropped is not None and value is None:
        print(f"event {kind}: not shown, {origin}")
        return
    try:
        event = decoded_event(topic, letter.key, value)
    except PoisonMessageError as exc:
        size = "no value" if value is None else digest_note(value)
        print(f"event {kind}: undecodable ({exc}); {origin}{size}")
        return
    print(f"event {kind} ({origin}strings over 200 characters elided)")
    print(json.dumps(event, indent=2, sort_keys=True))


# -- replay -----------------------------------------------------------------------------------------


def run_replay(args: argparse.Namespace) -> int:
    topic = resolve_topic(args.topic, known_topics())
    with _queues(args.verbose) as queues:
        report = replay(queues, topic, None if args.all else args.positions, again=args.again, dry_run=args.dry_run)
    for outcome in report.outcomes:
        letter = outcome.letter
        if outcome.status in ("replayed", "would replay"):
            size = "no value" if outcome.value_size is None else f"{outcome.value_size} B"
            extra = f"; {outcome.detail}" if outcome.detail else ""
            print(f"{letter.position}: {outcome.status} to {letter.source_topic} ({size}{extra})")
        elif outcome.status == "not replayable":
            print(f"{letter.position}: not replayable: {outcome.detail}")
    print(summary_line(report, args.dry_run))
    return 1 if report.with_status("not replayable") else 0


def summary_line(report: ReplayReport, dry_run: bool) -> str:
    """``replayed 3 of 4 dead letters from T.dlq (1 not replayable: ...)``."""
    done = report.with_status("would replay" if dry_run else "replayed")
    notes = []
    if skipped := report.with_status("already replayed"):
        notes.append(f"{len(skipped)} already replayed, skipped: --again replays them")
    if failed := report.with_status("not replayable"):
        reasons = "; ".join(dict.fromkeys(o.detail for o in failed))  # distinct, in order
        notes.append(f"{len(failed)} not replayable: {reasons}")
    verb = "would replay" if dry_run else "replayed"
    tail = f" ({', '.join(notes)})" if notes else ""
    return f"{verb} {len(done)} of {report.selected} dead letters from {report.dlq_topic}{tail}"
