"""``strata probe``: the Level-0 probe for a user's model (issue 25, docs/probe.md).

- ``strata probe train --model DIR --data prompts.jsonl --out OUT``: fit the probe's directions head
  (``strata.models.probe_head``) on the model's last hidden state; OUT becomes a probe directory the service
  serves (``python -m svc_probe --model OUT``): the model's files and ``probe_head.*``.
- ``strata probe compare --probe OUT --data prompts.jsonl``: on a probe directory that has a head and
  is the zoo's probe, held-out accuracy and CPU latency of the head against the likelihood method.

Data rows are ``{"prompt": str, "direction": str, "risk": bool}`` (risk optional, default false);
``--directions`` is a JSON object ``{name: description}`` (default: strata/contract/directions.py).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from strata.contract.directions import DIRECTIONS
from strata.errors import CliError
from strata.jsonl import read_jsonl


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("probe", help="train the Level-0 probe's directions head on your own model")
    sub = parser.add_subparsers(dest="probe_command", metavar="SUBCOMMAND", required=True)

    train = sub.add_parser("train", help="fit a directions head on a causal LM; write a probe directory")
    train.add_argument("--model", type=Path, required=True, help="your causal-LM directory (save_pretrained)")
    train.add_argument("--data", type=Path, required=True,
                       help='JSONL, one {"prompt": str, "direction": str, "risk": bool} per line (risk optional)')
    train.add_argument("--directions", type=Path, default=None,
                       help="JSON object {name: description} (default: the canonical directions)")
    train.add_argument("--out", type=Path, required=True, help="the probe directory to write (model + head)")
    train.add_argument("--holdout", type=float, default=0.2, help="share of each direction held out (default 0.2)")
    train.add_argument("--epochs", type=int, default=None, help="full-batch AdamW steps (default 300)")
    train.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default 0.02)")
    train.add_argument("--weight-decay", type=float, default=None, help="AdamW weight decay (default 0.01)")
    train.add_argument("--seed", type=int, default=0, help="split and fit seed")
    _add_run_arguments(train)
    train.add_argument("--force", action="store_true", help="replace a non-empty --out")
    train.set_defaults(func=run_train)

    compare = sub.add_parser("compare", help="held-out accuracy and latency: head against likelihood")
    compare.add_argument("--probe", type=Path, required=True,
                         help="a probe directory with a head, from the zoo's probe (strata probe train --model ZOO)")
    compare.add_argument("--data", type=Path, required=True, help="held-out JSONL rows, as for train")
    _add_run_arguments(compare)
    compare.set_defaults(func=run_compare)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=32, help="prompts per forward (default 32)")
    parser.add_argument("--max-prompt-tokens", type=int, default=128,
                        help="query tokens the LM reads, the end kept (the service's max_prompt_tokens; default 128)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")


# --- the user's files ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Example:
    prompt: str
    direction: str
    risk: bool


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"direction {repeated[0]!r} is given twice")
    return dict(pairs)


def read_directions(path: Path | None) -> dict[str, str]:
    """The direction set, in order: ``--directions`` (a JSON object name -> description) or the canonical one."""
    from strata.models.prompts import direction_phrase

    if path is None:
        return dict(DIRECTIONS)
    if not path.is_file():
        raise CliError(f"{path}: no such file (--directions takes a JSON object {{name: description}})")
    try:
        value = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from exc
    except ValueError as exc:  # a repeated name
        raise CliError(f"{path}: {exc}") from exc
    if not isinstance(value, dict):
        raise CliError(f"{path}: expected a JSON object {{name: description}}, got a {type(value).__name__}")
    if len(value) < 2:
        raise CliError(f"{path}: name at least 2 directions, got {len(value)}")
    for name, description in value.items():
        try:
            direction_phrase(name)
        except ValueError as exc:
            raise CliError(f"{path}: {exc}") from exc
        if not isinstance(description, str) or not description.strip():
            raise CliError(f"{path}: direction {name!r}: the description must be a non-empty string")
    return value


def read_examples(path: Path, directions: dict[str, str], directions_source: str) -> list[Example]:
    """The rows of a data file, each checked; errors name the file, the line and what to fix."""
    examples = []
    for number, row in read_jsonl(path):
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise CliError(f'{where}: expected an object {{"prompt": ..., "direction": ..., "risk": ...}}')
        prompt, direction, risk = row.get("prompt"), row.get("direction"), row.get("risk", False)
        if not isinstance(prompt, str) or not prompt.strip():
            raise CliError(f'{where}: "prompt" must be a non-empty string')
        if not isinstance(direction, str):
            raise CliError(f'{where}: "direction" must be a string, got {direction!r}')
        if direction not in directions:
            raise CliError(f"{where}: unknown direction {direction!r}; {directions_source} has "
                           f"{', '.join(directions)} (add it to --directions, or fix the row)")
        if not isinstance(risk, bool):
            raise CliError(f'{where}: "risk" must be true or false, got {risk!r}')
        examples.append(Example(prompt, direction, risk))
    if not examples:
        raise CliError(f"{path}: no examples (the file is empty)")
    used = {e.direction for e in examples}
    if len(used) < 2:
        raise CliError(f"{path}: every example has direction {next(iter(used))!r}; a head needs examples of at "
                       "least 2 directions")
    return examples


def split_examples(examples: Sequence[Example], holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """Train and held-out indices: ``holdout`` of each direction's examples (rounded), at least one kept
    for training, so every direction of the data is learnt."""
    rng = random.Random(seed)
    train: list[int] = []
    held: list[int] = []
    for direction in dict.fromkeys(e.direction for e in examples):
        indices = [i for i, e in enumerate(examples) if e.direction == direction]
        rng.shuffle(indices)
        n_held = min(round(len(indices) * holdout), len(indices) - 1)
        held += indices[:n_held]
        train += indices[n_held:]
    return sorted(train), sorted(held)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_out(out: Path, model: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out} is a file; give a directory to create")
    if out.resolve() == model.resolve():
        raise CliError(f"--out {out} is the model directory itself; give another directory (the model is copied)")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise CliError(f"--out {out} is not empty; pass --force to replace it, or choose another directory")


def _set_threads(threads: int | None) -> None:
    import torch

    if threads is not None:
        if threads < 1:
            raise CliError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)


def _load_lm(model: Path, device: str, dtype: str) -> Any:
    from strata.models.loading import ModelLoadError, load_causal_lm

    try:
        return load_causal_lm(model, device=device, dtype=dtype)
    except ModelLoadError as exc:
        raise CliError(str(exc)) from exc


def _features(lm: Any, prompts: Sequence[str], max_tokens: int, batch_size: int) -> Any:
    """(N, H) features on the CPU, computed in batches with progress lines."""
    import torch

    from strata.models.probe_head import prompt_features
    from strata.models.prompts import PromptFormat

    fmt = PromptFormat.of(lm.tokenizer)
    started = time.perf_counter()
    chunks = []
    n_batches = -(-len(prompts) // batch_size)
    every = max(1, n_batches // 10)
    for b in range(n_batches):
        features, _ = prompt_features(lm, prompts[b * batch_size: (b + 1) * batch_size], max_tokens, fmt)
        chunks.append(features.cpu())
        if (b + 1) % every == 0 or b + 1 == n_batches:
            done = min((b + 1) * batch_size, len(prompts))
            print(f"features: {done}/{len(prompts)} prompts ({time.perf_counter() - started:.1f} s)", flush=True)
    return torch.cat(chunks)


def _copy_model_files(model: Path, staging: Path) -> int:
    """Copy the model directory's top-level files (links followed) but any old head; bytes copied."""
    from strata.models.probe_head import HEAD_INFO, HEAD_WEIGHTS

    copied = 0
    skipped = []
    for item in sorted(model.iterdir()):
        if item.name in (HEAD_INFO, HEAD_WEIGHTS):
            continue
        if item.is_dir():
            skipped.append(item.name)
            continue
        shutil.copy2(item, staging / item.name)
        copied += (staging / item.name).stat().st_size
    if skipped:
        print(f"not copied (subdirectories; a save_pretrained model keeps its files at the top): {', '.join(skipped)}")
    return copied


def _write_out(out: Path, force: bool, fill: Any) -> None:
    """Build OUT in a staging directory beside it and move it into place: an error leaves no half OUT."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".staging", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 is for a temporary directory, not for OUT
    try:
        fill(staging)
        if out.exists():
            if any(out.iterdir()) and not force:  # appeared meanwhile
                raise CliError(f"--out {out} is not empty; pass --force to replace it")
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            out.rename(old / "out")
            staging.rename(out)
            shutil.rmtree(old)
        else:
            staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# --- train ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _TrainInputs:
    """What ``probe train`` checked before loading the model: the model, the directions, the split data."""

    model_dir: Path
    directions: dict[str, str]
    examples: list[Example]
    train_idx: list[int]
    held_idx: list[int]


def _check_train_flags(args: argparse.Namespace) -> None:
    """The numeric flags' ranges, checked before any file is read."""
    if not 0 <= args.holdout < 1:
        raise CliError(f"--holdout must be in [0, 1), got {args.holdout}")
    for flag, value in (("--epochs", args.epochs), ("--batch-size", args.batch_size),
                        ("--max-prompt-tokens", args.max_prompt_tokens)):
        if value is not None and value < 1:
            raise CliError(f"{flag} must be >= 1, got {value}")
    if args.lr is not None and args.lr <= 0:
        raise CliError(f"--lr must be > 0, got {args.lr}")
    if args.weight_decay is not None and args.weight_decay < 0:
        raise CliError(f"--weight-decay must be >= 0, got {args.weight_decay}")


def _train_inputs(args: argparse.Namespace) -> _TrainInputs:
    """The model directory, --out, the directions and the data, each checked, and the train/held-out split."""
    from strata.models.loading import ModelLoadError, check_model_dir

    try:
        model_dir = check_model_dir(args.model)
    except ModelLoadError as exc:
        raise CliError(str(exc)) from exc
    _check_out(args.out, model_dir, args.force)
    directions = read_directions(args.directions)
    source = str(args.directions) if args.directions else "the canonical set (strata/contract/directions.py)"
    examples = read_examples(args.data, directions, source)
    train_idx, held_idx = split_examples(examples, args.holdout, args.seed)
    if args.holdout > 0 and not held_idx:
        raise CliError(f"--holdout {args.holdout} holds out no example of {len(examples)} (each direction's share "
                       "rounds to 0); give more examples, a larger --holdout, or --holdout 0")
    return _TrainInputs(model_dir, directions, examples, train_idx, held_idx)


def _held_out_metrics(features: Any, labels: Any, risk: Any, held_idx: list[int],
                      weights: tuple[Any, Any, Any, Any]) -> dict[str, Any] | None:
    """The fitted head's figures on the held-out examples, printed; None when none is held out."""
    import torch

    from strata.models.probe_head import evaluate

    if not held_idx:
        return None
    w_d, b_d, w_r, b_r = weights
    held = torch.tensor(held_idx)
    direction_logits = features[held] @ w_d.T + b_d
    risk_logits = (features[held] @ w_r.T + b_r).squeeze(-1)
    metrics = evaluate(torch.softmax(direction_logits, dim=-1), torch.sigmoid(risk_logits), labels[held],
                       risk[held])
    print(f"held-out ({len(held_idx)}): top1={metrics['top1']:.3f} top3={metrics['top3']:.3f} "
          f"risk_acc={metrics['risk_acc']:.3f} risk_auc={_fmt(metrics['risk_auc'])}")
    return metrics


def _head_info(args: argparse.Namespace, inputs: _TrainInputs, lm: Any, prompt_format: str, used: list[str],
               cfg: Any, metrics: dict[str, Any] | None) -> dict[str, Any]:
    """The head's ``info``: the base model, the data's digest and counts, the training recipe, the figures."""
    examples = inputs.examples
    return {
        "base_model": str(inputs.model_dir.resolve()),
        "model_type": lm.model.config.model_type,
        "prompt_format": prompt_format,
        "max_prompt_tokens": args.max_prompt_tokens,
        "data": {"path": str(args.data), "sha256": _sha256(args.data), "examples": len(examples),
                 "train": len(inputs.train_idx), "held_out": len(inputs.held_idx),
                 "per_direction": {name: sum(e.direction == name for e in examples) for name in used},
                 "risk": sum(e.risk for e in examples)},
        "training": {"method": "logistic regression, full-batch AdamW; directions class-balanced",
                     "holdout": args.holdout, "epochs": cfg.epochs, "lr": cfg.lr,
                     "weight_decay": cfg.weight_decay, "seed": cfg.seed},
        "metrics": {"held_out": metrics},
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _fill_probe_dir(model_dir: Path, head: Any, out: Path, staging: Path) -> None:
    """The probe directory's contents, written into ``staging``: the model's files, then the head."""
    from strata.models.probe_head import save_head

    copied = _copy_model_files(model_dir, staging)
    save_head(head, staging)
    print(f"wrote {out}: the model's files ({copied / 1e6:.1f} MB) and the head "
          f"(probe_head.safetensors, probe_head.json)")


def run_train(args: argparse.Namespace) -> int:
    _check_train_flags(args)
    inputs = _train_inputs(args)
    examples, train_idx, held_idx = inputs.examples, inputs.train_idx, inputs.held_idx
    _set_threads(args.threads)

    import torch

    from strata.models.probe_head import DirectionsHead, FitConfig, fit_head, model_hidden_size
    from strata.models.prompts import PromptFormat

    used = [name for name in inputs.directions if any(e.direction == name for e in examples)]
    unused = [name for name in inputs.directions if name not in used]
    lm = _load_lm(inputs.model_dir, args.device, args.dtype)
    fmt = PromptFormat.of(lm.tokenizer)
    hidden = model_hidden_size(lm.model)
    print(f"probe-train model={inputs.model_dir} ({lm.model.config.model_type}, {fmt.kind} format, hidden {hidden}) "
          f"data={args.data} examples={len(examples)} train={len(train_idx)} held-out={len(held_idx)}")
    print(f"directions ({len(used)}): {', '.join(used)}")
    if unused:
        print(f"not in the data, left out of the head: {', '.join(unused)}")
    features = _features(lm, [e.prompt for e in examples], args.max_prompt_tokens, args.batch_size)  # (N, H)
    labels = torch.tensor([used.index(e.direction) for e in examples])  # (N,)
    risk = torch.tensor([e.risk for e in examples])  # (N,)
    overrides = {"epochs": args.epochs, "lr": args.lr, "weight_decay": args.weight_decay}
    cfg = FitConfig(seed=args.seed, **{k: v for k, v in overrides.items() if v is not None})
    started = time.perf_counter()
    train = torch.tensor(train_idx)
    w_d, b_d, w_r, b_r = fit_head(features[train], labels[train], risk[train], len(used), cfg)
    print(f"fit: {cfg.epochs} AdamW steps on {len(train_idx)} examples in {time.perf_counter() - started:.1f} s")
    metrics = _held_out_metrics(features, labels, risk, held_idx, (w_d, b_d, w_r, b_r))
    if not any(e.risk for e in examples):
        print("no example has risk=true: the head's risk stays low (the keyword safety net still applies)")
    info = _head_info(args, inputs, lm, fmt.kind, used, cfg, metrics)
    head = DirectionsHead(tuple((name, inputs.directions[name]) for name in used), w_d, b_d, w_r, b_r, info)
    _write_out(args.out, args.force, functools.partial(_fill_probe_dir, inputs.model_dir, head, args.out))
    m = metrics or {}
    print(f"probe-train directions={len(used)} examples={len(examples)} top1={_fmt(m.get('top1'))} "
          f"top3={_fmt(m.get('top3'))} risk_acc={_fmt(m.get('risk_acc'))}")
    return 0


# --- compare -------------------------------------------------------------------------------------

def _checked_probe_dir(probe: Path) -> Path:
    """The --probe directory, which must hold a head; a note when it is not the zoo's probe."""
    from strata.models.loading import ZOO_INFO_FILE, ModelLoadError, check_model_dir
    from strata.models.probe_head import has_head

    try:
        probe_dir = check_model_dir(probe)
    except ModelLoadError as exc:
        raise CliError(str(exc)) from exc
    if not has_head(probe_dir):
        raise CliError(f"{probe_dir} has no probe head; train one first: "
                       f"`strata probe train --model {probe_dir} --data PROMPTS.jsonl --out DIR`")
    if not (probe_dir / ZOO_INFO_FILE).is_file():
        print(f"note: {probe_dir} is not from the zoo's probe: the likelihood method's figures mean little here")
    return probe_dir


def _timed_probes(lm: Any, batches: list[list[Example]], methods: dict[str, Any], rules: Any, max_tokens: int,
                  fmt: Any) -> tuple[dict[str, list[Any]], dict[str, float]]:
    """Each method's results and seconds over the batches (head: a head, None: likelihood), after a warm-up."""
    from svc_probe.core import probe

    seconds = dict.fromkeys(methods, 0.0)
    results: dict[str, list[Any]] = {m: [] for m in methods}
    for warm_head in methods.values():  # warm-up, untimed
        probe(lm, [e.prompt for e in batches[0]], rules, max_tokens, head=warm_head, fmt=fmt)
    for b, batch in enumerate(batches):
        prompts = [e.prompt for e in batch]
        order = list(methods) if b % 2 == 0 else list(methods)[::-1]  # alternate: drift hits both alike
        for m in order:
            started = time.perf_counter()
            results[m] += probe(lm, prompts, rules, max_tokens, head=methods[m], fmt=fmt)
            seconds[m] += time.perf_counter() - started
    return results, seconds


def _print_comparison(examples: list[Example], results: dict[str, list[Any]], seconds: dict[str, float],
                      n_batches: int) -> dict[str, tuple[float, float]]:
    """One table row per method; each method's (top1, ms per prompt)."""
    from strata.models.probe_head import roc_auc

    n = len(examples)
    labels = [e.risk for e in examples]
    print(f"  {'method':11s} {'top1':>6s} {'top3':>6s} {'risk_acc':>9s} {'risk_auc':>9s} {'flagged':>8s} "
          f"{'ms/prompt':>10s} {'ms/batch':>9s}")
    summary = {}
    for m in results:
        pairs = list(zip(results[m], examples, strict=True))
        top1 = sum(r.directions[0][0] == e.direction for r, e in pairs) / n
        top3 = sum(e.direction in [d for d, _ in r.directions] for r, e in pairs) / n
        risk_acc = sum((r.risk > 0.5) == e.risk for r, e in pairs) / n
        risk_auc = roc_auc([r.risk for r in results[m]], labels)
        flagged = sum(r.risk > 0.5 for r in results[m]) / n
        ms_prompt, ms_batch = 1000 * seconds[m] / n, 1000 * seconds[m] / n_batches
        print(f"  {m:11s} {top1:6.3f} {top3:6.3f} {risk_acc:9.3f} {_fmt(risk_auc):>9s} {flagged:8.3f} "
              f"{ms_prompt:10.2f} {ms_batch:9.1f}")
        summary[m] = (top1, ms_prompt)
    return summary


def run_compare(args: argparse.Namespace) -> int:
    if args.batch_size < 1 or args.max_prompt_tokens < 1:
        raise CliError("--batch-size and --max-prompt-tokens must be >= 1")
    probe_dir = _checked_probe_dir(args.probe)
    _set_threads(args.threads)

    import torch

    from strata.models.loading import ModelLoadError
    from strata.models.probe_head import load_head, model_hidden_size
    from strata.models.prompts import PromptFormat
    from svc_probe.core import ProbeRules

    lm = _load_lm(probe_dir, args.device, args.dtype)
    try:
        head = load_head(probe_dir, model_hidden_size(lm.model)).to(lm.device)
    except ModelLoadError as exc:
        raise CliError(str(exc)) from exc
    examples = read_examples(args.data, dict(head.directions), f"the head in {probe_dir}")
    fmt = PromptFormat.of(lm.tokenizer)
    rules = ProbeRules(top_k=3, min_confidence=0.0, risk_threshold=0.5)
    zoo = (lm.zoo_info or {}).get("config_hash", "-")
    print(f"probe-compare probe={probe_dir} zoo={zoo} prompts={len(examples)} batch={args.batch_size} "
          f"threads={torch.get_num_threads()} device={lm.device}")
    methods = {"head": head, "likelihood": None}
    batches = [examples[i: i + args.batch_size] for i in range(0, len(examples), args.batch_size)]
    results, seconds = _timed_probes(lm, batches, methods, rules, args.max_prompt_tokens, fmt)
    summary = _print_comparison(examples, results, seconds, len(batches))
    n = len(examples)
    labels = [e.risk for e in examples]
    print(f"risk: {sum(labels)} of {n} prompts are risk topics; flagged = share with P(risk) > 0.5")
    print(f"probe-compare head_top1={summary['head'][0]:.3f} likelihood_top1={summary['likelihood'][0]:.3f} "
          f"head_ms_per_prompt={summary['head'][1]:.2f} likelihood_ms_per_prompt={summary['likelihood'][1]:.2f}")
    return 0
