"""What one step of the zoo's strong-RM recipe costs, and what the cheap speed levers buy (issue 62, item 1).

Trains the zoo's strong RM init (MiniLM on the default zoo) on the zoo's own RM data with its recipe
(grouped steps, pairwise loss, the head's learning-rate scale) for ``--steps`` steps per mode and prints
seconds per step: the run's wall time over its steps, model loading left out, tokenising the data and the
first step's allocations counted (the same in every mode):

- ``full``: as the zoo builds it;
- ``frozen-embeddings``: the word embeddings kept as pretrained (no gradient, no AdamW state);
- ``bf16``: the steps under ``torch.autocast`` in bfloat16 (the CPU's AVX-512 BF16 where it has one).

    STRATA_ZOO_PRESET=default .venv/bin/python scripts/rm_step_cost.py --steps 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from dataclasses import replace

from strata.contract.template import format_rm_input


def main() -> int:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from strata_tools.rm.recipe import StrongRecipe, groups_of, rm_init_dir, rm_init_overrides
    from strata_tools.rm.train import train_reward_model
    from strata_tools.zoo.build import ZooSettings, ensure_zoo

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="steps per mode")
    parser.add_argument("--modes", default="full,frozen-embeddings,bf16")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: all cores)")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if unknown := sorted(set(modes) - {"full", "frozen-embeddings", "bf16"}):
        parser.error(f"unknown mode(s) {', '.join(unknown)}: use full, frozen-embeddings or bf16")
    if args.threads:
        torch.set_num_threads(args.threads)

    zoo = ensure_zoo(ZooSettings(), progress=False)
    cfg = zoo.config
    rows = [json.loads(line) for line in zoo.rm_data.open(encoding="utf-8")]
    texts = [format_rm_input(row["prompt"], row["response"]) for row in rows]
    scores = [row["score"] for row in rows]
    recipe = StrongRecipe.of_zoo(cfg)
    init = rm_init_dir(zoo, cfg.rm_strong_init or "level1")
    tokenizer = AutoTokenizer.from_pretrained(init, local_files_only=True)
    print(f"zoo {cfg.config_hash()}: {len(rows)} RM rows, init {init}, {args.steps} steps of "
          f"{recipe.train.batch_size} groups per mode, {torch.get_num_threads()} threads")
    for mode in modes:
        model = AutoModelForSequenceClassification.from_pretrained(
            init, num_labels=cfg.rm_n_bins, local_files_only=True, **rm_init_overrides(cfg.rm_strong_init_layers))
        if mode == "frozen-embeddings":
            model.get_input_embeddings().weight.requires_grad_(False)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16" else contextlib.nullcontext()
        started = time.perf_counter()
        with autocast:
            train_reward_model(model, tokenizer, texts, scores, cfg.rm_max_length,
                               replace(recipe.train, steps=args.steps), cfg.seed, mode, groups=groups_of(rows),
                               pairwise_weight=recipe.pairwise_weight, head_lr_scale=recipe.head_lr_scale)
        print(f"{mode:18s} {(time.perf_counter() - started) / args.steps:.2f} s a step", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
