"""A turn of the RM loop on the ci zoo, for real: labelled answers of the zoo's own policy, a strong RM
fine-tuned and a light RM re-distilled, judged on held-out labels, promoted only if better."""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from strata.audit import STRONG_AUDIT, AuditLabel, add_labels
from strata_tools.cli.main import main
from strata_tools.rm.loop import run_every
from strata_tools.rm.onpolicy import policy_answers
from strata_tools.rm.refresh import RefreshOptions
from strata_tools.rm.registry import RmRegistryAdmin
from strata_tools.zoo.build import ZooOnDemand, ZooPaths, ZooSettings
from svc_reward.registry import describe

pytestmark = pytest.mark.integration


@pytest.fixture
def labels_file(zoo: ZooPaths, tmp_path: Path) -> Path:
    """Level-1 and Level-2 answers of the ci zoo to 70 fresh prompts, scored as an annotator would (the
    oracle, noise sd 0.3, rounded to halves)."""
    answers = policy_answers(zoo, "fresh", cache_dir=zoo.root.parent.parent / "rm" / "onpolicy", limit=70,
                             progress=False)
    rng = random.Random(0)
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps({"prompt": a.prompt, "response": a.response,
                                        "score": min(5.0, max(0.0, round(2 * (a.oracle + rng.gauss(0, 0.3))) / 2))})
                            + "\n" for a in answers))
    return path


@pytest.fixture
def own_redis(infra, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[redis.Redis]:
    """A Redis database of its own (what is in service is what this test promoted) and the zoo's settings."""
    url = infra.redis_address.rsplit("/", 1)[0] + "/11"
    client = redis.Redis.from_url(url)
    client.flushdb()
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", infra.kafka_address)
    monkeypatch.setenv("STRATA_REDIS_URL", url)
    monkeypatch.setenv("STRATA_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("STRATA_ZOO_PRESET", os.environ.get("STRATA_TEST_ZOO_PRESET", "ci"))  # the zoo fixture's
    yield client
    client.close()


def test_a_turn_judges_the_candidate_on_held_out_labels_and_promotes_only_if_better(
        zoo: ZooPaths, labels_file: Path, own_redis: redis.Redis, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    n_labels = len(labels_file.read_text().splitlines())
    code = main(["rm", "refresh", "--no-annotations", "--data", str(labels_file), "--strong-steps", "15",
                 "--replay", "1", "--distill-steps", "20", "--distill-pairs", "60", "--threads", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    [report_file] = (tmp_path / "state" / "rm-refresh").glob("*.json")
    report = json.loads(report_file.read_text())
    assert report["refused"] is None
    assert report["rule"] == ""  # the ci zoo's light RM serves no escalation rule: none to refit
    assert report["n_train"] + report["n_held_out"] == n_labels and report["n_held_out"] >= 20
    registry = RmRegistryAdmin(own_redis)
    zoo_light = describe("light", [zoo.rm_light]).version
    assert report["parents"] == {"light": zoo_light, "strong": describe("strong", [zoo.rm_strong]).version}
    light = registry.get(report["light_version"])
    strong = registry.get(report["strong_version"])
    assert light.parent == strong.version and strong.parent == report["parents"]["strong"]
    # The ci strong RM grows: it was fine-tuned before growth and grown again, and the light RM starts
    # from the new model before growth, as the zoo's does.
    assert strong.config["init"].endswith("rm_strong/student_init") and strong.config["widen"] == 2
    light_info = json.loads((Path(light.path) / "strata_rm.json").read_text())
    assert light_info["config"]["init"] == str(Path(strong.path) / "student_init")
    figures = report["figures"]
    assert set(figures) == {"light_current", "light_new", "strong_current", "strong_new"}
    assert all(f["n"] == report["n_held_out"] for f in figures.values())
    gain = figures["light_new"]["spearman"] - figures["light_current"]["spearman"]
    better = gain > report["gain_se"]  # the default: by more than one bootstrap standard error
    assert report["promoted"] == better
    assert registry.promoted() == (light.version if better else None)
    assert re.search(rf"(promoting|not promoting) {light.version}: Spearman vs the labels on "
                     rf"{report['n_held_out']} held-out answers", out)
    assert registry.last_refresh()["n_labels"] == n_labels

    # The cadence: no new labels since that turn, so the next check waits instead of retraining.
    naps: list[float] = []
    settings = ZooSettings()
    reports = run_every(RefreshOptions(annotations=False, data=(str(labels_file),), every_s=5, min_new_labels=1),
                        settings, ZooOnDemand(settings), registry, progress=lambda line: None, turns=2,
                        sleep=naps.append)
    assert reports == [] and naps == [5]


def test_too_few_labels_refuse_the_turn_with_the_counts(
        labels_file: Path, own_redis: redis.Redis, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["rm", "refresh", "--no-annotations", "--data", str(labels_file), "--min-held-out", "1000"])
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"no refresh: \d+ labels to train on and \d+ held out, of at least 20 and 1000", out)
    assert RmRegistryAdmin(own_redis).list() == []  # nothing trained, nothing registered


@pytest.mark.parametrize(("argv", "message"), [
    (["--hold-out", "1.5"], "--hold-out: Input should be less than 1"),
    (["--no-annotations"], "no labels to refresh on"),
    (["--strong-steps", "0"], "--strong-steps: Input should be greater than or equal to 1"),
])
def test_bad_options_are_refused_naming_the_flag(argv: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rm", "refresh", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_defences_request_runs_a_turn_on_the_audited_answers(own_redis: redis.Redis) -> None:
    from strata.content_store import ContentStore
    from svc_reward import audit_store

    settings = ZooSettings()
    store = ContentStore(own_redis, settings.content_ttl_s, settings.content_max_bytes)
    labels = [AuditLabel(store.put(f"How do tides work? {i}"), store.put(f"The Moon pulls {i}"),
                                     1.0 + i % 4, 3.5, 7) for i in range(6)]
    labels.append(AuditLabel("0" * 64, "1" * 64, 2.0, 3.0, 7))  # its texts expired
    with own_redis.pipeline(transaction=True) as pipe:
        add_labels(pipe, STRONG_AUDIT, labels, max_kept=100)
        pipe.execute()
    own_redis.set(audit_store.REDISTIL_KEY, json.dumps({"requested_at": 0, "policy_version": 7, "why": "test"}))
    lines: list[str] = []
    # No annotations and far fewer new labels than min_new_labels: only the request starts a turn.
    reports = run_every(RefreshOptions(annotations=False, every_s=5, min_new_labels=1000), settings,
                        ZooOnDemand(settings), RmRegistryAdmin(own_redis), progress=lines.append, turns=1,
                        sleep=lambda s: None)
    [report] = reports
    assert report.sources == {"audits": 6, "audits_expired": 1}
    assert report.refused is not None  # six labels are too few to train on: refused with the counts
    assert audit_store.redistil_request(own_redis) is not None  # kept: the next check tries again
    assert any("re-distillation at policy v7" in line for line in lines)


def test_a_request_for_peoples_labels_runs_a_turn_on_the_desks_scores_alone(
        own_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    from strata_tools.rm import loop
    from svc_reward import audit_store

    settings = ZooSettings()
    # The strong RM's audit labels (a copy of the light RM's teacher) are there but must not be read.
    with own_redis.pipeline(transaction=True) as pipe:
        add_labels(pipe, STRONG_AUDIT, [AuditLabel("0" * 64, "1" * 64, 2.0, 3.0, 7)], max_kept=100)
        pipe.execute()
    desk = [{"prompt": f"How do tides work? {i}", "response": f"The Moon pulls {i}", "score": 1.0 + i % 4}
            for i in range(5)]
    monkeypatch.setattr(loop, "annotation_rows", lambda _settings: loop.AnnotationRows(desk, 2))
    own_redis.set(audit_store.REDISTIL_KEY, json.dumps({"requested_at": 0, "policy_version": 9, "why": "people",
                                                       "labels": "people"}))
    lines: list[str] = []
    # Annotations off in the options: the request for people's labels turns them on for its turn.
    [report] = run_every(RefreshOptions(annotations=False, audits=True, every_s=5, min_new_labels=1000), settings,
                         ZooOnDemand(settings), RmRegistryAdmin(own_redis), progress=lines.append, turns=1,
                         sleep=lambda s: None)
    assert report.sources == {"annotations": 5, "annotations_expired": 2}
    assert any("people's scores of the policy's answers" in line for line in lines)


def test_a_request_set_during_the_turn_outlives_the_clearing_of_the_one_answered(own_redis: redis.Redis) -> None:
    from svc_reward import audit_store

    first = {"requested_at": 1.0, "policy_version": 7, "why": "first alarm"}
    own_redis.set(audit_store.REDISTIL_KEY, json.dumps(first))
    answered = audit_store.redistil_request(own_redis)
    second = {"requested_at": 2.0, "policy_version": 9, "why": "a second alarm, while the turn ran"}
    own_redis.set(audit_store.REDISTIL_KEY, json.dumps(second))
    assert not audit_store.clear_redistil(own_redis, answered)
    assert audit_store.redistil_request(own_redis) == second
    assert audit_store.clear_redistil(own_redis, second) and audit_store.redistil_request(own_redis) is None
    assert not audit_store.clear_redistil(own_redis, second)  # nothing left to clear
