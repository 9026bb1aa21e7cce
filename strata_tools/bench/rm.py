"""``strata bench rm``: the light RM against the strong RM (R6): rank agreement, prompt match, speed.

In one run on this machine: the strong RM (the zoo's, or ``--strong``) and the light RM (the zoo's,
distilled from the strong RM in the build and served by default; ``--light DIR|VERSION``; or
``--distill``: distilled now with ``strata rm distill``'s defaults, cached under
``<cache_dir>/rm/bench/`` by strong weights and options). Both score the synthetic pairs of the
held-out eval and fresh splits (fresh: subjects no model saw in training); the bench reports
Spearman and Pearson of the light RM against the strong RM and against the oracle, each RM's prompt
match on eval prompt swaps (a reference answer scored under its own prompt and under another: an RM
that judges the answer alone gets ~0.5), then the scoring latency of both on the same batch of eval
pairs (median of ``--repeats`` forward passes, same threads, timed in turns so that both see the same
machine load). ``--temperature`` scores the light RM (every member of an ensemble) as svc_reward
does at that scoring temperature (R8).
Brief: Spearman 0.91 and ~100x faster (200 s -> 1.8 s); targets here: Spearman >= 0.91 on fresh
prompts, a latency ratio >= 10, light prompt match >= 0.8.

Then both RMs on the policy's own answers (R24, ``strata_tools.rm.onpolicy``): one Level-1 and one Level-2
answer to every prompt of the fresh split, guided by the probe's directions as live, judged by the
oracle; Spearman against the oracle per tier, the bad-case AUC on Level-1 answers and the pairwise
accuracy on (Level-1, Level-2) answers to one prompt. Targets (issue 37): light Level-1 Spearman
>= 0.55, Level-2 >= 0.5, bad-case AUC >= 0.85, pairwise accuracy >= 0.75.
Last line: ``rm spearman=<fresh> latency_ratio=<y> light_match=<z> onpolicy_l1= onpolicy_l2= bad_auc=
pair_acc= onpolicy_l1_lo= onpolicy_l1_hi= bad_auc_lo= bad_auc_hi=``, the on-policy figures for the served
light RM on the sealed test split by default, with 95 % intervals from a bootstrap over paraphrase families.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata.contract.checksums import weights_checksum
from strata.contract.template import RM_MAX_LENGTH
from strata.errors import CliError
from strata_tools.intervals import cluster_bootstraps
from strata_tools.rm.lifecycle import eval_sets, eval_swaps, mean_rewards, score_logits
from strata_tools.rm.light import DistillOptions, distill_version
from strata_tools.rm.onpolicy import BAD_THRESHOLD, PAIR_MARGIN, onpolicy_figures, policy_answers
from strata_tools.rm.versions import RM_INFO_FILE, open_registry

if TYPE_CHECKING:  # torch: imported by a run, not by `strata bench --help`
    from strata.models.loading import LoadedModel
    from strata_tools.intervals import Interval
    from strata_tools.rm.onpolicy import OnPolicyFigures

SPEARMAN_TARGET = 0.91
LATENCY_RATIO_TARGET = 10.0
MATCH_TARGET = 0.8
ONPOLICY_L1_TARGET = 0.55
ONPOLICY_L2_TARGET = 0.5
BAD_AUC_TARGET = 0.85
PAIR_ACCURACY_TARGET = 0.75


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strong", default=None, help="strong RM directory (default: the zoo's)")
    parser.add_argument("--light", default=None,
                        help="light RM directory, ensemble directory or registered light version "
                             "(default: the zoo's, distilled from its strong RM)")
    parser.add_argument("--distill", action="store_true",
                        help="distil a light RM now with `strata rm distill`'s defaults (cached) instead")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="the light RM's scoring temperature, as svc_reward's (R8; the article's 0.3)")
    parser.add_argument("--batch", type=int, default=64, help="eval pairs in the timed batch")
    parser.add_argument("--repeats", type=int, default=7, help="timed forward passes per RM, in turns (median)")
    parser.add_argument("--max-length", type=int, default=RM_MAX_LENGTH,
                        help="tokens per (prompt, response); an RM never reads more than its model_max_length")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    parser.add_argument("--onpolicy-split", default="test", choices=("test", "fresh", "eval"),
                        help="held-out split whose prompts the policy answers for the on-policy figures: the sealed "
                             "test split (default; nothing was chosen on it), fresh (validation: where recipes are "
                             "chosen) or eval")
    parser.add_argument("--onpolicy-prompts", type=int, default=None,
                        help="answer a seeded sample of N of the split's prompts, spread over topics and families "
                             "(default: all; the test split has 280)")


def _light_members(spec: str, settings: Any) -> list[Path]:
    path = Path(spec).expanduser()
    if path.is_dir():
        members = sorted(p for p in path.glob("member-*") if p.is_dir())
        return members or [path]
    from svc_reward.registry import UnknownVersionError

    try:
        entry = open_registry(settings).get(spec)
    except UnknownVersionError as exc:
        raise CliError(f"--light {spec}: neither a directory nor a registered version") from exc
    return [Path(p) for p in entry.paths]


def _distilled_light(strong_path: Path, settings: Any) -> list[Path]:
    """The default distillation of ``strong_path``, built once and cached."""
    from strata_tools.zoo.build import ZooOnDemand

    options = DistillOptions(strong=str(strong_path), rollout_log=False, device="cpu")
    key = f"{weights_checksum([strong_path])[:12]}-{options.key()}"
    cached = Path(settings.cache_dir).expanduser() / "rm" / "bench" / key
    if (cached / RM_INFO_FILE).is_file():
        print(f"light RM: cached distillation {cached}")
        return [cached]
    print("light RM: distilling now (once; cached for the next runs)")
    entry = distill_version(options, settings, ZooOnDemand(settings), None, out=cached)
    return [Path(p) for p in entry.paths]


def _interleaved_medians(fns: list[Any], repeats: int) -> list[float]:
    """Median wall time of each function, timed in turns (so both see the same machine load)."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, bucket in zip(fns, times, strict=True):
            started = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - started)
    return [statistics.median(bucket) for bucket in times]


@dataclass
class _RewardModels:
    """The strong RM and the light RM's members, loaded, with where they came from."""

    strong_path: Path
    members: list[Path]
    strong: LoadedModel
    lights: list[LoadedModel]


def run(args: argparse.Namespace) -> int:
    import torch

    from strata_tools.zoo.build import ZooSettings, ensure_zoo

    if args.light and args.distill:
        raise CliError("--light and --distill both choose the light RM: pass one")
    if not args.temperature > 0:
        raise CliError(f"--temperature must be > 0, got {args.temperature:g}")
    settings = ZooSettings()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    zoo = ensure_zoo(settings)  # its probe and generators write the on-policy answers even with --strong/--light
    rms = _load_rms(args, settings, zoo)
    cache_dir = Path(settings.cache_dir).expanduser() / "rm" / "logits"
    sets, metrics = _rank_agreement(args, rms, cache_dir)
    light_match = _prompt_match(args, rms)
    light_figures, light_intervals = _onpolicy(args, zoo, settings, rms, cache_dir)
    ratio = _latency(args, rms, sets["eval"])
    spearman = metrics["spearman/strong_fresh"]
    print(f"targets: fresh spearman {_verdict(spearman, SPEARMAN_TARGET)}, latency ratio "
          f"{_verdict(ratio, LATENCY_RATIO_TARGET)}, light match {_verdict(light_match, MATCH_TARGET)}")
    print(f"on-policy targets (light): L1 spearman {_verdict(light_figures.spearman_level1, ONPOLICY_L1_TARGET)}, "
          f"L2 spearman {_verdict(light_figures.spearman_level2, ONPOLICY_L2_TARGET)}, bad AUC "
          f"{_verdict(light_figures.bad_auc, BAD_AUC_TARGET)}, pair accuracy "
          f"{_verdict(light_figures.pair_accuracy, PAIR_ACCURACY_TARGET)}")
    l1, auc = light_intervals
    print(f"rm spearman={spearman:.3f} latency_ratio={ratio:.1f} light_match={light_match:.3f} "
          f"onpolicy_l1={light_figures.spearman_level1:.3f} onpolicy_l2={light_figures.spearman_level2:.3f} "
          f"bad_auc={light_figures.bad_auc:.3f} pair_acc={light_figures.pair_accuracy:.3f} "
          f"onpolicy_l1_lo={l1.low:.3f} onpolicy_l1_hi={l1.high:.3f} "
          f"bad_auc_lo={auc.low:.3f} bad_auc_hi={auc.high:.3f}")
    return 0


def _load_rms(args: argparse.Namespace, settings: Any, zoo: Any) -> _RewardModels:
    """The strong RM and the light RM chosen by ``--strong``, ``--light`` and ``--distill``, loaded and printed."""
    from strata.models.loading import load_reward_model

    strong_path = Path(args.strong) if args.strong else zoo.rm_strong
    if args.light:
        members = _light_members(args.light, settings)
    elif args.distill:
        members = _distilled_light(strong_path, settings)
    else:
        members = [zoo.rm_light]
    strong = load_reward_model(strong_path, device="cpu")
    lights = [load_reward_model(m, device="cpu") for m in members]
    teacher = (lights[0].zoo_info or {}).get("teacher")
    print(f"strong RM {strong_path}: {strong.n_params / 1e6:.2f}M params; light RM {members[0]}"
          f"{f' (+{len(members) - 1} members)' if len(members) > 1 else ''}: {lights[0].n_params / 1e6:.2f}M params"
          f"{f', distilled from {teacher}' if teacher else ''}"
          f"{f'; light scoring temperature {args.temperature:g}' if args.temperature != 1.0 else ''}")
    return _RewardModels(strong_path, members, strong, lights)


def _rank_agreement(args: argparse.Namespace, rms: _RewardModels, cache_dir: Path
                    ) -> tuple[dict[str, tuple[list[str], list[str], list[float]]], dict[str, float]]:
    """The held-out sets and the light RM's Spearman and Pearson against the strong RM and the oracle, printed."""
    from strata.models.reward import expected_reward
    from strata_tools.rm.distill import comparison_metrics

    sets = eval_sets()
    light_scores, strong_scores, oracle_scores = {}, {}, {}
    for split, (prompts, responses, oracle) in sets.items():
        strong_scores[split] = expected_reward(
            score_logits(rms.strong, prompts, responses, args.max_length, f"strong {split}", cache_dir)).tolist()
        light_scores[split] = mean_rewards(rms.lights, prompts, responses, args.max_length, f"light {split}",
                                           args.temperature)
        oracle_scores[split] = oracle
    metrics = comparison_metrics(light_scores, strong_scores, oracle_scores)
    for split in sets:
        m = {k.replace(f"_{split}", ""): v for k, v in metrics.items() if k.endswith(f"_{split}")}
        print(f"{split:5s} ({len(sets[split][0])} pairs): light vs strong spearman={m['spearman/strong']:.3f} "
              f"pearson={m['pearson/strong']:.3f} | light vs oracle spearman={m['spearman/oracle']:.3f} | "
              f"strong vs oracle spearman={m['strong/spearman/oracle']:.3f}")
    return sets, metrics


def _prompt_match(args: argparse.Namespace, rms: _RewardModels) -> float:
    """The light RM's prompt match on the eval prompt swaps (the strong RM's printed beside it)."""
    from strata.models.reward import prompt_match

    swaps = eval_swaps()
    light_match = prompt_match(rms.lights, *swaps, args.max_length)
    strong_match = prompt_match([rms.strong], *swaps, args.max_length)
    print(f"prompt match on {len(swaps[0])} eval prompt swaps: light {light_match:.3f}, strong {strong_match:.3f} "
          "(oracle 1.000; an RM blind to the prompt ~0.5)")
    return light_match


def _onpolicy(args: argparse.Namespace, zoo: Any, settings: Any, rms: _RewardModels, cache_dir: Path
              ) -> tuple[OnPolicyFigures, tuple[Interval, Interval]]:
    """Both RMs on the policy's own answers (R24), printed as a table; the light RM's figures, and its Level-1
    Spearman's and bad-case AUC's 95 % intervals from a bootstrap over paraphrase families."""
    from strata.models.reward import expected_reward

    if args.onpolicy_prompts is not None and args.onpolicy_prompts < 10:
        raise CliError("--onpolicy-prompts must be at least 10: the figures need both bad and good answers")
    answers = policy_answers(zoo, args.onpolicy_split, cache_dir=Path(settings.cache_dir).expanduser() / "rm" /
                             "onpolicy", limit=args.onpolicy_prompts)
    answer_prompts, answer_texts = [a.prompt for a in answers], [a.response for a in answers]
    onpolicy = {
        "strong": onpolicy_figures(answers, expected_reward(score_logits(
            rms.strong, answer_prompts, answer_texts, args.max_length, "strong on-policy", cache_dir)).tolist()),
    }
    light_rewards = mean_rewards(rms.lights, answer_prompts, answer_texts, args.max_length, "light on-policy",
                                 args.temperature)
    onpolicy["light"] = onpolicy_figures(answers, light_rewards)
    light_figures = onpolicy["light"]
    print(f"on the policy's answers ({args.onpolicy_split} split, {light_figures.n_level1} prompts; oracle < "
          f"{BAD_THRESHOLD:g}: {light_figures.n_bad} bad Level-1 answers; {light_figures.n_pairs} (Level-1, Level-2) "
          f"pairs {PAIR_MARGIN:g}+ apart):")
    print(f"{'RM':8s} {'L1 spearman':>12s} {'L2 spearman':>12s} {'bad AUC':>8s} {'pair acc':>9s}")
    for name, figures in onpolicy.items():
        print(f"{name:8s} {figures.spearman_level1:12.3f} {figures.spearman_level2:12.3f} {figures.bad_auc:8.3f} "
              f"{figures.pair_accuracy:9.3f}")
    intervals = onpolicy_intervals(answers, light_rewards)
    print(f"light, 95 % intervals (bootstrap over {intervals[0].clusters} paraphrase families): L1 spearman "
          f"{intervals[0]}, bad AUC {intervals[1]}")
    return light_figures, intervals


def onpolicy_intervals(answers: Sequence[Any], rewards: Sequence[float], seed: int = 0,
                       draws: int = 1000) -> tuple[Interval, Interval]:
    """Level-1 Spearman and bad-case AUC of ``rewards`` on ``answers`` (``PolicyAnswer``), each with a 95 %
    interval from resampling whole paraphrase families (a prompt id is ``<family>#<k>``)."""
    families = [a.prompt_id.rsplit("#", 1)[0] for a in answers]

    def values(idx: Sequence[int]) -> tuple[float, float]:
        figures = onpolicy_figures([answers[i] for i in idx], [rewards[i] for i in idx])
        return figures.spearman_level1, figures.bad_auc

    spearman_level1, bad_auc = cluster_bootstraps(values, families, seed, draws)
    return spearman_level1, bad_auc


def _latency(args: argparse.Namespace, rms: _RewardModels, eval_set: tuple[list[str], list[str], list[float]]
             ) -> float:
    """The strong RM's latency over the light RM's on one batch of eval pairs (each printed)."""
    import torch

    from strata.models.reward import reward_logits

    # One forward pass of the whole batch per RM (all ensemble members).
    prompts, responses, _ = eval_set
    batch = (prompts[: args.batch], responses[: args.batch])
    with torch.no_grad():
        strong_s, light_s = _interleaved_medians([
            lambda: reward_logits(rms.strong, *batch, len(batch[0]), args.max_length),
            lambda: [reward_logits(rm, *batch, len(batch[0]), args.max_length) for rm in rms.lights],
        ], args.repeats)
    print(f"latency on {len(batch[0])} eval pairs ({torch.get_num_threads()} threads): "
          f"strong {1000 * strong_s:.1f} ms, light {1000 * light_s:.1f} ms "
          f"({1000 * light_s / len(batch[0]):.2f} ms/pair)")
    return strong_s / light_s


def _verdict(value: float, target: float) -> str:
    """``value`` against ``target``, e.g. ``0.930 >= 0.91``."""
    return f"{value:.3f} {'>=' if value >= target else '<'} {target:g}"
