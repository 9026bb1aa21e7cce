"""``strata bench scheduler``: what embedding-based skipping (R10-R12) saves, and what it costs.

What runs. The scheduler, Kafka, Redis and the statistics worker are the real ones; the tiers behind
the scheduler (probe, generators, reward models) are simulated, because generating and scoring the
~11k rollouts of a run with real models does not fit on a CPU in reasonable time:

1. **Routing on the zoo's prompt suite, through the stack.** Kafka and Redis are the bench's own
   (free ports, a throw-away state dir, purged at the end) unless external clusters are configured;
   the scheduler service runs in this process as in deployment
   (gRPC server on a free local port, encoder, FAISS index, Redis, the Kafka statistics worker in a
   fresh consumer group, keys under a fresh Redis prefix, so a run never sees an earlier run's data).
   Every suite prompt but the sealed test split's (8 topics x subjects x intents, 7 paraphrases per family) is
   submitted ``--passes`` times in shuffled order, ``--batch`` prompts per ``SubmitBatch`` call, with
   ``n_samples=--n-samples``; each response gives the decision (skip with a reused reward, Level-1,
   Level-2).
2. **A simulated rollout tier** is a real Kafka worker on ``strata.prompts.level0`` and
   ``strata.prompts.level2``: for each routed prompt it writes ``n_samples`` responses with the
   simulated policy and publishes their **oracle judge** scores as final ``RewardScored`` events
   (``SCORER_HUMAN``, RM version ``oracle``), which the scheduler's statistics worker folds into
   Redis. The simulated policy: per paraphrase family a competence (mostly good, mostly bad with one
   consistent failure mode, or mixed), responses written by the zoo's corpus (``reference_response``
   / ``degrade``). Rewards are deterministic per (prompt, request id, policy version, sample), so a
   redelivered event republishes identical rewards and the statistics count them once. Request ids
   are ``--seed`` and the submission's place in the stream, not the run: two runs with one seed draw
   the same rollouts and audits, and the arms of one run (``--compare-*``) are paired, each submission
   drawn alike in every arm that rolls it out; ``--seed`` draws another stream of rollouts.
3. **Stream semantics without sleeps:** after each batch the bench waits until the tier has handled
   every routed prompt of the batch and the statistics group's committed offsets reach the end of
   ``strata.rewards.scored``, so a later batch sees every earlier reward.
4. **A moving policy** (``--policy-step-every N`` batches; 0: fixed): the policy version increments
   and every family's chance of a good answer closes 10% of its gap to 0.95. The simulated tier
   stamps its rewards with the new version, and the scheduler learns it from them as it does from a
   real generator's; statistics older than ``max_policy_lag`` versions stop being reused. Nothing is
   published to ``strata.policy.updated``: real generators replay that topic and would try to load a
   checkpoint that does not exist.
5. **Baselines in this process, on the same stream and the same rewards:** *no skipping* and the
   *GRESO-style* rule: skip a prompt only from its **own** reward history (at least
   ``min_samples_per_neighbour`` rewards with variance under ``low_variance_threshold``, restarted
   when the policy moved more than ``max_policy_lag`` versions). Risk prompts go to Level-2 under
   every rule, so the comparison isolates the reuse rule.
6. **Reuse error:** for every skipped prompt, |reused reward - oracle truth|, the truth being the
   mean oracle reward of ``--truth-samples`` rollouts of that prompt by the policy current at the skip.
7. **Decision latency** (encode + search + Redis + rules for one prompt, in process) with 10k and
   100k prompts indexed (synthetic clustered unit vectors; queries are real suite prompts), and
   **ANN recall@10** of the HNSW index against exact search (synthetic queries at 100k, and the suite).

8. **``--live``: the simulation checked against the real pipeline.** A smaller stream (every prompt
   of ``--live-families`` paraphrase families, ``--passes`` times) goes through the real scheduler,
   probe, generators and reward models (the ``--live-zoo`` preset's models, each service in its own
   process, run first on a quiet Kafka), batch by batch with each batch's rewards folded in before
   the next; the simulated tier then runs the *same* stream. The live scheduler audits
   ``--live-audit-share`` of its would-be skips, and its reuse error is the audits' (fresh RM rewards
   against the reused one, with its 95 % interval): real tiers have no oracle truth per policy version.
   ``--live-learner`` makes the stream training-shaped: the learner trains the Level-1 policy on the live
   rewards and the generator serves each version it publishes, so the passes meet a moving policy.

The bench refuses to run while another consumer group reads the prompt topics (a running stack's
probe would roll out the bench's prompts and its reward service would score them).
9. **R11's aim**: of the non-risk submissions, the share sent to Level-2, and the share of their bad
   rollouts (oracle < 1.5) that were in them; ``--compare-cluster-marking`` routes the same stream a
   second time with ``cluster_marking`` flipped (its own Redis prefix and statistics group).

10. ``--compare-encoder``: the encoder fine-tuned for "same reward" (issue 39): fine-tuned on this run's own
   history as ``strata encoder finetune`` does (paraphrase families held out together, to measure), or
   loaded from ``--compare-encoder DIR``; the same stream is routed with it at the floor its card
   re-measured, and with the off-the-shelf encoder at that floor (what the floor alone does).

Last line: ``scheduler trigger_reduction= reuse_mae= greso_trigger_reduction= r10_reference= live_skip_rate=
live_reuse_mae= live_audits= live_reuse_mae_lo= live_reuse_mae_hi=`` (the live fields ``nan`` without ``--live``;
``live_audits`` counts the scored audits; the bounds are the live error's 95 % interval, clustered by prompt)
``r11_reference= ... level2_share= bad_caught=``. ``r10_reference``/``r11_reference`` (once ``r10_ceiling``/
``r11_ceiling``) are the perfect chooser's reduction among prompts whose true variance is under R10's/R11's
bound: a reference, not a bound, since a rule whose variance estimate errs low may skip more. With
``--compare-cluster-marking`` it adds ``flipped_level2_share= flipped_bad_caught=``, with ``--compare-encoder``
``tuned_trigger_reduction= tuned_reuse_mae=``.
"""

from __future__ import annotations

import argparse
import random
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from strata.errors import CliError
from strata_tools.bench.infra import bench_infra
from strata_tools.bench.scheduler.common import SIDE_RUNS, CachedEncoder, checked_redis, quiet_logger, side_run
from strata_tools.bench.scheduler.encoders import run_tuned
from strata_tools.bench.scheduler.latency import print_latency, run_latency, run_latency_only, suite_recall
from strata_tools.bench.scheduler.live import LiveResult, live_families, live_passes, run_live
from strata_tools.bench.scheduler.report import (
    Measured,
    print_ceiling,
    print_last_line,
    print_live,
    print_r11,
    print_rules,
    print_tuned,
)
from strata_tools.bench.scheduler.stream import RuleResult, make_stream, run_routing
from strata_tools.task.suite import load_suite

if TYPE_CHECKING:
    import redis

    from strata_tools.task.suite import PromptRecord
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.encoder import Encoder

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--passes", type=int, default=2, help="times each suite prompt is submitted")
    parser.add_argument("--n-samples", type=int, default=4, help="rollouts per rolled-out prompt")
    parser.add_argument("--truth-samples", type=int, default=8, help="rollouts averaged for the oracle truth")
    parser.add_argument("--batch", type=int, default=32, help="prompts per SubmitBatch call")
    parser.add_argument("--policy-step-every", type=int, default=40,
                        help="batches between policy updates of the simulated policy (0: fixed policy)")
    parser.add_argument("--limit", type=int, default=0, help="use only this many suite prompts (0: all)")
    parser.add_argument("--latency-sizes", default="10000,100000,1000000", help="index sizes for the latency test")
    parser.add_argument("--latency-only", action="store_true",
                        help="only the decision latency, memory and recall at each size (Redis only)")
    parser.add_argument("--latency-queries", type=int, default=200, help="single-prompt decisions timed per size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse-budget", type=float, default=0.3,
                        help="reuse MAE at which the ceiling any rule could reach is measured")
    parser.add_argument("--compare-cluster-marking", action="store_true",
                        help="route the stream a second time with cluster_marking flipped (R11, one run, same "
                             "stream) and print both: Level-2 share and bad rollouts caught")
    parser.add_argument("--compare-encoder", nargs="?", const="finetune", default=None, metavar="DIR",
                        help="route the same stream a second time with another encoder and print both (issue 39): "
                             "a fine-tuned encoder's directory, or, bare, one fine-tuned for same reward on this "
                             "run's own history (strata encoder finetune, paraphrase families held out)")
    parser.add_argument("--error-anatomy", action="store_true",
                        help="split each skip rule's reuse error: against the expected reward (64 rollouts) "
                             "instead of the 8-rollout truth, the truth's own noise, and (own history) how far the "
                             "policy moved the expected reward since the reused rollout; slower")
    parser.add_argument("--live", action="store_true",
                        help="also run a smaller stream through the real probe, generators and reward models, "
                             "next to the simulated tier on the same stream")
    parser.add_argument("--live-families", type=int, default=8,
                        help="paraphrase families (7 prompts each, risk ones at their share) in the live stream")
    parser.add_argument("--live-passes", type=int, default=0,
                        help="epochs of the live families (0: --passes); a training-shaped stream revisits its "
                             "prompt set, and scored audits grow with the later epochs")
    parser.add_argument("--live-zoo", default="ci", help="zoo preset whose models the live tiers serve")
    parser.add_argument("--live-audit-share", type=float, default=0.25,
                        help="share of would-be skips the live scheduler rolls out anyway to measure reuse error")
    parser.add_argument("--live-learner", action="store_true",
                        help="a training-shaped live stream: the learner trains the Level-1 policy on the live "
                             "rewards and publishes each version to the generator while the passes go on")


def run(args: argparse.Namespace) -> int:
    from svc_scheduler.config import SchedulerSettings

    if args.batch < 1 or args.n_samples < 1 or args.passes < 1 or args.policy_step_every < 0 or args.live_passes < 0:
        raise CliError("--batch, --n-samples and --passes must be >= 1, --policy-step-every and --live-passes >= 0")
    run_id = uuid.uuid4().hex[:8]
    settings = SchedulerSettings(
        grpc_port=0, redis_prefix=f"strata:bench:{run_id}", stats_group_id=f"bench-sched-stats-{run_id}",
        watch_lookback_s=0.0,  # Watch is not used: no history replay
        redis_timeout_s=10.0,  # a shared 2-core machine stalls; a bench is not testing fail-fast
    )
    if args.batch > settings.max_batch_size:
        raise CliError(f"--batch {args.batch} is over the scheduler's max_batch_size {settings.max_batch_size}")

    with bench_infra(settings, run_id, "scheduler") as settings:
        if args.latency_only:
            return run_latency_only(args, settings)
        return _run(args, settings, run_id)


def _run(args: argparse.Namespace, settings: SchedulerSettings, run_id: str) -> int:
    from svc_scheduler.encoder import Encoder

    client = checked_redis(settings)
    _print_header(args, settings)
    encoder = Encoder.from_settings(settings)
    suite = load_suite()
    records = random.Random(args.seed).sample(suite, args.limit) if args.limit else suite
    subset = live_families(suite, args.live_families, args.seed) if args.live else []  # whole families
    try:
        measured = _measure(args, settings, run_id, encoder, client, records, subset)
    finally:
        for prefix in (settings.redis_prefix, *(side_run(settings, side).redis_prefix for side in SIDE_RUNS)):
            for key in client.scan_iter(f"{prefix}:*", count=1000):
                client.delete(key)
        client.close()

    print_rules(measured)
    print_ceiling(args, settings, measured.ceiling)
    print_r11(settings, measured)
    if measured.tuned is not None:
        print_tuned(settings, measured)
    if measured.live is not None and measured.sim_subset is not None:
        print_live(args, measured.live, measured.sim_subset)
    print()
    print_latency(measured.latency)
    print(f"HNSW recall@10 on the suite's own embeddings: {measured.recall_suite:.3f}")
    print_last_line(args, settings, measured)
    return 0


def _print_header(args: argparse.Namespace, settings: SchedulerSettings) -> None:
    """The run's first line: where Kafka and Redis are, the skip rule's thresholds, the policy steps."""
    step = f"every {args.policy_step_every} batches" if args.policy_step_every else "never (fixed policy)"
    print(f"scheduler bench: Kafka {settings.kafka_address}, Redis {settings.redis_address_masked} (keys under "
          f"{settings.redis_prefix}:*), k={settings.k}, skip if >= {settings.min_low_variance_neighbours} neighbours "
          f"with variance < {settings.low_variance_threshold}, cosine floor {settings.min_similarity}; policy "
          f"update {step}", flush=True)


def _measure(args: argparse.Namespace, settings: SchedulerSettings, run_id: str, encoder: Encoder,
             client: redis.Redis, records: Sequence[PromptRecord], subset: Sequence[PromptRecord]) -> Measured:
    """The live run, the routing runs, the latency sizes and the suite's recall, in that order."""
    cached = CachedEncoder(encoder)
    subset_stream = make_stream(subset, live_passes(args), args.seed)
    live: LiveResult | None = None
    sim_subset: RuleResult | None = None
    if args.live:  # first, on a quiet Kafka: the simulated run's thousands of events come after
        live = run_live(args, settings, run_id, subset_stream)
    with quiet_logger("svc_scheduler.engine"):
        everything, greso, knn, ceiling = run_routing(args, settings, cached, run_id, records,
                                                      make_stream(records, args.passes, args.seed))
        if args.live:
            # the live scheduler's audit share, so the two skip rates are comparable
            sub_settings = side_run(settings, "sub", audit_share=args.live_audit_share)
            _, _, sim_subset, _ = run_routing(args, sub_settings, cached, f"{run_id}-sub", subset, subset_stream,
                                              quiet=True)
        tuned = None
        if args.compare_encoder is not None:
            try:
                tuned = run_tuned(args, settings, client, run_id, records, cached)
            except (ValueError, FileNotFoundError) as exc:  # too little history (--limit), a wrong directory
                print(f"--compare-encoder: no comparison: {exc}", flush=True)
        flipped: RuleResult | None = None
        if args.compare_cluster_marking:
            flip_settings = side_run(settings, "flip", cluster_marking=not settings.cluster_marking)
            _, _, flipped, _ = run_routing(args, flip_settings, cached, f"{run_id}-flip", records,
                                           make_stream(records, args.passes, args.seed), quiet=True)
        latency = run_latency(args, settings, encoder, client)
    recall_suite = suite_recall(settings, cached)
    return Measured(everything, greso, knn, ceiling, latency, recall_suite, live, sim_subset, flipped, tuned)


def main() -> int:  # python -m strata_tools.bench.scheduler, as before `strata bench scheduler` existed
    parser = argparse.ArgumentParser(prog="strata bench scheduler", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())
