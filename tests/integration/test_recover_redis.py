"""`strata recover redis` against the real broker and Redis: a Redis emptied after a run of realistic
events, the loss reported per prompt hash, the scheduler's statistics, versions and the RM registry
rebuilt equal to what they were; ``--dry-run`` writes nothing; a Redis that is intact is left alone.

Each test has topics of its own and a Redis database of its own (emptied with FLUSHDB, as a Redis
that came back empty would be), so the session's other tests are not touched.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from strata.bus import Delivery, Publisher, Topic
from strata.bus.admin import ensure_topics
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.contract.identity import request_identity
from strata.epoch import MARKER_KEY, Marker, ensure_marker, read_marker
from strata.hashing import content_hash
from strata.v1 import common_pb2, events_pb2
from strata_tools.cli import recover_cmd
from strata_tools.cli.main import main
from strata_tools.recover import (
    CAME_BACK_EMPTY,
    EXPIRED,
    INTACT,
    LOST,
    NO_HISTORY,
    PRESENT,
    RECOVERED,
    RecoverTopics,
    assess,
    text_state,
)
from strata_tools.rm.registry import RmRegistryAdmin
from svc_reward.registry import describe
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.store import SchedulerStore
from svc_scheduler.worker import StatsUpdater

pytestmark = pytest.mark.integration

L0, L1, L2 = common_pb2.TIER_LEVEL_0, common_pb2.TIER_LEVEL_1, common_pb2.TIER_LEVEL_2
LIGHT, STRONG, REUSED = common_pb2.SCORER_LIGHT, common_pb2.SCORER_STRONG, common_pb2.SCORER_REUSED
Cli = Callable[..., tuple[int, str, str]]


# -- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_topics(infra: StrataSettings) -> RecoverTopics:
    tag = uuid.uuid4().hex[:8]
    found = RecoverTopics(
        prompts=tuple(Topic(f"test.recover.{tag}.level{i}", events_pb2.PromptRouted) for i in range(3)),
        rollouts=Topic(f"test.recover.{tag}.rollouts", events_pb2.RolloutGenerated),
        rewards=Topic(f"test.recover.{tag}.rewards", events_pb2.RewardScored),
        policy=Topic(f"test.recover.{tag}.policy", events_pb2.PolicyUpdated, key_field="policy_version",
                     compacted=True),
        rm=Topic(f"test.recover.{tag}.rm", events_pb2.RewardModelUpdated, key_field="rm_version", compacted=True),
    )
    ensure_topics(infra, infra.topic_partitions, topics=found.data)
    ensure_topics(infra, 1, topics=[found.policy, found.rm])  # control topics have one partition
    return found


@pytest.fixture
def db_url(infra: StrataSettings) -> Iterator[str]:
    """A Redis database of this test's own, empty (the registry tests use 9 and 10)."""
    url = infra.redis_address.rsplit("/", 1)[0] + "/11"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def client(db_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(db_url)
    yield c
    c.close()


@pytest.fixture
def settings(infra: StrataSettings, db_url: str, monkeypatch: pytest.MonkeyPatch) -> SchedulerSettings:
    """The scheduler's settings on this test's database and prefix; `strata` reads the same from the env."""
    prefix = f"test:recover:{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", infra.kafka_address)
    monkeypatch.setenv("STRATA_REDIS_URL", db_url)
    monkeypatch.setenv("STRATA_REDIS_PREFIX", prefix)
    return SchedulerSettings()


@pytest.fixture
def publisher(infra: StrataSettings) -> Iterator[Publisher]:
    pub = Publisher(infra, client_id="test-recover", linger_ms=0)
    yield pub
    pub.close()


@pytest.fixture
def cli(settings: SchedulerSettings, fresh_topics: RecoverTopics, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Cli:
    """``strata recover redis ARGS`` in-process on this test's topics and database: (code, stdout, stderr)."""
    monkeypatch.setattr(recover_cmd, "recover_topics", lambda: fresh_topics)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["recover", "redis", *argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


# -- a run of events --------------------------------------------------------------------------------------


def stamp(field_: object, seconds: float) -> None:
    field_.FromNanoseconds(int(seconds * 1e9))  # type: ignore[attr-defined]


@dataclass
class Run:
    """Events as the services publish them, and what the scheduler's stats worker folds."""

    topics: RecoverTopics
    publisher: Publisher
    store: ContentStore
    clock: float = field(default_factory=lambda: time.time() - 600)
    rewards: list[events_pb2.RewardScored] = field(default_factory=list)
    responses: int = 0

    def tick(self) -> float:
        self.clock += 1.0
        return self.clock

    def routed(self, prompt: str, tier: int, n: int, request_id: str, escalated_from: int = 0,
               policy: int = 3) -> events_pb2.PromptRouted:
        event = events_pb2.PromptRouted(prompt_hash=self.store.put(prompt), tier=tier, n_samples=n,
                                        request_id=request_id, escalated_from=escalated_from, policy_version=policy)
        stamp(event.submitted_at, self.clock)
        stamp(event.routed_at, self.tick())
        self.publisher.publish(self.topics.prompts[tier - L0], event)
        return event

    def rollout(self, routed: events_pb2.PromptRouted, sample: int) -> events_pb2.RolloutGenerated:
        self.responses += 1
        response = self.store.put(f"response {self.responses} {uuid.uuid4()}", token_ids=[5, 6, self.responses])
        event = events_pb2.RolloutGenerated(
            prompt_hash=routed.prompt_hash, response_hash=response, tier=routed.tier, sample_index=sample,
            policy_version=routed.policy_version,
            request_id=request_identity(routed.request_id, routed.routed_at.seconds, routed.routed_at.nanos))
        stamp(event.generated_at, self.tick())
        self.publisher.publish(self.topics.rollouts, event)
        return event

    def reward(self, rollout: events_pb2.RolloutGenerated, reward: float, rm: str, final: bool = True,
               scorer: int = LIGHT, policy: int | None = None, unsafe: bool = False) -> None:
        event = events_pb2.RewardScored(
            prompt_hash=rollout.prompt_hash, response_hash=rollout.response_hash, tier=rollout.tier,
            policy_version=rollout.policy_version if policy is None else policy, rm_version=rm, reward=reward,
            scorer=scorer, final=final, escalated=not final, sample_index=rollout.sample_index,
            request_id=rollout.request_id, unsafe=unsafe)
        stamp(event.scored_at, self.tick())
        self.publisher.publish(self.topics.rewards, event)
        self.rewards.append(event)


@dataclass(frozen=True)
class Prompts:
    done: str        # Level-0 -> Level-1, both samples final
    in_flight: str   # one of two samples scored: its text lost, the client must resubmit
    escalated: str   # Level-1 escalated, Level-2 final (one request across both tiers)
    skipped: str     # a reused reward only
    no_id: str       # routed to Level-2 by a client that sent no request id
    pending: str     # generated, not scored; the prompt's text is back, its response's is not: resubmit
    queued: str      # routed only; its text is back: it finishes on its own


def publish_a_run(run: Run, light: tuple[str, str]) -> Prompts:
    tag = uuid.uuid4().hex[:8]
    text = {name: f"{name} prompt {tag}" for name in Prompts.__dataclass_fields__}
    first, second = light

    routed = run.routed(text["done"], L0, 2, f"done-{tag}")
    routed = run.routed(text["done"], L1, 2, f"done-{tag}")
    run.reward(run.rollout(routed, 0), 4.0, first)
    run.reward(run.rollout(routed, 1), 4.4, second, policy=4)  # a newer RM and policy: the earlier one ages

    routed = run.routed(text["in_flight"], L0, 2, f"flight-{tag}")
    routed = run.routed(text["in_flight"], L1, 2, f"flight-{tag}")
    run.reward(run.rollout(routed, 0), 3.9, first)
    run.rollout(routed, 1)

    routed = run.routed(text["escalated"], L1, 1, f"esc-{tag}")
    run.reward(run.rollout(routed, 0), 1.0, first, final=False)
    routed = run.routed(text["escalated"], L2, 1, f"esc-{tag}", escalated_from=L1)
    run.reward(run.rollout(routed, 0), 3.5, "strong-1", scorer=STRONG)

    skipped = events_pb2.RewardScored(prompt_hash=run.store.put(text["skipped"]), scorer=REUSED, final=True,
                                      reward=4.0, rm_version=first, request_id=f"skip-{tag}")
    stamp(skipped.scored_at, run.tick())
    run.publisher.publish(run.topics.rewards, skipped)
    run.rewards.append(skipped)

    routed = run.routed(text["no_id"], L2, 1, "")
    run.reward(run.rollout(routed, 0), 2.0, "strong-1", scorer=STRONG, unsafe=True)

    routed = run.routed(text["pending"], L0, 1, f"pending-{tag}")
    run.rollout(run.routed(text["pending"], L1, 1, f"pending-{tag}"), 0)

    run.routed(text["queued"], L0, 1, f"queued-{tag}")
    run.publisher.flush()
    return Prompts(**text)


def fake_rm(directory: Path, seed: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(f"weights {seed}".encode())
    return directory


def announce_policies(publisher: Publisher, topic: Topic, root: Path, versions: list[int]
                      ) -> list[events_pb2.PolicyUpdated]:
    """Checkpoints whose metadata names their version (the scheduler checks it), announced."""
    events = []
    for version in versions:
        directory = root / f"v{version}"
        directory.mkdir(parents=True)
        (directory / "strata_checkpoint.json").write_text(json.dumps({"version": version}))
        event = events_pb2.PolicyUpdated(policy_version=version, checkpoint_path=str(directory),
                                         checksum=f"{version:064x}")
        event.published_at.GetCurrentTime()
        publisher.publish_and_wait(topic, event)
        events.append(event)
    return events


def delivered(topic: Topic, message: object) -> Delivery:
    return Delivery(topic, message, None, 0, 0, 1, int(time.time() * 1000))


def state(client: redis.Redis, store: SchedulerStore, settings: SchedulerSettings, hashes: list[str]) -> dict:
    """What the rebuild must give back: statistics, idempotency keys, versions, the registry."""
    registry = RmRegistryAdmin(client)
    promoted = registry.promoted()
    return {
        "stats": {h: s.to_dict() for h in hashes if (s := store.get_stats(h)) is not None},
        "seen": sorted(client.keys(f"{settings.redis_prefix}:seen:*")),
        "versions": store.versions(),
        "promoted": promoted,
        "registered": {e.version: (e.kind, e.paths, e.checksum) for e in registry.list()},
    }


def rows(out: str) -> dict[str, list[str]]:
    """The report's table, by prompt hash."""
    return {line.split()[0]: line.split()[1:] for line in out.splitlines() if len(line.split()[0]) == 64}


# -- the tests --------------------------------------------------------------------------------------------


def test_an_emptied_redis_is_reported_per_prompt_and_rebuilt_as_it_was(
    settings: SchedulerSettings, fresh_topics: RecoverTopics, publisher: Publisher, client: redis.Redis,
    cli: Cli, tmp_path: Path,
) -> None:
    content = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    store = SchedulerStore(client, settings)
    updater = StatsUpdater(store, settings)
    registry = RmRegistryAdmin(client)

    # A forged announcement (its version is not its checksum's), then two real promotions.
    forged = events_pb2.RewardModelUpdated(rm_version="light-forged", path="/models/x", checksum="0" * 64)
    stamp(forged.published_at, time.time() - 3600)
    publisher.publish_and_wait(fresh_topics.rm, forged)
    announced = [forged]
    light = []
    for seed in ("one", "two"):
        entry = registry.register(describe("light", [fake_rm(tmp_path / seed, seed)]))
        announced.append(registry.promote(entry.version, publisher, topic=fresh_topics.rm))
        light.append(entry.version)
    policies = announce_policies(publisher, fresh_topics.policy, tmp_path / "checkpoints", [3, 4, 5])
    run = Run(fresh_topics, publisher, content)
    prompts = publish_a_run(run, (light[0], light[1]))

    # What the scheduler's stats worker made of them: the same handlers, in the same order per prompt.
    for event in policies:
        updater.on_policy(delivered(fresh_topics.policy, event))
    for event in announced:
        updater.on_rm(delivered(fresh_topics.rm, event))
    for event in run.rewards:
        updater.apply(event)
    hashes = sorted({event.prompt_hash for event in run.rewards})
    before = state(client, store, settings, hashes)
    assert len(before["stats"]) == 4 and before["versions"].policy_version == 5
    assert before["versions"].rm_version == light[1] and before["promoted"] == light[1]

    # Redis comes back empty; two clients have submitted their prompts again since.
    client.flushdb()
    for name in ("pending", "queued"):
        content.put(getattr(prompts, name))
    keys = sorted(client.keys("*"))

    code, out, _ = cli("--dry-run", "--json")
    assert code == 0
    assert sorted(client.keys("*")) == keys  # nothing written, not even the marker
    report = json.loads(out)
    assert report["verdict"]["state"] == CAME_BACK_EMPTY and "no strata:epoch marker" in report["verdict"]["detail"]
    by_hash = {p["prompt_hash"]: p for p in report["prompts"]}
    digest = {name: content_hash(getattr(prompts, name)) for name in Prompts.__dataclass_fields__}
    assert set(by_hash) == set(digest.values())
    expected = {  # text, responses, responses lost, requests, in flight, to resubmit
        "done": (LOST, 2, 2, 1, 0, 0),
        "in_flight": (LOST, 2, 2, 1, 1, 1),
        "escalated": (LOST, 2, 2, 1, 0, 0),
        "skipped": (LOST, 0, 0, 1, 0, 0),
        "no_id": (LOST, 1, 1, 1, 0, 0),
        "pending": (PRESENT, 1, 1, 1, 1, 1),
        "queued": (PRESENT, 0, 0, 1, 1, 0),
    }
    for name, (text, responses, lost, requests, in_flight, resubmit) in expected.items():
        found = by_hash[digest[name]]
        assert (found["text"], found["responses"], found["responses_lost"], found["requests"], found["in_flight"],
                found["resubmit"]) == (text, responses, lost, requests, in_flight, resubmit), name
    assert report["summary"] == {"prompts": 7, "texts_lost": 5, "texts_expired": 0, "responses_lost": 8,
                                 "in_flight": 3, "resubmit": 2}
    assert report["rebuild"]["written"] is False and report["rebuild"]["rm_refused"] == 1
    assert report["line"] == (
        f"redis recovery (dry run): 7 prompts seen on Kafka, 5 texts lost, 2 in flight to resubmit; would rebuild "
        f"4 prompt statistics, versions policy v5 rm {light[1]}")
    assert not any(text in out for text in (prompts.done, prompts.pending))  # hashes, never texts

    code, out, _ = cli()
    assert code == 0
    assert out.splitlines()[-1] == (
        f"redis recovery: 7 prompts seen on Kafka, 5 texts lost, 2 in flight to resubmit; rebuilt 4 prompt "
        f"statistics, versions policy v5 rm {light[1]}")
    table = rows(out)
    assert table[digest["in_flight"]] == ["lost", "2", "of", "2", "1", "1", "yes"]
    assert table[digest["queued"]] == ["present", "0", "of", "0", "1", "1", "no"]
    after = state(client, store, settings, hashes)
    assert after == before  # statistics (to the last bit), idempotency keys, versions, registry
    marker = read_marker(client)
    assert marker is not None and marker.created_by == "strata recover redis" and marker.recovered_at is not None

    # A second run finds the marker says recovered: nothing folded twice, nothing written. (These
    # events are seconds old, within the marker's clock slack: date the marker as a loss an hour on.)
    client.hset(MARKER_KEY, "created_at", repr(marker.created_at + 3600))
    code, out, _ = cli()
    assert code == 0 and "nothing rebuilt (Redis recovered; --force rebuilds)" in out.splitlines()[-1]
    assert state(client, store, settings, hashes) == before


def test_an_intact_redis_is_left_alone_unless_forced(
    settings: SchedulerSettings, fresh_topics: RecoverTopics, publisher: Publisher, client: redis.Redis, cli: Cli,
) -> None:
    marker, created = ensure_marker(client, "test")
    assert created and ensure_marker(client, "again") == (marker, False)
    content = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    run = Run(fresh_topics, publisher, content, clock=time.time())
    routed = run.routed(f"intact {uuid.uuid4()}", L1, 1, "intact")
    run.reward(run.rollout(routed, 0), 4.2, "light-1")
    publisher.flush()

    code, out, _ = cli()
    assert code == 0
    assert "marker: strata:epoch " in out and "before the oldest event Kafka holds" in out
    assert out.splitlines()[-1] == ("redis recovery: 1 prompts seen on Kafka, 0 texts lost, 0 in flight to "
                                    "resubmit; nothing rebuilt (Redis intact; --force rebuilds), versions policy "
                                    "v3 rm none")
    store = SchedulerStore(client, settings)
    assert store.get_stats(routed.prompt_hash) is None

    code, out, _ = cli("--force")
    assert code == 0 and "rebuilt 1 prompt statistics" in out.splitlines()[-1]
    stats = store.get_stats(routed.prompt_hash)
    assert stats is not None and stats.count == 1 and stats.mean == pytest.approx(4.2)
    assert read_marker(client) is not None and read_marker(client).recovered_at is not None


def test_unreachable_kafka_or_redis_is_one_line_naming_the_address(
    cli: Cli, monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = time.monotonic()
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    code, _, err = cli("--dry-run")
    assert code == 2 and "Kafka at 127.0.0.1:1 is unreachable" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("STRATA_REDIS_URL", "redis://127.0.0.1:1/0")
    code, _, err = cli("--dry-run")
    assert code == 2 and "Redis at redis://127.0.0.1:1/0 does not answer" in err
    assert time.monotonic() - started < 15


def test_strata_infra_up_leaves_an_epoch_marker(redis_client: redis.Redis) -> None:
    marker = read_marker(redis_client)  # the session's Redis, started (or checked) by `strata infra up`
    assert marker is not None and marker.created_by == "strata infra up"


# -- pure -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("marker", "oldest", "state"), [
    (None, None, NO_HISTORY),
    (Marker("m", 500.0, "t"), None, NO_HISTORY),
    (None, 1000.0, CAME_BACK_EMPTY),                            # no marker, Kafka has history
    (Marker("m", 900.0, "t"), 1000.0, INTACT),                  # marker older than every event
    (Marker("m", 1050.0, "t"), 1000.0, INTACT),                 # within the clock slack
    (Marker("m", 2000.0, "t"), 1000.0, CAME_BACK_EMPTY),        # a new marker on a Redis younger than Kafka
    (Marker("m", 2000.0, "t", 2100.0), 1000.0, RECOVERED),      # ... that `strata recover redis` rebuilt
])
def test_the_marker_and_kafkas_oldest_event_say_whether_redis_came_back_empty(marker, oldest, state) -> None:
    assert assess(marker, oldest, slack_s=60.0).state == state
    assert assess(marker, oldest, texts_lost=3, slack_s=60.0).state == state


@pytest.mark.parametrize("marker", [None, Marker("m", 2000.0, "t")])
def test_a_redis_that_lost_no_text_predates_its_marker_rather_than_came_back_empty(marker) -> None:
    verdict = assess(marker, 1000.0, texts_lost=0, slack_s=60.0)
    assert verdict.state == INTACT and "predates the marker" in verdict.detail


@pytest.mark.parametrize(("present", "age_s", "state"), [
    (True, 10.0, PRESENT), (False, 10.0, LOST), (False, 7200.0, EXPIRED),
])
def test_a_missing_text_is_lost_unless_its_ttl_had_run_out(present, age_s, state) -> None:
    now = 1_000_000.0
    assert text_state(present, int((now - age_s) * 1000), now, ttl_s=3600) == state
