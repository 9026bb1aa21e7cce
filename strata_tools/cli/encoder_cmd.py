"""``strata encoder finetune``: the scheduler's encoder fine-tuned for "same reward" on its own history.

Reads the scheduler's state (the Redis its ``STRATA_*`` settings name, under ``STRATA_REDIS_PREFIX``):
every indexed prompt with at least ``min_samples_per_neighbour`` rewards and its text still in the
content store. Pairs of prompts the serving encoder puts near each other are labelled by whether
their mean rewards agree within ``--tolerance`` (pairs whose means are too noisy to tell, by
``--label-z`` standard errors, are left out); a held-out share of the prompts measures the result
(AUC of the cosine for agreement, precision and recall at the floor) and re-measures the similarity
floor in the new vector space. Writes a sentence-transformers directory with its card
(``strata-encoder.json``) under ``--out``; serve it with ``STRATA_ENCODER_PATH=<dir>``: it is a new
``encoder_id``, so it needs its own scheduler state (another ``STRATA_REDIS_PREFIX``, or a fresh
Redis), and the scheduler applies the card's floor unless ``STRATA_MIN_SIMILARITY`` is set.
docs/scheduler.md, "An encoder fine-tuned for same reward".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pydantic import ValidationError

from strata.errors import CliError
from strata_tools.encoder.finetune import (
    FinetuneConfig,
    describe,
    finetune_encoder,
    history_from_redis,
    serving_floor,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("encoder", help="the scheduler's prompt encoder (fine-tune for same reward)")
    sub = parser.add_subparsers(dest="encoder_what", metavar="WHAT", required=True)
    finetune = sub.add_parser("finetune", help="fine-tune the encoder on the scheduler's reward history",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = FinetuneConfig()
    finetune.add_argument("--out", type=Path, default=None,
                          help="folder the fine-tuned encoder is written under (default: <cache>/encoders/tuned)")
    finetune.add_argument("--base", default=None, metavar="DIR",
                          help="encoder to start from (default: the scheduler's encoder_path, else all-MiniLM-L6-v2)")
    finetune.add_argument("--k", type=int, default=defaults.k, help="nearest neighbours proposed as pairs per prompt")
    finetune.add_argument("--candidate-similarity", type=float, default=defaults.candidate_similarity,
                          help="base cosine under which no pair is proposed")
    finetune.add_argument("--tolerance", type=float, default=None,
                          help="mean rewards this close agree (default: the scheduler's audit_tolerance)")
    finetune.add_argument("--label-z", type=float, default=defaults.label_z,
                          help="standard errors a pair's difference must clear to be labelled (0: the difference)")
    finetune.add_argument("--held-out-share", type=float, default=defaults.held_out_share,
                          help="share of prompts kept out of training to measure on")
    finetune.add_argument("--max-train-pairs", type=int, default=defaults.max_train_pairs)
    finetune.add_argument("--epochs", type=int, default=defaults.epochs)
    finetune.add_argument("--batch-size", type=int, default=defaults.batch_size)
    finetune.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    finetune.add_argument("--seed", type=int, default=defaults.seed)
    finetune.add_argument("--json", action="store_true", help="machine-readable output (the card)")
    finetune.set_defaults(func=run_finetune)


def run_finetune(args: argparse.Namespace) -> int:
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.store import connect

    try:
        settings = SchedulerSettings()
    except ValidationError as exc:
        raise CliError(f"bad settings: {exc}") from None
    try:
        config = FinetuneConfig(
            k=args.k, candidate_similarity=args.candidate_similarity,
            tolerance=settings.audit_tolerance if args.tolerance is None else args.tolerance, label_z=args.label_z,
            held_out_share=args.held_out_share, max_train_pairs=args.max_train_pairs, epochs=args.epochs,
            batch_size=args.batch_size, learning_rate=args.learning_rate, seed=args.seed)
        config.check()
    except ValueError as exc:
        raise CliError(f"bad flag: {exc}") from None
    client = connect(settings)
    try:
        history = history_from_redis(settings, client)
    except ConnectionError as exc:
        raise CliError(f"cannot read the scheduler's state at {settings.redis_address_masked}: {exc}") from None
    finally:
        client.close()
    out = args.out or settings.cache_dir / "encoders" / "tuned"
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda _line: None) if args.json else (lambda line: print(line, flush=True))
    say(f"scheduler state {settings.redis_address_masked} under {settings.redis_prefix}: {len(history)} scored prompts")
    base = args.base or settings.encoder_path
    try:
        result = finetune_encoder(history, base, out, serving_floor(settings, base), config, say)
    except (ValueError, FileNotFoundError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps({"path": str(result.path), "seconds": result.seconds, "losses": result.losses,
                          **result.card}, indent=2))
        return 0
    for line in describe(result):
        print(line)
    print(f"serve it: STRATA_ENCODER_PATH={result.path} with a fresh STRATA_REDIS_PREFIX (a new encoder_id)")
    return 0
