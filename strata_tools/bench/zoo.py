"""``strata bench zoo``: the zoo's models measured in one run on this machine.

For each model: parameter count and throughput (new tokens/s when generating for LMs, input tokens/s
when scoring for RMs). Then, on the eval split: the probe's top-1 direction accuracy, the mean
oracle score of Level-1 and Level-2 responses to the same prompts (each told the prompt's intent as
its direction, sampled at temperature 0.7, top_p 0.9), and the Spearman correlation of the strong
and light RMs with the oracle on eval (prompt, response) pairs made like the RMs' training pairs
(reference and degraded answers, two per eval prompt, every eval prompt by default: the headline
figure), on the Level-1/Level-2 samples alone, and on both; and each RM's prompt match: how often a
reference answer scores higher under its own prompt than under another eval prompt (the oracle
always does; an RM that judges the answer alone, ~0.5).
Last line: ``zoo l2_over_l1_oracle=<ratio> ...``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scipy.stats import spearmanr

from strata.contract.template import format_probe_query, format_rm_input
from strata.errors import CliError
from strata.models.generation import SamplingConfig, generate
from strata.models.loading import LoadedModel, load_causal_lm, load_reward_model
from strata.models.reward import prompt_match, score_responses
from strata_tools.task.corpus import PromptSwap, prompt_swaps, rm_pairs
from strata_tools.task.oracle import oracle_score
from strata_tools.task.suite import PromptRecord, load_suite
from strata_tools.zoo.arguments import add_zoo_arguments, zoo_settings_from_args

if TYPE_CHECKING:
    from strata_tools.zoo.build import ZooPaths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=160, help="eval prompts to generate for")
    # Scoring is cheap next to generating, and the Spearman of 320 pairs (160 prompts) moved by
    # +-0.02 between eval samples: the RM figures use the whole split unless told otherwise.
    parser.add_argument("--rm-prompts", type=int, default=0,
                        help="eval prompts for the RM pairs and the prompt match (0: every eval prompt)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    add_zoo_arguments(parser)  # --preset, --cache-dir
    parser.add_argument("--build", action="store_true", help="build the zoo first if it is missing")


def _probe_accuracy(probe: LoadedModel, records: list[PromptRecord], batch_size: int) -> tuple[float, float]:
    """Top-1 direction accuracy of the probe's greedy continuation, and its new tokens/s."""
    tokenizer = probe.tokenizer
    queries = [format_probe_query(r.text) for r in records]
    correct = n_tokens = 0
    started = time.perf_counter()
    for start in range(0, len(queries), batch_size):
        batch = tokenizer(queries[start : start + batch_size], return_tensors="pt", padding=True)
        output = probe.model.generate(**batch, max_new_tokens=8, do_sample=False,
                                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        new = output[:, batch["input_ids"].shape[1] :]  # (b, 8)
        n_tokens += new.numel()
        for record, text in zip(records[start : start + batch_size], tokenizer.batch_decode(new), strict=True):
            correct += text.strip().split("\n")[0].strip() == record.intent
    return correct / len(records), n_tokens / (time.perf_counter() - started)


# One model's row of the table: role, parameters, tokens/s, what the tokens are.
_ModelRow = tuple[str, int, float, str]


@dataclass
class _Generations:
    """Level-1 and Level-2 responses to the eval prompts and their oracle scores, by role."""

    rows: list[_ModelRow]
    responses: dict[str, list[str]]
    oracle: dict[str, list[float]]


@dataclass
class _RmEvalSet:
    """The RMs' eval (prompt, response) pairs with their oracle scores (synthetic pairs first), and the
    prompt swaps of the prompt match."""

    prompts: list[str]
    responses: list[str]
    truth: list[float]
    n_synthetic: int
    swaps: list[PromptSwap]


@dataclass
class _RmFigures:
    """Each RM's throughput row, prompt match and Spearman against the oracle (pairs, samples, all), by role."""

    rows: list[_ModelRow]
    match: dict[str, float]
    spearman: dict[str, dict[str, float]]


def run(args: argparse.Namespace) -> int:
    paths = _open_zoo(args)
    rng = random.Random(args.seed)
    eval_split = load_suite("eval")
    records = rng.sample(eval_split, min(args.prompts, len(eval_split)))
    probe = load_causal_lm(paths.probe, device="cpu")
    accuracy, probe_tps = _probe_accuracy(probe, records, args.batch_size)
    generations = _generate_tiers(paths, records, args)
    rm_set = _rm_eval_set(rng, eval_split, records, generations, args.rm_prompts, args.seed)
    rms = _score_rms(paths, rm_set, args.batch_size)
    rows = [("probe", probe.n_params, probe_tps, "gen tok/s"), *generations.rows, *rms.rows]
    _print_report(rows, records, accuracy, generations, rm_set, rms)
    return 0


def _open_zoo(args: argparse.Namespace) -> ZooPaths:
    """The zoo of ``--preset``, built first with ``--build`` if it is missing; its header line printed."""
    from strata_tools.zoo.build import ensure_zoo, zoo_paths

    if args.prompts < 1 or args.rm_prompts < 0:
        raise CliError("--prompts must be at least 1 and --rm-prompts at least 0 (0: every eval prompt)")
    settings = zoo_settings_from_args(args)
    paths = zoo_paths(settings)
    if not paths.is_complete():
        if not args.build:
            raise CliError(f"no zoo built at {paths.root}: run `strata models build` (or pass --build)")
        paths = ensure_zoo(settings)
    print(f"zoo preset={paths.config.preset} hash={paths.config.config_hash()} dir={paths.root}")
    return paths


def _generate_tiers(paths: ZooPaths, records: list[PromptRecord], args: argparse.Namespace) -> _Generations:
    """Level-1 and Level-2 answers to ``records``, each told the prompt's intent, timed and oracle-scored."""
    prompts = [r.text for r in records]
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, seed=args.seed)
    generations = _Generations([], {}, {})
    for role, path in (("level1", paths.level1), ("level2", paths.level2)):
        lm = load_causal_lm(path, device="cpu")
        started = time.perf_counter()
        outputs = generate(lm, prompts, [[r.intent] for r in records], sampling, args.batch_size)
        elapsed = time.perf_counter() - started
        generations.rows.append((role, lm.n_params, sum(g.n_tokens for g in outputs) / elapsed, "gen tok/s"))
        generations.responses[role] = [g.text for g in outputs]
        generations.oracle[role] = [oracle_score(r, g.text) for r, g in zip(records, outputs, strict=True)]
    return generations


def _rm_eval_set(rng: random.Random, eval_split: list[PromptRecord], records: list[PromptRecord],
                 generations: _Generations, rm_prompts: int, seed: int) -> _RmEvalSet:
    """Two synthetic pairs per RM prompt (reference or degraded) plus both tiers' samples, and the swaps."""
    rm_records = rng.sample(eval_split, rm_prompts) if 0 < rm_prompts < len(eval_split) else eval_split
    pairs = rm_pairs(rm_records, 2, seed)
    prompts = [r.text for r in records]
    responses, oracle = generations.responses, generations.oracle
    return _RmEvalSet(
        prompts=[p.record.text for p in pairs] + prompts + prompts,
        responses=[p.response for p in pairs] + responses["level1"] + responses["level2"],
        truth=[oracle_score(p.record, p.response) for p in pairs] + oracle["level1"] + oracle["level2"],
        n_synthetic=len(pairs),
        # Prompt match: each prompt's reference answer scored under the prompt and under another one.
        swaps=prompt_swaps(rm_records, seed, eval_split),
    )


def _score_rms(paths: ZooPaths, rm_set: _RmEvalSet, batch_size: int) -> _RmFigures:
    """The strong and light RMs' scoring speed, prompt match and Spearman against the oracle on ``rm_set``."""
    figures = _RmFigures([], {}, {})
    n_synthetic, truth, swaps = rm_set.n_synthetic, rm_set.truth, rm_set.swaps
    for role, path in (("rm_strong", paths.rm_strong), ("rm_light", paths.rm_light)):
        rm = load_reward_model(path, device="cpu")
        started = time.perf_counter()
        rewards = score_responses(rm, rm_set.prompts, rm_set.responses, batch_size)
        elapsed = time.perf_counter() - started
        texts = [format_rm_input(p, r) for p, r in zip(rm_set.prompts, rm_set.responses, strict=True)]
        n_input = sum(len(ids) for ids in rm.tokenizer(texts, truncation=True)["input_ids"])  # what the RM read
        figures.rows.append((role, rm.n_params, n_input / elapsed, "score tok/s"))
        figures.match[role] = prompt_match([rm], [s.response for s in swaps], [s.record.text for s in swaps],
                                           [s.other.text for s in swaps], batch_size=batch_size)
        figures.spearman[role] = {
            "pairs": float(spearmanr(rewards[:n_synthetic], truth[:n_synthetic]).statistic),
            "samples": float(spearmanr(rewards[n_synthetic:], truth[n_synthetic:]).statistic),
            "all": float(spearmanr(rewards, truth).statistic),
        }
    return figures


def _print_report(rows: list[_ModelRow], records: list[PromptRecord], accuracy: float, generations: _Generations,
                  rm_set: _RmEvalSet, rms: _RmFigures) -> None:
    """The table of models, the probe's accuracy, the oracle means, the RMs' figures and the last line."""
    print(f"{'model':10s} {'params':>10s} {'tokens/s':>10s}")
    for role, n_params, tps, unit in rows:
        print(f"{role:10s} {n_params / 1e6:9.2f}M {tps:10.0f}  ({unit})")
    mean_l1, mean_l2 = statistics.mean(generations.oracle["level1"]), statistics.mean(generations.oracle["level2"])
    ratio = mean_l2 / mean_l1 if mean_l1 > 0 else float("inf")
    print(f"eval prompts: {len(records)}; probe top-1 direction accuracy: {accuracy:.3f}")
    print(f"oracle mean: level1 {mean_l1:.3f}  level2 {mean_l2:.3f}  (ratio {ratio:.3f})")
    n_synthetic = rm_set.n_synthetic
    for role, rho in rms.spearman.items():
        n_samples = len(rm_set.truth) - n_synthetic
        print(f"{role} Spearman vs oracle: {rho['pairs']:.3f} on {n_synthetic} eval pairs (reference and degraded "
              f"answers), {rho['samples']:.3f} on {n_samples} Level-1/2 samples, {rho['all']:.3f} on both")
    for role, match in rms.match.items():
        print(f"{role} prompt match: {match:.3f} of {len(rm_set.swaps)} reference answers score higher under their "
              "own prompt than under another one (oracle: 1.000; an RM blind to the prompt: ~0.5)")
    print(
        f"zoo l2_over_l1_oracle={ratio:.3f} level1_oracle={mean_l1:.3f} level2_oracle={mean_l2:.3f} "
        f"rm_strong_spearman={rms.spearman['rm_strong']['pairs']:.3f} "
        f"rm_light_spearman={rms.spearman['rm_light']['pairs']:.3f} "
        f"rm_strong_match={rms.match['rm_strong']:.3f} rm_light_match={rms.match['rm_light']:.3f}"
    )
