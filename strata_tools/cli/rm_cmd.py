"""``strata rm``: train the strong RM, distil light RMs, register versions, promote one (R5-R8).

    strata rm train-strong [--data pairs.jsonl] [--init DIR]   strong RM on (prompt, response, score)
    strata rm distill [--strong DIR|VERSION] [--members 3]      light RM(s) fitted to the strong RM
    strata rm distill --from-log                                one turn of the loop: re-distil, promote if better
    strata rm promote <version>                                 svc_reward swaps to it between batches
    strata rm refresh [--every 21600]                           the loop on fresh human labels: fine-tune,
                                                                re-distil, promote only if better held out
    strata rm sources [--prompts 200]                           what each kind of RM data adds (samples,
                                                                best-of-n, perturbed, a PPO checkpoint's)
    strata rm ensemble --member DIR --member DIR --out DIR   trained RMs as one ensemble directory
    strata rm list [--kind light] [--json]

Artifacts go to ``<cache_dir>/rm/<version>/`` (one ``save_pretrained`` directory, or ``member-<i>``
directories for an ensemble) with ``strata_rm.json`` (kind, version, checksum, metrics, the resolved
config, data sources). Versions are registered in Redis (``svc_reward.registry``); ``promote``
publishes ``strata.rm.updated``. Training and distillation are offline processes: svc_reward keeps
serving its current version meanwhile and swaps only on ``promote``.

The library behind it is ``strata_tools.rm``: the strong RM's training (``strata_tools.rm.strong``), the
distillation run (``strata_tools.rm.light``), the data, teacher logits and evaluation sets they share
(``strata_tools.rm.lifecycle``) and versions (``strata_tools.rm.versions``); ``strata bench rm`` calls it too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from strata.config import StrataSettings
from strata.errors import CliError
from strata_tools.rm.ensemble import write_ensemble
from strata_tools.rm.light import DistillOptions, distill_version
from strata_tools.rm.models import ZooSource
from strata_tools.rm.refresh import RefreshOptions
from strata_tools.rm.sources import SourcesOptions, run_sources, summary_line, table
from strata_tools.rm.strong import PSEUDO_LABELS_FILE, StrongOptions, train_strong
from strata_tools.rm.versions import open_registry, promote_version, version_table

log = logging.getLogger(__name__)


# --- parser ---------------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("rm", help="reward models: train the strong RM, distil, promote (R5-R8)")
    sub = parser.add_subparsers(dest="rm_command", metavar="SUBCOMMAND", required=True)
    _register_train_strong(sub)
    _register_distill(sub)
    _register_promote(sub)
    _register_refresh(sub)
    _register_sources(sub)
    _register_human_labels(sub)
    _register_ensemble(sub)
    _register_list(sub)


def _register_train_strong(sub: Any) -> None:
    """``rm train-strong``: the strong RM's data, init, recipe and growth options (R5)."""
    strong = sub.add_parser("train-strong", help="train the strong RM on (prompt, response, score) data (R5)")
    defaults = StrongOptions()  # every flag's default is the option's
    strong.add_argument("--data", type=Path, default=defaults.data,
                        help="JSONL of {prompt, response, score} with scores on 0-5 (default: the zoo's "
                             "oracle-labelled pairs)")
    strong.add_argument("--init", default=defaults.init,
                        help="checkpoint to start from: a causal LM (its transformer; the score-bin head starts "
                             "fresh) or a sequence-classification RM (default: the zoo's rm_strong_init LM, the probe, "
                             "read with its first rm_strong_init_layers blocks, 0: all)")
    strong.add_argument("--init-layers", type=int, default=defaults.init_layers,
                        help="read the init with its first N blocks only, the rest dropped (0: all; default: the "
                             "zoo's rm_strong_init_layers with the zoo's init, all of a given --init)")
    strong.add_argument("--n-bins", type=int, default=defaults.n_bins,
                        help="score bins on [0, 5] (reward = expected value)")
    # Unset numbers default to the zoo's own strong-RM recipe (ZooConfig.rm_strong_train, rm_max_length).
    strong.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps (default: the zoo's recipe)")
    strong.add_argument("--batch-size", type=int, default=defaults.batch_size, help="pairs per step (ungrouped data)")
    strong.add_argument("--lr", type=float, default=defaults.lr, help="peak AdamW learning rate (default: the zoo's)")
    strong.add_argument("--groups-per-step", type=int, default=defaults.groups_per_step,
                        help="with grouped data (rows with a 'group' field: answers to one prompt), groups per step "
                             "(default: the zoo's)")
    strong.add_argument("--pairwise-weight", type=float, default=defaults.pairwise_weight,
                        help="weight of the in-group Bradley-Terry ranking loss (grouped data only; 0: scores only)")
    strong.add_argument("--match-pairs", type=int, default=defaults.match_pairs,
                        help="prompt swaps per match step, with feature heads, after every step (the zoo's "
                             "recipe; the swaps and labels come from the prompt suite, so the default is the zoo's "
                             "with the zoo's data and 0 with --data)")
    strong.add_argument("--max-length", type=int, default=defaults.max_length,
                        help="tokens of (prompt, response) read, saved as the tokenizer's model_max_length so that "
                             "serving reads the same (default: the zoo's)")
    strong.add_argument("--widen", type=int, default=defaults.widen,
                        help="after training, multiply every width by this (1: no growth; default: the zoo's "
                             "rm_strong_widen from the zoo's init, 1 with --init)")
    strong.add_argument("--grow-layers", type=int, default=defaults.grow_layers,
                        help="after training, add this many blocks (default: the zoo's rm_strong_grow_layers from the "
                             "zoo's init, 0 with --init); a grown RM trains on for the zoo's rm_strong_grow_train "
                             "steps and keeps the model before growth as the student init of `strata rm distill`")
    strong.add_argument("--grow-steps", type=int, default=defaults.grow_steps,
                        help="steps after growth (default: the zoo's rm_strong_grow_train steps)")
    strong.add_argument("--frozen-layers", type=int, default=defaults.frozen_layers,
                        help="keep the trunk's embeddings and its lowest N blocks as they are until growth (0: all "
                             "train; BERT and GPT-2 trunks); the backward pass and the optimiser stop above them")
    strong.add_argument("--pseudo-label", action=argparse.BooleanOptionalAction, default=defaults.pseudo_label,
                        help="score historical rollouts (rollout log + content store) with the new RM and write "
                             f"{PSEUDO_LABELS_FILE} next to it")
    strong.add_argument("--max-rollouts", type=int, default=defaults.max_rollouts,
                        help="newest rollouts to pseudo-label")
    _add_common(strong, defaults)
    strong.set_defaults(func=_train_strong)


def _register_distill(sub: Any) -> None:
    """``rm distill``: the light RM's data, init and recipe, and the loop's ``--from-log`` turn (R6, R8)."""
    distill = sub.add_parser("distill", help="distil the strong RM into a light RM or ensemble (R6, R8)")
    defaults = DistillOptions()  # every flag's default is the option's (--data, a list to append to, is its ())
    distill.add_argument("--strong", default=defaults.strong,
                         help="strong RM directory or registered strong version (default: the zoo's strong RM)")
    distill.add_argument("--data", type=Path, action="append", default=[],
                         help="extra JSONL of {prompt, response} to pseudo-label (repeatable; scores are ignored)")
    distill.add_argument("--zoo-pairs", action=argparse.BooleanOptionalAction, default=defaults.zoo_pairs,
                         help="include the zoo's RM training pairs")
    distill.add_argument("--rollout-log", action=argparse.BooleanOptionalAction, default=defaults.rollout_log,
                         help="include historical rollouts from the rollout log (skipped if Kafka/Redis are down)")
    distill.add_argument("--max-rollouts", type=int, default=defaults.max_rollouts,
                         help="newest rollouts taken from the log")
    distill.add_argument("--max-pairs", type=int, default=defaults.max_pairs,
                         help="zoo RM pairs pseudo-labelled (a seeded sample; 0 = all)")
    distill.add_argument("--swaps", type=int, default=defaults.swaps,
                         help="prompt swaps of the suite's train prompts (an answer under its prompt and under "
                              "another: what teaches the prompt match; default: the zoo's with --zoo-pairs)")
    distill.add_argument("--augment", default=",".join(defaults.augment),
                         help="adversarial augmentations: synonym, reorder (comma-separated) or none")
    distill.add_argument("--augment-fraction", type=float, default=defaults.augment_fraction,
                         help="share of the pairs that get one augmented copy per augmentation")
    distill.add_argument("--members", type=int, default=defaults.members,
                         help="light RMs in the ensemble (R8 suggests 3)")
    distill.add_argument("--init", default=defaults.init,
                         help="what the light RM starts from: auto (the strong RM's student init, its trunk before "
                              "growth, when it has one; else fresh), fresh (--n-embd x --n-layer), or a directory")
    distill.add_argument("--init-layers", type=int, default=defaults.init_layers,
                         help="keep the init's first N blocks (default: with auto, the zoo's rm_light_layers when "
                              "the strong RM has that recipe; else all)")
    distill.add_argument("--n-embd", type=int, default=defaults.n_embd, help="light RM width (fresh init)")
    distill.add_argument("--n-layer", type=int, default=defaults.n_layer, help="light RM transformer blocks (fresh)")
    distill.add_argument("--n-head", type=int, default=defaults.n_head, help="light RM attention heads (fresh)")
    distill.add_argument("--steps", type=int, default=defaults.steps,
                         help="optimizer steps per light RM (default: the zoo's from an init, 700 fresh)")
    distill.add_argument("--batch-size", type=int, default=defaults.batch_size, help="pairs per step")
    distill.add_argument("--lr", type=float, default=defaults.lr,
                         help="peak AdamW learning rate (default: the zoo's from an init, 3e-3 fresh)")
    distill.add_argument("--temperature", type=float, default=defaults.temperature,
                         help="distillation temperature T of KL(strong || light) (not the scoring temperature)")
    distill.add_argument("--max-length", type=int, default=defaults.max_length,
                         help="tokens of (prompt, response) read")
    distill.add_argument("--promote", action="store_true", help="promote the new version right away")
    distill.add_argument("--from-log", action="store_true",
                         help="one turn of the distillation loop: re-distil the light RM in service (promoted, else "
                              "the zoo's) on new rollouts from the rollout log labelled by the strong RM, and promote "
                              "it (hot swap) if it agrees better with the strong RM on held-out logged prompts")
    distill.add_argument("--hold-out", type=float, default=defaults.hold_out,
                         help="share of the rollout log's prompts kept out of training to compare on "
                              f"(default {defaults.hold_out:g}; 0.2 with --from-log)")
    distill.add_argument("--no-promote-if-better", dest="promote_if_better", action="store_false",
                         help="with --from-log: register the new version but do not promote it")
    _add_common(distill, defaults)
    distill.set_defaults(func=_distill)


def _register_promote(sub: Any) -> None:
    """``rm promote``: publish a light version to every svc_reward (R7)."""
    promote = sub.add_parser("promote", help="publish a light version; every svc_reward swaps to it (R7)")
    promote.add_argument("version", help="a light version from `strata rm list`")
    promote.add_argument("--no-verify", dest="verify", action="store_false",
                         help="skip the checksum check here (the replicas still check it)")
    promote.set_defaults(func=_promote)


def _register_refresh(sub: Any) -> None:
    """``rm refresh``: one turn (or one every ``--every`` seconds) of the RM loop on fresh human labels."""
    refresh = sub.add_parser(
        "refresh", help="one turn of the RM loop on fresh human labels: fine-tune the strong RM, re-distil the light "
                        "RM, promote it only if it ranks held-out labels better (or every --every seconds)")
    refresh.add_argument("--annotations", action=argparse.BooleanOptionalAction, default=None,
                         help="read the annotators' scores from Kafka (default on)")
    refresh.add_argument("--data", type=str, action="append", default=None,
                         help="JSONL of {prompt, response, score} labels to use besides (repeatable)")
    refresh.add_argument("--audits", action=argparse.BooleanOptionalAction, default=None,
                         help="also the audited Level-1 answers labelled by the strong RM (default off; with --every, "
                              "on for the turn that answers the hacking defence's request)")
    # Unset flags leave the options to the environment, then to their defaults, which the help shows.
    shown = _shown_defaults(RefreshOptions)
    for name, kind, text in (
        ("hold-out", float, f"share of the labelled prompts held out to judge on (default {shown['hold_out']})"),
        ("min-held-out", int, f"fewest held-out labels a verdict is drawn from (default {shown['min_held_out']})"),
        ("min-train", int, f"fewest labels to fine-tune on (default {shown['min_train']})"),
        ("min-gain", float, f"Spearman gain on the held-out labels needed to promote (default {shown['min_gain']})"),
        ("min-gain-se", float, "...and bootstrap standard errors of that gain it must exceed "
                               f"(default {shown['min_gain_se']}; 0: any)"),
        ("strong-epochs", float, "passes over the labelled prompts and the replay the strong RM fine-tunes for "
                                 f"(default {shown['strong_epochs']})"),
        ("strong-steps", int, "fine-tuning steps of the strong RM (default: from --strong-epochs)"),
        ("strong-lr", float, "its peak learning rate (default: 0.6 x the zoo recipe's)"),
        ("replay", float, f"groups of the zoo's RM data mixed in per labelled prompt (default {shown['replay']})"),
        ("distill-steps", int, "KL steps of the light RM (default: the zoo recipe's)"),
        ("distill-pairs", int, "zoo RM pairs the new strong RM labels for the distillation "
                               f"(default {shown['distill_pairs']})"),
        ("rule-min-answers", int, "fewest held-out Level-1 answers people labelled to refit the escalation rule on, "
                                  f"when the version in service has one (default {shown['rule_min_answers']})"),
        ("rule-min-bad", int, f"...and fewest of them labelled bad (default {shown['rule_min_bad']})"),
        ("rule-target-catch", float, "share of the answers people labelled bad the fitted rule's threshold "
                                     "escalates (default: the rule in service's; a first rule 0.9)"),
        ("rule-bad-below", float, "a person's score under this marks an answer bad for the rule (default: the line "
                                  "the rule in service was fitted with)"),
        ("every", float, "run a turn every this many seconds, when --min-new-labels arrived (default: once)"),
        ("min-new-labels", int, "with --every: fresh labels since the last turn needed to run one "
                                f"(default {shown['min_new_labels']})"),
    ):
        refresh.add_argument(f"--{name}", type=kind, default=None, help=text)
    refresh.add_argument("--fit-rule", action=argparse.BooleanOptionalAction, default=None,
                         help="with no escalation rule in service, fit a first one for the candidate on people's "
                              "labels of held-out Level-1 answers (the light score and the neighbourhood's record; "
                              "kept only if it ranks them better than the score; default off)")
    refresh.add_argument("--promote", action=argparse.BooleanOptionalAction, default=None,
                         help="promote a candidate that ranks the held-out labels better (default on)")
    _add_run_flags(refresh)
    refresh.set_defaults(func=_refresh)


def _register_sources(sub: Any) -> None:
    """``rm sources``: one fine-tune per kind of RM data, judged on the policy's fresh answers."""
    sources = sub.add_parser(
        "sources", help="what each kind of RM data adds: one fine-tune per source (more samples, best-of-n under the "
                        "light RM, perturbed answers, a PPO checkpoint's answers) judged on the policy's fresh answers")
    sources.add_argument("--arm", dest="arms", action="append", default=None,
                         help="a source to measure (repeatable; default all: samples, best_of_n, perturbed, "
                              "policy_checkpoint)")
    shown = _shown_defaults(SourcesOptions)
    for name, kind, text in (
        ("prompts", int, f"train-split prompts each arm's labels answer (default {shown['prompts']})"),
        ("best-of", int, f"Level-1 samples the light RM picks its best from (default {shown['best_of']})"),
        ("policy-checkpoint", Path, "a PPO checkpoint of this zoo's Level-1 policy (default: the learner's newest "
                                    "that started from it)"),
        ("eval-prompts", int, "fresh-split prompts judged on (default all)"),
        ("replay", float, f"zoo RM groups replayed per labelled prompt (default {shown['replay']}, as the refresh)"),
        ("strong-epochs", float, f"passes over the prompts and the replay (default {shown['strong_epochs']}, as the "
                                 "refresh)"),
    ):
        sources.add_argument(f"--{name}", type=kind, default=None, help=text)
    _add_run_flags(sources)
    sources.set_defaults(func=_sources)


def _register_human_labels(sub: Any) -> None:
    """``rm human-labels``: the annotators' scores as JSONL for ``--data``."""
    human = sub.add_parser("human-labels", help="annotators' scores as {prompt, response, score} JSONL for "
                                                "train-strong --data and distill --data (R3, R5)")
    human.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    human.set_defaults(func=_human_labels)


def _register_ensemble(sub: Any) -> None:
    """``rm ensemble``: trained RMs as one ensemble directory."""
    ensemble = sub.add_parser("ensemble", help="several trained RMs as one ensemble directory: served, distilled "
                                               "and benched as one RM whose score is the members' mean")
    ensemble.add_argument("--member", action="append", default=[], required=True,
                          help="an RM directory (give two or more; the first is the light RM's student init)")
    ensemble.add_argument("--out", type=Path, required=True, help="the ensemble directory to write (must not exist)")
    ensemble.set_defaults(func=_ensemble)


def _ensemble(args: argparse.Namespace) -> int:
    version = write_ensemble(args.member, args.out)
    print(f"ensemble {version} at {args.out}: {len(args.member)} members; serve it with svc_reward --strong-rm "
          f"{args.out}, distil from it with strata rm distill --strong {args.out}")
    return 0


def _register_list(sub: Any) -> None:
    """``rm list``: the registered RM versions."""
    listing = sub.add_parser("list", help="registered RM versions, newest first")
    listing.add_argument("--kind", choices=("strong", "light"), default=None)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=_list)


def _shown_defaults(kind: type[BaseSettings]) -> dict[str, str]:
    """The declared default of each numeric option of ``kind``, as a flag's help shows it (``0.5``, ``3``)."""
    return {name: f"{field.default:g}" for name, field in kind.model_fields.items()
            if isinstance(field.default, int | float) and not isinstance(field.default, bool)}


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """Seed, device and threads, unset unless given (their options objects read the environment)."""
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")


def _add_common(parser: argparse.ArgumentParser, defaults: StrongOptions | DistillOptions) -> None:
    """Output, registration, seed, device and threads of a training run; seed and device default as ``defaults``."""
    parser.add_argument("--out", type=Path, default=None, help="output directory (default <cache_dir>/rm/<version>)")
    parser.add_argument("--register", action=argparse.BooleanOptionalAction, default=True,
                        help="register the version in Redis (needs `strata infra up` or STRATA_REDIS_URL)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--device", default=defaults.device, help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")


# --- shared helpers -------------------------------------------------------------------------------


def _settings() -> Any:
    from strata_tools.zoo.build import ZooSettings

    return ZooSettings()


def _zoo(settings: Any) -> ZooSource:
    """The zoo of ``settings`` for an RM run: built (``ensure_zoo``) only when the run reads its models."""
    from strata_tools.zoo.build import ZooOnDemand

    return ZooOnDemand(settings)


def _set_threads(threads: int | None) -> None:
    import torch

    torch.set_num_threads(threads or os.cpu_count() or 1)


def _print_metrics(metrics: dict[str, float]) -> None:
    for key in sorted(metrics):
        print(f"  {key:32s} {metrics[key]:.4f}")


# --- human-labels ---------------------------------------------------------------------------------


def _human_labels(args: argparse.Namespace) -> int:
    from strata_tools.rm.loop import annotation_rows

    annotated = annotation_rows(StrataSettings())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_suffix(args.out.suffix + ".partial")  # never a half-written file under --out
    partial.write_text("".join(json.dumps(row) + "\n" for row in annotated.rows))
    partial.replace(args.out)
    drifting = (f"; the scores of {', '.join(sorted(annotated.drifting))} left out: the desk's drift alarm holds "
                "them" if annotated.drifting else "")
    print(f"wrote {len(annotated.rows)} human-labelled pairs to {args.out} ({annotated.expired} left out: texts no "
          f"longer in the content store{drifting}); train with `strata rm train-strong --data {args.out}`")
    return 0


# --- train-strong ---------------------------------------------------------------------------------


def strong_options(args: argparse.Namespace) -> StrongOptions:
    """The strong-RM run ``rm train-strong``'s flags ask for."""
    names = {f.name for f in dataclasses.fields(StrongOptions)}
    return StrongOptions(**{k: v for k, v in vars(args).items() if k in names})


def _train_strong(args: argparse.Namespace) -> int:
    settings = _settings()
    registry = open_registry(settings) if args.register else None
    _set_threads(args.threads)
    result = train_strong(strong_options(args), settings, _zoo(settings))
    entry = result.entry
    print(f"strong RM {entry.version} at {entry.path} (final loss {result.loss:.3f})")
    _print_metrics(result.metrics)
    if result.n_pseudo_labelled:
        print(f"  pseudo-labels: {result.n_pseudo_labelled} rollouts -> {Path(entry.path) / PSEUDO_LABELS_FILE}")
    if registry is not None:
        registry.register(entry)
        print(f"registered {entry.version} (strata rm list)")
    return 0


# --- distill --------------------------------------------------------------------------------------


def distill_options(args: argparse.Namespace) -> DistillOptions:
    """The distillation ``rm distill``'s flags ask for."""
    names = {f.name for f in dataclasses.fields(DistillOptions)}
    fields = {k: v for k, v in vars(args).items() if k in names}
    fields["data"] = tuple(str(p) for p in args.data)
    fields["augment"] = tuple(a.strip() for a in args.augment.split(",") if a.strip() and a.strip() != "none")
    return DistillOptions(**fields)


def _distill(args: argparse.Namespace) -> int:
    settings = _settings()
    registry = open_registry(settings) if (args.register or args.promote or args.from_log) else None
    _set_threads(args.threads)
    distill_version(distill_options(args), settings, _zoo(settings), registry, out=args.out,
                    from_log=args.from_log, promote=args.promote, promote_if_better=args.promote_if_better)
    return 0


# --- refresh --------------------------------------------------------------------------------------


def _options(kind: Any, command: str, flags: dict[str, Any], flag_names: dict[str, str] | None = None) -> Any:
    """A pydantic options object from the flags that were given (the rest from the environment and
    defaults), or a CliError naming each bad flag (``flag_names``: field -> flag, where they differ)."""
    names = set(kind.model_fields)
    try:
        return kind(**{k: v for k, v in flags.items() if k in names and v is not None})
    except ValidationError as exc:
        renamed = flag_names or {}
        problems = "; ".join(f"--{renamed.get(str(e['loc'][0]), str(e['loc'][0])).replace('_', '-')}: {e['msg']}"
                             for e in exc.errors())
        raise CliError(f"strata rm {command}: {problems}") from exc


def _refresh(args: argparse.Namespace) -> int:
    from strata_tools.rm.loop import run_every, run_turn

    flags = {"every_s": args.every, **{k: v for k, v in vars(args).items() if k != "every"}}
    if args.data is not None:
        flags["data"] = tuple(args.data)
    options = _options(RefreshOptions, "refresh", flags)
    if not options.annotations and not options.data and not options.audits:
        raise CliError("no labels to refresh on: keep --annotations, pass --audits or --data FILE")
    settings = _settings()
    registry = open_registry(settings)
    _set_threads(args.threads)
    if options.every_s > 0:
        print(f"refreshing every {options.every_s:.0f} s once {options.min_new_labels} new labels arrived "
              "(Ctrl-C stops)")
        try:
            run_every(options, settings, _zoo(settings), registry)
        except KeyboardInterrupt:
            print("stopped")
        return 0
    run_turn(options, settings, _zoo(settings), registry)
    return 0


# --- sources --------------------------------------------------------------------------------------


def _sources(args: argparse.Namespace) -> int:
    flags = dict(vars(args))
    if args.arms is not None:
        flags["arms"] = tuple(args.arms)
    options = _options(SourcesOptions, "sources", flags, {"arms": "arm"})
    _set_threads(args.threads)
    settings = _settings()
    report = run_sources(options, settings, _zoo(settings))
    print(f"zoo {report.zoo}: {report.n_prompts} train prompts, {report.steps} steps per arm, {report.seconds:.0f} s")
    for line in table(report):
        print(line)
    print(summary_line(report))
    return 0


# --- promote, list --------------------------------------------------------------------------------


def _promote(args: argparse.Namespace) -> int:
    settings = _settings()
    promote_version(open_registry(settings), settings, args.version, args.verify)
    return 0


def _list(args: argparse.Namespace) -> int:
    settings = _settings()
    registry = open_registry(settings)
    entries = registry.list(args.kind)
    promoted = registry.promoted()
    if args.json:
        print(json.dumps([asdict(e) | {"serving": e.version == promoted} for e in entries], indent=2, default=str))
        return 0
    if not entries:
        print("no RM versions registered yet: strata rm train-strong / strata rm distill")
        return 0
    print("\n".join(version_table(entries, promoted)))
    return 0
