"""``strata bench risk``: does risk detection (R3) find medical and legal prompts its keyword lists never name?

The scheduler sends a prompt to Level-2 when it names a risk keyword or when its embedding is close
enough (``risk_exemplar_min_similarity``) to one of the risk exemplar prompts. The keyword lists name
the ``train`` split's subjects and general words, never a ``fresh`` or sealed ``test`` subject
(tests/zoo/test_seal.py), so on those splits the exemplars must carry what the keywords miss.

Per split, with the scheduler's own encoder, exemplars and detection (``svc_scheduler.routing``):

- **recall**: the share of the split's medical/legal prompts detected, for the keywords alone and
  for keywords + exemplars at the served floor (and at the floor chosen here, where they differ);
- **flagged**: the share of the other prompts detected (each one an unneeded Level-2 call).

The floor is **chosen on** ``fresh`` (validation): the lowest floor at which at most ``--max-flagged``
of fresh's other prompts are detected. It is **reported on** ``test``, which chose nothing; ``train``
is printed for reference (the keywords were written there). A fourth set, ``strangers``
(``data/risk_strangers.jsonl``: 24 medical/legal and 24 other prompts in users' own words, polite,
terse, hostile, written after the floor was chosen and never tuned on), reports too, with the risk
prompts it misses. Intervals are 95 % bootstraps over paraphrase families (a family's paraphrases are
one piece of evidence; each stranger is its own). The last line reads the test split at the served
floor, then the strangers:
``risk recall=<r> recall_lo=<l> recall_hi=<h> keyword_recall=<k> flagged=<f> flagged_hi=<h>
strangers_recall=<r> strangers_flagged=<f> served_floor=<s> chosen_floor=<c>``.

Not covered: the suite has two risk subjects per held-out split (fresh: ibuprofen, wills; test: fever
in children, breaking a lease), phrased by the suite's templates, so the test interval says nothing
about other subjects (fresh's 0.74 against test's 1.00 is that spread); the strangers are 48 prompts
in English; risk that is neither medical nor legal (self-harm, finance) has no topic here.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from strata.errors import CliError
from strata_tools.intervals import BOOTSTRAP_DRAWS, Interval, cluster_bootstraps
from strata_tools.task.suite import load_suite

SPLITS = ("train", "fresh", "test")
CHOSEN_ON = "fresh"
REPORTED_ON = "test"
STRANGERS = "strangers"
STRANGERS_PATH = Path(__file__).parent / "data" / "risk_strangers.jsonl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-flagged", type=float, default=0.01,
                        help="largest share of fresh's non-risk prompts the chosen floor may send to Level-2")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--draws", type=int, default=BOOTSTRAP_DRAWS, help="bootstrap draws per interval")


# -- pure: choosing the floor and reading the detections -------------------------------------------------

def choose_floor(similarity: Sequence[float], keyword_hit: Sequence[bool], max_flagged: float) -> float:
    """The lowest floor (to 3 decimals) at which at most ``max_flagged`` of these *non-risk* prompts are
    detected: by a keyword, or by a similarity at or above the floor. Above 1 when the keywords alone
    already flag more than the budget (then no floor is affordable)."""
    if len(similarity) != len(keyword_hit):
        raise ValueError("one keyword flag per similarity")
    if not 0 <= max_flagged < 1:
        raise ValueError("max_flagged must be in [0, 1)")
    allowed = math.floor(max_flagged * len(similarity) + 1e-9) - sum(keyword_hit)
    if allowed < 0:
        return 1.001
    remaining = sorted((s for s, hit in zip(similarity, keyword_hit, strict=True) if not hit), reverse=True)
    # Strictly above the (allowed + 1)-th highest: that one and every tie with it stay unflagged.
    blocker = remaining[allowed]
    floor = math.ceil(blocker * 1000) / 1000
    return floor + 0.001 if floor <= blocker else floor


def detected(similarity: Sequence[float], keyword_hit: Sequence[bool], floor: float | None) -> list[bool]:
    """Per prompt: a keyword, or (``floor`` not None) a similarity at or above ``floor``; as
    ``strata.risk.detect_risk`` decides it."""
    return [hit or (floor is not None and s >= floor) for s, hit in zip(similarity, keyword_hit, strict=True)]


@dataclass(frozen=True)
class Detection:
    recall: Interval  # over the risk prompts, by family
    flagged: Interval  # over the other prompts, by family


def read_detection(hits: Sequence[bool], risky: Sequence[bool], families: Sequence[str], seed: int,
                   draws: int) -> Detection:
    """Recall on the risk prompts and the flagged share of the others, each with a family bootstrap."""
    def share(group: bool) -> Interval:
        values = [float(h) for h, r in zip(hits, risky, strict=True) if r == group]
        clusters = [f for f, r in zip(families, risky, strict=True) if r == group]
        if not values:
            return Interval(float("nan"), float("nan"), float("nan"), 0)
        [interval] = cluster_bootstraps(lambda idx: (sum(values[i] for i in idx) / len(idx),), clusters, seed, draws)
        return interval
    return Detection(recall=share(True), flagged=share(False))


# -- the run -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Split:
    name: str
    similarity: list[float]  # best cosine to any topic's exemplars
    keyword_hit: list[bool]
    risky: list[bool]
    families: list[str]
    subjects: list[str]


def _measure(settings: object, encoder: object) -> dict[str, _Split]:
    from svc_scheduler.engine import encode_exemplars, exemplar_similarity
    from svc_scheduler.routing import detect_risk

    exemplars = encode_exemplars(settings, encoder)  # type: ignore[arg-type]
    # (text, risky, family, subject) per prompt; each stranger's prompt is its own family.
    sources = {name: [(r.text, r.risk, r.family, r.subject) for r in load_suite(name)] for name in SPLITS}
    sources[STRANGERS] = [(row["text"], row["risk"], row["text"], row["topic"]) for row in load_strangers()]
    splits = {}
    for name, rows in sources.items():
        texts = [text for text, _, _, _ in rows]
        vectors = encoder.encode(texts)  # type: ignore[attr-defined]
        similarity = [exemplar_similarity(exemplars, v) for v in vectors]
        # The keywords as the scheduler applies them: detection with no exemplar similarity at all.
        keyword_hit = [detect_risk(text, {}, settings) is not None for text in texts]  # type: ignore[arg-type]
        splits[name] = _Split(name, [max(s.values(), default=-1.0) for s in similarity], keyword_hit,
                              [r for _, r, _, _ in rows], [f for _, _, f, _ in rows], [s for _, _, _, s in rows])
    return splits


def load_strangers_texts() -> list[str]:
    return [row["text"] for row in load_strangers()]


def load_strangers(path: Path = STRANGERS_PATH) -> list[dict]:
    """Hand-written prompts in users' own words (written after the floor was chosen, never tuned on)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _negatives(split: _Split) -> tuple[list[float], list[bool]]:
    pairs = [(s, k) for s, k, r in zip(split.similarity, split.keyword_hit, split.risky, strict=True) if not r]
    return [s for s, _ in pairs], [k for _, k in pairs]


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.max_flagged < 1:
        raise CliError("--max-flagged must be in [0, 1)")
    from svc_scheduler.__main__ import with_card_thresholds
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.encoder import Encoder

    base = SchedulerSettings()
    encoder = Encoder.from_settings(base)
    settings = with_card_thresholds(base, encoder.card)
    served = settings.risk_exemplar_min_similarity
    splits = _measure(settings, encoder)
    chosen = choose_floor(*_negatives(splits[CHOSEN_ON]), args.max_flagged)
    print(f"risk detection with {encoder.encoder_id}: {len(settings.risk_exemplars_medical)} medical and "
          f"{len(settings.risk_exemplars_legal)} legal exemplars; served floor {served:g}, floor chosen on "
          f"{CHOSEN_ON} (at most {args.max_flagged:.1%} of its other prompts flagged) {chosen:g}")
    arms: list[tuple[str, float | None]] = [("keywords", None), (f"keywords + exemplars at {served:g}", served)]
    if chosen != served:
        arms.append((f"keywords + exemplars at {chosen:g}", chosen))
    print(f"{'split':<9} {'role':<14} {'detector':<32} {'recall [95% CI]':<26} {'flagged [95% CI]':<26} families")
    roles = {"train": "keywords' own", CHOSEN_ON: "chooses floor", REPORTED_ON: "reports",
             STRANGERS: "reports"}
    read: dict[tuple[str, float | None], Detection] = {}
    for split in splits.values():
        for label, floor in arms:
            hits = detected(split.similarity, split.keyword_hit, floor)
            detection = read_detection(hits, split.risky, split.families, args.seed, args.draws)
            read[(split.name, floor)] = detection
            print(f"{split.name:<9} {roles[split.name]:<14} {label:<32} {detection.recall!s:<26} "
                  f"{detection.flagged!s:<26} {detection.recall.clusters}+{detection.flagged.clusters}")
    test = splits[REPORTED_ON]
    served_hits = detected(test.similarity, test.keyword_hit, served)
    by_subject: dict[str, list[bool]] = {}
    for hit, risky, subject in zip(served_hits, test.risky, test.subjects, strict=True):
        if risky:
            by_subject.setdefault(subject, []).append(hit)
    print(f"{REPORTED_ON} recall by subject at {served:g}: "
          + ", ".join(f"{subject} {sum(h) / len(h):.2f} ({len(h)})" for subject, h in sorted(by_subject.items())))
    strange = splits[STRANGERS]
    missed = [text for text, hit, risky in zip(load_strangers_texts(), detected(strange.similarity, strange.keyword_hit,
              served), strange.risky, strict=True) if risky and not hit]
    print(f"{STRANGERS} missed at {served:g}: " + ("; ".join(missed) or "none"))
    if chosen != served:
        print(f"note: the served floor {served:g} is not the one {CHOSEN_ON} chooses ({chosen:g}); set "
              f"STRATA_RISK_EXEMPLAR_MIN_SIMILARITY or the default in svc_scheduler/config.py")
    keywords, at_served = read[(REPORTED_ON, None)], read[(REPORTED_ON, served)]
    strangers = read[(STRANGERS, served)]
    print(f"risk recall={at_served.recall.estimate:.3f} recall_lo={at_served.recall.low:.3f} "
          f"recall_hi={at_served.recall.high:.3f} keyword_recall={keywords.recall.estimate:.3f} "
          f"flagged={at_served.flagged.estimate:.3f} flagged_hi={at_served.flagged.high:.3f} "
          f"strangers_recall={strangers.recall.estimate:.3f} strangers_flagged={strangers.flagged.estimate:.3f} "
          f"served_floor={served:g} chosen_floor={chosen:g}")
    return 0
