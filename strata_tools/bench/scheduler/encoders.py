"""``--compare-encoder`` (part 10 of ``strata bench scheduler``, issue 39): ``run_tuned`` fine-tunes the
encoder for "same reward" on the main run's history (paraphrase families held out) or loads ``--compare-encoder
DIR``, then routes the same stream with it at the floor its card sets, with the off-the-shelf encoder at that
floor, and with both again from the policy version the main run ended at (``TunedRun``).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from strata.hashing import content_hash
from strata_tools.bench.scheduler.common import CachedEncoder, side_run
from strata_tools.bench.scheduler.stream import RuleResult, make_stream, run_routing, submit_calls
from strata_tools.encoder.finetune import (
    FinetuneConfig,
    describe,
    finetune_encoder,
    history_from_redis,
    serving_floor,
)

if TYPE_CHECKING:
    import redis

    from strata_tools.encoder.finetune import FinetuneResult
    from strata_tools.task.suite import PromptRecord
    from svc_scheduler.config import SchedulerSettings


@dataclass(frozen=True)
class TunedRun:
    """The same stream routed with the other encoder (``--compare-encoder``)."""

    knn: RuleResult
    encoder_id: str
    min_similarity: float  # the floor it was served at (its card's, unless set explicitly)
    fit: FinetuneResult | None  # when fine-tuned in this run: its held-out figures
    base_at_floor: RuleResult | None  # the off-the-shelf encoder at that floor: what the floor alone does
    later_version: int  # the policy version the later epochs start at (the main run's last)
    later: tuple[RuleResult, RuleResult, RuleResult] | None  # (no skipping, off-the-shelf, fine-tuned) there


def run_tuned(args: argparse.Namespace, settings: SchedulerSettings, client: redis.Redis, run_id: str,
              records: Sequence[PromptRecord], base_encoder: CachedEncoder) -> TunedRun:
    """Fine-tune on the main run's history (or load ``--compare-encoder DIR``), then route with it: the same
    stream, the off-the-shelf encoder at its floor, and both encoders again from the policy the run ended at."""
    from svc_scheduler.__main__ import with_card_thresholds
    from svc_scheduler.encoder import Encoder

    with tempfile.TemporaryDirectory(prefix="strata-bench-encoder-") as folder:
        path, fit = _tuned_encoder_path(args, settings, client, records, Path(folder))
        enc_settings = side_run(settings, "enc", encoder_path=path)
        encoder = Encoder.from_settings(enc_settings)
        served = with_card_thresholds(enc_settings, encoder.card)
        print(f"routing the same stream with {encoder.encoder_id} (cosine floor {served.min_similarity:g})",
              flush=True)
        tuned_encoder = CachedEncoder(encoder)
        stream = make_stream(records, args.passes, args.seed)
        _, _, knn, _ = run_routing(args, enc_settings, tuned_encoder, f"{run_id}-enc", records, stream, quiet=True)
        base_at_floor: RuleResult | None = None
        if served.min_similarity != settings.min_similarity:
            print(f"routing the same stream with the off-the-shelf encoder at cosine floor {served.min_similarity:g}",
                  flush=True)
            at_floor = side_run(settings, "floor", min_similarity=served.min_similarity)
            _, _, base_at_floor, _ = run_routing(args, at_floor, base_encoder, f"{run_id}-floor", records, stream,
                                                 quiet=True)
        later_version = 1 + (submit_calls(args, len(stream)) - 1) // max(args.policy_step_every, 1)
        later: tuple[RuleResult, RuleResult, RuleResult] | None = None
        if args.policy_step_every and later_version > 1:
            print(f"routing the stream again from policy v{later_version} (later epochs, a policy that moved since "
                  "the history the encoder learned from) with each encoder", flush=True)
            again = make_stream(records, args.passes, args.seed + 1)
            arms: list[tuple[str, CachedEncoder, dict[str, object]]] = [
                ("later-base", base_encoder, {}), ("later-enc", tuned_encoder, {"encoder_path": path})]
            runs = [run_routing(args, side_run(settings, side, **changes), use, f"{run_id}-{side}", records, again,
                                quiet=True, first_version=later_version) for side, use, changes in arms]
            later = (runs[0][0], runs[0][2], runs[1][2])
    return TunedRun(dataclasses.replace(knn, name="knn, fine-tuned encoder"), encoder.encoder_id,
                    served.min_similarity, fit, base_at_floor, later_version, later)


def _tuned_encoder_path(args: argparse.Namespace, settings: SchedulerSettings, client: redis.Redis,
                        records: Sequence[PromptRecord], folder: Path) -> tuple[str, FinetuneResult | None]:
    """``--compare-encoder DIR``, or an encoder fine-tuned on the main run's history (families held out)."""
    if args.compare_encoder != "finetune":
        return args.compare_encoder, None
    family_of = {content_hash(r.text): str(r.family) for r in records}
    history = [dataclasses.replace(p, group=family_of.get(p.prompt_hash, "")) for p in
               history_from_redis(settings, client)]
    print(f"\nfine-tuning the encoder for same reward on this run's history ({len(history)} scored prompts, "
          "paraphrase families held out together)", flush=True)
    config = FinetuneConfig(tolerance=settings.audit_tolerance, seed=args.seed)
    fit = finetune_encoder(history, settings.encoder_path, folder, serving_floor(settings, settings.encoder_path),
                           config, lambda line: print(f"  {line}", flush=True))
    for line in describe(fit):
        print(f"  {line}")
    return str(fit.path), fit
