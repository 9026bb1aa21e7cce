"""Run the checks against a live stack and render the result table.

Each ``run_*`` function takes the settings, talks to the services through ``strata_tools.diagnose.sources``,
and returns one :class:`CheckResult`; a check that cannot run (service down, no rollouts, no
checkpoint) returns an ERROR result saying why instead of raising, so ``all`` always prints a table.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import grpc
import redis

from strata import redis_client, rpc
from strata.audit import HUMAN_AUDIT, STRONG_AUDIT, read_versions
from strata.content_store import ContentStore
from strata.errors import CliError
from strata.v1 import annotation_pb2, annotation_pb2_grpc
from strata_tools.diagnose import annotators, hacking, memory, repetition, rm_noise, rm_overfit, shift, sources
from strata_tools.diagnose.items import Pair, load_pairs, suite_pairs
from strata_tools.diagnose.settings import DiagnoseSettings
from strata_tools.diagnose.verdict import CheckResult, Verdict, error_result

log = logging.getLogger(__name__)


def _pairs(settings: DiagnoseSettings, n: int) -> list[Pair]:
    if settings.pairs_file is not None:
        return load_pairs(settings.pairs_file, n)
    return suite_pairs(n, "fresh", settings.items_seed)


def run_rm_noise(settings: DiagnoseSettings) -> CheckResult:
    config = settings.rm_noise()
    items = _pairs(settings, config.n_responses)
    client = sources.RewardClient(settings.reward_address, settings.rpc_timeout_s)
    try:
        served = rm_noise.measure(client.score, items, config.repeats)
    finally:
        client.close()
    compared = None
    if settings.ensemble_reward_address:
        other = sources.RewardClient(settings.ensemble_reward_address, settings.rpc_timeout_s)
        try:
            compared = rm_noise.measure(other.score, items, config.repeats)
        finally:
            other.close()
    return rm_noise.evaluate(served, config, compared)


def run_shift(settings: DiagnoseSettings, since_ms: int | None = None) -> CheckResult:

    from strata.models.loading import load_causal_lm
    from strata.models.tokens import tokenizer_id

    config = settings.shift()
    if settings.shift_policy:
        path, label = settings.shift_policy, settings.shift_policy
    else:
        path, version = sources.learner_checkpoint(settings.learner_address, settings.rpc_timeout_s)
        label = f"v{version} ({path})"
    if since_ms is None:
        since_ms = int((time.time() - settings.shift_window_s) * 1000)
    events = sources.recent_rollout_events(settings, config.max_samples, since_ms, settings.shift_tier)
    if not events:
        raise LookupError(f"no tier-{settings.shift_tier or 'any'} rollouts on strata.rollouts.generated in the "
                          f"last {settings.shift_window_s:g} s")
    policy = load_causal_lm(path, device=settings.shift_device, dtype="float32")
    client = redis_client.connect(settings.redis_address, socket_timeout=10)
    try:
        store = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
        rollouts, missing = sources.rollouts_from_store(events, store, policy.tokenizer, tokenizer_id(policy.tokenizer))
    finally:
        client.close()
    if not rollouts:
        raise LookupError(f"none of the {len(events)} recent rollouts has its token ids in the content store under "
                          "this policy's tokenizer (expired, or generated with another tokenizer)")
    logprobs = shift.sequence_logprobs(policy.model, rollouts, policy.tokenizer.pad_token_id, config.batch_size)
    measurement = shift.ShiftMeasurement(logprobs, [len(r.response_ids) for r in rollouts],
                                         [r.policy_version for r in rollouts], label)
    result = shift.evaluate(measurement, config)
    if missing:
        result = _with_detail(result, skipped_rollouts=missing)
    return result


def run_rm_overfit(settings: DiagnoseSettings) -> CheckResult:
    config = settings.rm_overfit()
    pairs = _pairs(settings, config.n_pairs)
    client = sources.RewardClient(settings.reward_address, settings.rpc_timeout_s)
    try:
        light = client.score(pairs)
        if settings.overfit_reference == "strong":
            strong = client.score(pairs, strong=True)
            reference, label = strong.rewards, f"strong RM {strong.rm_version}"
        else:
            if any(p.reference is None for p in pairs):
                raise ValueError("some pairs have no reference score; use --overfit-reference strong")
            reference = [float(p.reference) for p in pairs if p.reference is not None]
            label = "pairs file's scores" if settings.pairs_file else "oracle"
    finally:
        client.close()
    return rm_overfit.evaluate(rm_overfit.measure(light.rewards, reference, label, light.rm_version), config)


def run_memory(settings: DiagnoseSettings) -> CheckResult:
    config = settings.memory()
    client = sources.GeneratorClient(settings.checked_generator, settings.rpc_timeout_s, settings.generate_chunk)

    def rollout() -> None:
        client.generate(settings.repetition_prompt, config.samples_per_round)

    def read() -> memory.MemoryReading:
        return memory.reading_from_metrics(sources.scrape(settings.generator_metrics_url))

    try:
        measurement = memory.measure(rollout, read, config)
    finally:
        client.close()
    return memory.evaluate(measurement, config)


def run_repetition(settings: DiagnoseSettings) -> CheckResult:
    config = settings.repetition()
    client = sources.GeneratorClient(settings.checked_generator, settings.rpc_timeout_s, settings.generate_chunk)
    try:
        out = client.generate(settings.repetition_prompt, config.n_rollouts, settings.repetition_temperature,
                              settings.repetition_top_p)
    finally:
        client.close()
    measurement = repetition.RepetitionMeasurement(out.responses, out.sampling.temperature, out.sampling.top_p,
                                                   out.sampling.max_new_tokens, out.model_id)
    return repetition.evaluate(measurement, config)


def run_annotators(settings: DiagnoseSettings) -> CheckResult:
    with rpc.channel(settings.annotation_address, settings) as channel:
        status = annotation_pb2_grpc.AnnotationStub(channel).Status(annotation_pb2.StatusRequest(),
                                                                    timeout=min(settings.rpc_timeout_s, 30.0))
    return annotators.evaluate(status.annotators)


def run_hacking(settings: DiagnoseSettings) -> CheckResult:
    from svc_reward import audit_store
    from svc_reward.config import RewardSettings

    client = redis_client.connect(settings.redis_address, socket_timeout=10)
    try:
        by_judge = {judge: read_versions(client, judge) for judge in (HUMAN_AUDIT, STRONG_AUDIT)}
        served = audit_store.read_thresholds(client)
    finally:
        client.close()
    if served is None:  # no reward service wrote its own: as it would read them from this environment
        reward = RewardSettings()
        served = audit_store.ServedThresholds(reward.hacking_min_audits, reward.hacking_gap_bound,
                                              reward.hacking_defence)
    return hacking.evaluate(by_judge, served.gap_bound, served.min_audits)


CHECKS: dict[str, tuple[Callable[[DiagnoseSettings], CheckResult], str]] = {
    rm_noise.NAME: (run_rm_noise, rm_noise.CURE),
    shift.NAME: (run_shift, shift.CURE),
    rm_overfit.NAME: (run_rm_overfit, rm_overfit.CURE),
    memory.NAME: (run_memory, memory.CURE),
    repetition.NAME: (run_repetition, repetition.CURE),
    annotators.NAME: (run_annotators, annotators.CURE),
    hacking.NAME: (run_hacking, hacking.CURE),
}


def run_check(name: str, settings: DiagnoseSettings) -> CheckResult:
    """One check; failures to reach the stack become an ERROR result (never an exception)."""
    run, cure = CHECKS[name]
    try:
        return run(settings)
    except grpc.RpcError as exc:
        return error_result(name, cure, f"gRPC {exc.code().name}: {exc.details()}")  # type: ignore[attr-defined]
    except (CliError, OSError, LookupError, ValueError, RuntimeError, redis.RedisError) as exc:
        log.debug("check %s failed", name, exc_info=True)
        return error_result(name, cure, f"{type(exc).__name__}: {exc}")


def run_all(settings: DiagnoseSettings, skip: Sequence[str] = ()) -> list[CheckResult]:
    return [run_check(name, settings) for name in CHECKS if name not in skip]


def exit_code(results: Sequence[CheckResult]) -> int:
    """0: all PASS; 1: any ALARM; 2: no ALARM but a check could not run."""
    if any(r.verdict is Verdict.ALARM for r in results):
        return 1
    if any(r.verdict is Verdict.ERROR for r in results):
        return 2
    return 0


def _with_detail(result: CheckResult, **extra: Any) -> CheckResult:
    return replace(result, details={**result.details, **extra})


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_result(result: CheckResult) -> str:
    """One check for a person: verdict, number, rule, summary, cure."""
    lines = [f"{result.check}: {result.verdict.value}  {_number(result.value)}"
             + (f"  ({result.rule})" if result.rule else ""),
             f"  {result.summary}"]
    prefix = "  cure: " if result.verdict is not Verdict.PASS else "  if it alarms: "
    lines.append(prefix + result.cure)
    return "\n".join(lines)


def format_table(results: Sequence[CheckResult]) -> str:
    """All checks in one table, then the cures of those that alarmed."""
    header = ("check", "verdict", "value", "rule", "finding")
    rows = [(r.check, r.verdict.value, _number(r.value), r.rule or "-", r.summary) for r in results]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]

    out = [line(header), line(["-" * w for w in widths] + ["-" * 7]), *(line(row) for row in rows)]
    cures = [r for r in results if r.verdict is Verdict.ALARM]
    if cures:
        out.append("")
        out.extend(f"cure for {r.check}: {r.cure}" for r in cures)
    return "\n".join(out)


def as_json(results: Sequence[CheckResult]) -> str:
    return json.dumps([{"check": r.check, "verdict": r.verdict.value, "value": r.value, "threshold": r.threshold,
                        "rule": r.rule, "summary": r.summary, "cure": r.cure, "details": dict(r.details)}
                       for r in results], indent=2, default=str)
