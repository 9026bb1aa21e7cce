"""One turn of the reward models' loop, run (``strata rm refresh``), and its cadence.

Labels (annotators' scores from svc_annotation, label files) -> split by prompt (``strata_tools.rm.refresh``)
-> the strong RM fine-tuned from the one the served light RM was distilled from, on the train slice
with replay of the zoo's RM data -> the light RM re-distilled from it, starting from the one in
service -> the four RMs scored on the held-out slice -> the candidate light RM promoted (hot swap,
``strata_tools.rm.versions``) only when it ranks the slice better. Both new versions are registered either
way, and every turn writes a report (``<state_dir>/rm-refresh/``) with the figures behind its verdict.
"""

from __future__ import annotations

import contextlib
import dataclasses as dc
import json
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import redis

from strata import redis_client
from strata.audit import STRONG_AUDIT, read_labels
from strata.content_store import ContentNotFoundError, ContentStore
from strata.errors import CliError
from strata.models.loading import load_reward_model
from strata_tools.rm.calibration import fit_isotonic
from strata_tools.rm.escalation import live_scoring_options
from strata_tools.rm.human import drifting_annotators, human_labels, label_rows, read_completed
from strata_tools.rm.lifecycle import mean_rewards, read_pairs
from strata_tools.rm.light import DistillOptions, run_distill
from strata_tools.rm.models import ZooModels, ZooSource
from strata_tools.rm.recipe import student_init_dir
from strata_tools.rm.refresh import (
    RefreshOptions,
    SliceFigures,
    fine_tune_steps,
    gain_se,
    grouped_by_prompt,
    replay_groups,
    shortfall,
    slice_figures,
    split_by_prompt,
    verdict,
)
from strata_tools.rm.rule_refit import carry_rule
from strata_tools.rm.strong import StrongOptions, train_strong
from strata_tools.rm.versions import finalize_version, promote_version, serving_light
from svc_reward.calibration_store import write_calibration
from svc_reward.signals_store import read_signals

REPORT_DIR = "rm-refresh"


@dataclass
class TurnReport:
    """What one turn saw, did and decided (written as JSON beside the others)."""

    at: float
    n_labels: int
    n_train: int
    n_held_out: int
    sources: dict[str, int]
    refused: str | None = None  # why no candidate was trained (too few labels)
    strong_version: str | None = None  # the new strong RM
    light_version: str | None = None  # the candidate light RM
    parents: dict[str, str] = field(default_factory=dict)  # what they started from: strong, light
    figures: dict[str, SliceFigures] = field(default_factory=dict)  # light_current, light_new, strong_*
    gain_se: float | None = None
    promoted: bool = False
    reason: str = ""
    seconds: float = 0.0
    # The candidate's score calibration (docs/tiers.md): "carried" when fitted and stored because the
    # version in service has one, "" when the version in service has none, else why it could not be.
    calibration: str = ""
    # The candidate's escalation rule (strata_tools.rm.rule_refit): "" when the version in service has none
    # (and fit_rule is off), "refitted ..." / "fitted ..." with its figures, or "not refitted: " / "not
    # fitted: " and why (then a promoted candidate escalates on the threshold).
    rule: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, default=str)


@dataclass(frozen=True)
class AnnotationRows:
    rows: list[dict[str, Any]]  # {prompt, response, score, ...}
    expired: int  # labels left out because their texts had expired
    drifting: frozenset[str] = frozenset()  # annotators whose scores were left out: the desk's drift alarm holds them


def annotation_rows(settings: Any, timeout_s: float = 60.0) -> AnnotationRows:
    """The annotators' scores Kafka still holds, less those of annotators in drift alarm, as {prompt, response,
    score} rows with their texts from the content store."""
    try:
        events = read_completed(settings, timeout_s)
    except Exception as exc:  # Kafka unreachable or too slow: one line naming it
        raise CliError(f"could not read the annotations from Kafka ({settings.kafka_address}): {exc}") from exc
    client = redis_client.connect(settings.redis_address, socket_timeout=10)
    try:
        drifting = drifting_annotators(client)
        store = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
        rows, expired = label_rows(human_labels(events, drifting), store.get_text)
        return AnnotationRows(rows, expired, drifting)
    except redis.RedisError as exc:
        raise CliError(f"could not read texts from Redis ({settings.redis_address_masked}): {exc}") from exc
    finally:
        client.close()


def audit_rows(settings: Any) -> tuple[list[dict[str, Any]], int]:
    """The audited Level-1 answers svc_reward keeps, as {prompt, response, score} rows labelled by the strong
    RM, with their texts from the content store; and how many were left out because their texts had expired."""
    rows, expired = [], 0
    try:
        with redis_client.connect(settings.redis_address, socket_timeout=10) as client:
            store = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
            for label in read_labels(client, STRONG_AUDIT):
                try:
                    prompt, response = store.get_texts([label.prompt_hash, label.response_hash])
                except ContentNotFoundError:
                    expired += 1
                    continue
                rows.append({"prompt": prompt, "response": response, "score": label.judge,
                             "source": f"audit v{label.policy_version}"})
    except redis.RedisError as exc:
        raise CliError(f"could not read the audited answers from Redis ({settings.redis_address_masked}): "
                       f"{exc}") from exc
    return rows, expired


def collect_labels(options: RefreshOptions, settings: Any) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every label of the turn (annotations, audits, then files; one per (prompt, response), the first kept)."""
    rows: list[dict[str, Any]] = []
    sources: dict[str, int] = {}
    if options.annotations:
        annotated = annotation_rows(settings)
        rows += annotated.rows
        sources |= {"annotations": len(annotated.rows), "annotations_expired": annotated.expired}
        if annotated.drifting:
            sources["annotators_drifting_left_out"] = len(annotated.drifting)
    if options.audits:
        found, expired = audit_rows(settings)
        rows += found
        sources |= {"audits": len(found), "audits_expired": expired}
    for path in options.data:
        found = read_pairs(Path(path), need_score=True)
        rows += found
        sources[str(path)] = len(found)
    distinct: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        distinct.setdefault((row["prompt"], row["response"]), row)
    return list(distinct.values()), sources


def serving_pair(registry: Any, zoo: ZooSource, models: ZooModels
                 ) -> tuple[tuple[str, list[Path]], tuple[str, Path]]:
    """The light RM in service and the strong RM it was distilled from (registered), else the zoo's
    (``models``, what ``zoo`` gives)."""
    from svc_reward.registry import RegistryError, describe, recorded_teacher

    light = serving_light(registry, zoo)
    parent = None
    if registry is not None:
        with contextlib.suppress(RegistryError):
            parent = registry.get(light[0]).parent
    parent = parent or recorded_teacher(light[1][0])
    if parent and registry is not None:
        try:
            entry = registry.get(parent)
            if entry.kind == "strong" and Path(entry.path).is_dir():
                return light, (entry.version, Path(entry.path))
        except RegistryError:
            pass
    return light, (describe("strong", [models.rm_strong]).version, models.rm_strong)


def _write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def _held_out_figures(models: dict[str, Sequence[Path]], held: Sequence[dict[str, Any]], max_length: int,
                      device: str) -> tuple[dict[str, SliceFigures], dict[str, list[float]]]:
    prompts = [r["prompt"] for r in held]
    responses = [r["response"] for r in held]
    labels = [float(r["score"]) for r in held]
    figures, rewards = {}, {}
    for name, paths in models.items():
        rms = [load_reward_model(p, device=device) for p in paths]
        rewards[name] = mean_rewards(rms, prompts, responses, max_length, f"held-out: {name}")
        figures[name] = slice_figures(rewards[name], labels, prompts)
        del rms
    return figures, rewards


def carry_calibration(current_paths: Sequence[str | Path], candidate: Any, held: Sequence[dict[str, Any]],
                      registry: Any, progress: Callable[[str], None] = print) -> str:
    """Fit and store the candidate light RM's score calibration on the held-out labels when the version in
    service is served calibrated: svc_reward compares the escalation threshold with the calibrated score,
    so a promotion must bring its own calibration or the threshold's scale would change under it. The
    threshold stored with the calibration in service is carried as it is: it is on the oracle's scale,
    which both calibrations map onto, and a few dozen held-out labels would choose it more noisily.

    The candidate's scores are computed as svc_reward computes them (its settings' temperature and
    aggregation). Returns the ``TurnReport.calibration`` text: "" (nothing to carry), "carried", or why not.
    """
    from svc_reward.models import RewardModels, served_calibration

    options = live_scoring_options()
    current = served_calibration([str(p) for p in current_paths], options)
    if current is None:
        return ""
    paths = [str(p) for p in candidate.paths]
    scores = RewardModels(paths, None, options).score([r["prompt"] for r in held],
                                                      [r["response"] for r in held]).rewards
    try:
        calibration = fit_isotonic(scores, [float(r["score"]) for r in held], checksum=candidate.checksum,
                                   source=f"labels of a refresh turn, {len(held)} held-out answers",
                                   temperature=options.temperature, aggregation=options.aggregation)
        calibration = dc.replace(calibration, escalation_threshold=current.escalation_threshold,
                                 target_catch=current.target_catch, bad_threshold=current.bad_threshold)
        write_calibration(paths[0], calibration)
    except ValueError as exc:  # too few distinct scores to fit, or a constant fit that is not stored
        return f"cannot calibrate {candidate.version}: {exc}"
    if registry is not None:
        registry.set_calibration(candidate.version, calibration)
    kept = ("" if calibration.escalation_threshold is None
            else f", escalation threshold {calibration.escalation_threshold:g} kept")
    progress(f"calibration of {candidate.version}: {len(calibration.raw)} knots on {len(held)} held-out labels "
             f"(the version in service is calibrated){kept}")
    return "carried"


def run_turn(options: RefreshOptions, settings: Any, zoo: ZooSource, registry: Any,
             progress: Callable[[str], None] = print,
             labelled: tuple[list[dict[str, Any]], dict[str, int]] | None = None) -> TurnReport:
    """One turn: labels (``labelled``: already collected), split, strong fine-tune, light re-distil,
    held-out verdict, maybe promotion. The zoo is read (and built) only by a turn that trains."""
    started = time.time()
    rows, sources = labelled or collect_labels(options, settings)
    train, held = split_by_prompt(rows, options.hold_out)
    report = TurnReport(at=started, n_labels=len(rows), n_train=len(train), n_held_out=len(held), sources=sources)
    progress(f"labels: {len(rows)} ({sources}); {len(train)} to train on, {len(held)} held out "
             f"({options.hold_out:.0%} of the prompts, by hash)")
    if (why := shortfall(len(train), len(held), options)) is not None:
        report.refused, report.reason = why, f"no refresh: {why}"
        return _finish(report, settings, registry, progress)

    models = zoo.models()
    recipe = models.config
    (light_version, light_paths), (strong_version, strong_path) = serving_pair(registry, zoo, models)
    report.parents = {"light": light_version, "strong": strong_version}
    progress(f"in service: light {light_version}, distilled from strong {strong_version}")
    work = Path(settings.cache_dir).expanduser() / "rm" / f".refresh-{uuid.uuid4().hex[:8]}"
    try:
        # 1. The strong RM: fine-tuned on the labels, grouped by prompt, plus replay. A grown strong RM is
        # fine-tuned before growth (its student init, at the size the recipe trains at) and grown again:
        # fine-tuning the widened RM itself lost 0.08 Spearman on held-out labels (docs/reward-models.md).
        n_prompts = len({r["prompt"] for r in train})
        replay = replay_groups(read_pairs(models.rm_data, need_score=True), round(options.replay * n_prompts),
                               options.seed)
        strong_data = work / "strong-data.jsonl"
        _write_jsonl(strong_data, grouped_by_prompt(train) + replay)
        before_growth = student_init_dir(strong_path)
        start = before_growth or strong_path
        groups_per_step = recipe.rm_strong_train.batch_size
        steps = fine_tune_steps(n_prompts, len({r["group"] for r in replay}), groups_per_step, options)
        lr = options.strong_lr or 0.6 * recipe.rm_strong_train.lr
        progress(f"strong RM: {len(train)} labels on {n_prompts} prompts + {len(replay)} replayed zoo pairs, "
                 f"{steps} steps at lr {lr:g} from {strong_version}{' before growth' if before_growth else ''}")
        strong = train_strong(StrongOptions(
            data=strong_data, init=str(start), n_bins=recipe.rm_n_bins, steps=steps, lr=lr,
            groups_per_step=groups_per_step, match_pairs=0, max_length=recipe.rm_max_length,
            widen=recipe.rm_strong_widen if before_growth else 1,
            grow_layers=recipe.rm_strong_grow_layers if before_growth else 0,
            pseudo_label=False, seed=options.seed, device=options.device), settings, zoo, progress)
        report.strong_version = strong.entry.version
        if registry is not None:
            registry.register(replace(strong.entry, parent=strong_version))

        # 2. The light RM: re-distilled from the new strong RM, starting (as the zoo's does) from its model
        # before growth when it has one, else from the light RM in service.
        new_start = student_init_dir(Path(strong.entry.path))
        distill_data = work / "distill-data.jsonl"
        _write_jsonl(distill_data, [{"prompt": r["prompt"], "response": r["response"]} for r in train])
        distill = DistillOptions(strong=str(strong.entry.path), data=(str(distill_data),), zoo_pairs=True,
                                 rollout_log=False, max_pairs=options.distill_pairs, members=len(light_paths),
                                 init="auto" if new_start else str(light_paths[0]),
                                 init_layers=(recipe.rm_light_layers or None) if new_start else None,
                                 steps=options.distill_steps, max_length=recipe.rm_max_length, seed=options.seed,
                                 device=options.device)
        distill.validate()
        staging = work / "light"
        result = run_distill(distill, settings, zoo, staging)
        result.info["refresh"] = {"held_out_share": options.hold_out, "n_train": len(train)}
        light = finalize_version(staging, result.members, "light", None, settings, result.info)
        report.light_version = light.version
        if registry is not None:
            registry.register(light)

        # 3. The verdict, on labels nothing above trained on.
        report.figures, rewards = _held_out_figures(
            {"light_current": light_paths, "light_new": [Path(p) for p in light.paths],
             "strong_current": [strong_path], "strong_new": [Path(strong.entry.path)]},
            held, recipe.rm_max_length, options.device)
        labels = [float(r["score"]) for r in held]
        report.gain_se = gain_se(rewards["light_new"], rewards["light_current"], labels, options.bootstrap_rounds,
                                 options.seed)
        decision = verdict(report.figures["light_current"], report.figures["light_new"], report.gain_se,
                           options.min_gain, light_version, light.version, options.min_gain_se)
        report.reason = decision.reason
        report.calibration = carry_calibration(light_paths, light, held, registry, progress)
        report.rule = carry_rule(light_paths, light, held, lambda hashes: _kept_signals(settings, hashes, progress),
                                 options.rule_min_answers, options.rule_min_bad, options.rule_bad_below,
                                 options.fit_rule, options.seed, progress, options.rule_target_catch)
        if decision.promote and report.calibration not in ("", "carried"):
            report.reason += f" (not promoted: {report.calibration}; the escalation threshold's scale would change)"
        elif decision.promote and not options.promote:
            report.reason += " (not promoted: promote is off)"
        elif decision.promote:
            if registry is None:
                raise CliError("promotion needs the registry (Redis): drop --no-register or pass --no-promote")
            promote_version(registry, settings, light.version, verify=True)
            report.promoted = True
            if report.rule.startswith("not refitted"):
                report.reason += " (its escalation rule was not refitted: the threshold decides until one is)"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _finish(report, settings, registry, progress)


def _kept_signals(settings: Any, hashes: Sequence[str], progress: Callable[[str], None]) -> dict[str, Any]:
    """The escalation signals svc_reward kept for these answers; none when Redis cannot be read (said)."""
    try:
        with redis_client.connect(settings.redis_address, socket_timeout=10) as client:
            return dict(read_signals(client, hashes))
    except redis.RedisError as exc:
        progress(f"could not read the kept escalation signals from Redis ({settings.redis_address_masked}): {exc}")
        return {}


def _finish(report: TurnReport, settings: Any, registry: Any, progress: Callable[[str], None]) -> TurnReport:
    report.seconds = round(time.time() - report.at, 1)
    for name, fig in report.figures.items():
        progress(f"  {name:15s} Spearman {fig.spearman:6.3f}  pairs {fig.pair_accuracy:6.3f} ({fig.n_pairs})  "
                 f"on {fig.n} held-out labels")
    progress(report.reason)
    out = Path(settings.state_dir) / REPORT_DIR / time.strftime("%Y%m%dT%H%M%S", time.gmtime(report.at))
    out = out.with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report.to_json(), encoding="utf-8")
    if registry is not None:
        registry.record_refresh({"at": report.at, "n_labels": report.n_labels, "promoted": report.promoted,
                                 "report": str(out)})
    progress(f"report: {out}")
    return report


def _redistil_request(settings: Any) -> dict[str, Any] | None:
    from svc_reward import audit_store

    with redis_client.connect(settings.redis_address, socket_timeout=10) as client:
        return audit_store.redistil_request(client)


def _clear_redistil(settings: Any, answered: dict[str, Any]) -> bool:
    from svc_reward import audit_store

    with redis_client.connect(settings.redis_address, socket_timeout=10) as client:
        return audit_store.clear_redistil(client, answered)


def run_every(options: RefreshOptions, settings: Any, zoo: ZooSource, registry: Any,
              progress: Callable[[str], None] = print, turns: int | None = None,
              sleep: Callable[[float], None] = time.sleep) -> list[TurnReport]:
    """The cadence: every ``every_s`` seconds, a turn when ``min_new_labels`` labels arrived since the
    last one (the first turn needs them too: a restart does not retrain on the same labels), or at once
    with the audited answers when the hacking defence asked for a re-distillation (svc_reward/defence.py)."""
    reports: list[TurnReport] = []
    checks = 0
    while turns is None or checks < turns:
        checks += 1
        request = _redistil_request(settings)
        if request is not None:
            # People raised the alarm and the strong RM rates like its student: its audit labels would teach the
            # light RM that the gamed answers are good, so the turn learns from people's scores alone.
            people = request.get("labels") == "people"
            progress(f"{time.strftime('%H:%M:%S')} the hacking defence asked for a re-distillation at policy "
                     f"v{request.get('policy_version')}: a turn on "
                     + ("people's scores of the policy's answers" if people else "the audited answers"))
            update = {"audits": False, "annotations": True} if people else {"audits": True}
            report = run_turn(options.model_copy(update=update), settings, zoo, registry, progress)
            reports.append(report)
            if report.refused is None and not _clear_redistil(settings, request):
                progress("a newer re-distillation request came during the turn: it runs at the next check")
            if turns is None or checks < turns:
                sleep(options.every_s)
            continue
        labelled = collect_labels(options, settings)
        rows = labelled[0]
        previous = (registry.last_refresh() or {}).get("n_labels", 0) if registry is not None else 0
        if len(rows) - previous >= options.min_new_labels:
            reports.append(run_turn(options, settings, zoo, registry, progress, labelled))
        else:
            progress(f"{time.strftime('%H:%M:%S')} {len(rows) - previous} new labels since the last turn, of "
                     f"{options.min_new_labels} (min_new_labels): waiting {options.every_s:.0f} s")
        if turns is None or checks < turns:
            sleep(options.every_s)
    return reports
