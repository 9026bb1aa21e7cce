"""Does the zoo's strong RM still read the policy's answers better with more training? (issue 37)

Continues the zoo's strong RM before growth (the function svc_reward serves, grown) on the zoo's own
RM data with its recipe, in rounds of ``--rounds`` steps (each round a fresh schedule at the recipe's
rate), and judges the RM after every round as ``strata bench rm`` judges it: on the fresh split's
Level-1 and Level-2 answers against the oracle, the Level-1 gain over the built RM with a bootstrap
SE over prompts. Registers each continued RM (unpromoted) and writes the figures to ``--out``.

    STRATA_ZOO_PRESET=default .venv/bin/python scripts/rm_steps_curve.py --rounds 200,200
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from strata.config import StrataSettings
from strata_tools.rm.lifecycle import mean_rewards
from strata_tools.rm.onpolicy import onpolicy_figures, policy_answers
from strata_tools.rm.sources import level1_gain
from strata_tools.rm.strong import StrongOptions, train_strong


def main() -> int:
    from strata.models.loading import load_reward_model
    from strata_tools.rm.recipe import student_init_dir
    from strata_tools.zoo.build import ZooOnDemand, ensure_zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", default="200,200", help="steps of each round, comma-separated")
    parser.add_argument("--out", type=Path, default=Path("rm-steps-curve.json"))
    args = parser.parse_args()
    rounds = [int(n) for n in args.rounds.split(",") if n.strip()]
    settings = StrataSettings()
    zoo = ensure_zoo(settings)
    config = zoo.config
    fresh = policy_answers(zoo, cache_dir=Path(settings.cache_dir).expanduser() / "rm" / "onpolicy")
    init = student_init_dir(zoo.rm_strong)
    if init is None:
        raise SystemExit(f"{zoo.rm_strong} has no student init (the strong RM before growth) to continue")
    print(f"zoo {zoo.root.name}: {len(fresh)} fresh answers; continuing {init}", flush=True)

    def judge(model_dir: str | Path, desc: str) -> list[float]:
        return mean_rewards([load_reward_model(model_dir, device="cpu")], [a.prompt for a in fresh],
                            [a.response for a in fresh], config.rm_max_length, desc)

    def row(steps: int, rewards: list[float], built: list[float] | None, seconds: float) -> dict[str, Any]:
        figures = onpolicy_figures(fresh, rewards)
        gain, se = (float("nan"), float("nan")) if built is None else level1_gain(rewards, built, fresh, 1000, 0)
        print(f"{steps:>5} steps  L1 {figures.spearman_level1:.3f}  L2 {figures.spearman_level2:.3f}  "
              f"bad AUC {figures.bad_auc:.3f}  pairs {figures.pair_accuracy:.3f}  L1 gain {gain:+.3f} ± {se:.3f}  "
              f"({seconds:.0f} s)", flush=True)
        return {"steps": steps, **asdict(figures), "level1_gain": gain, "level1_gain_se": se, "seconds": seconds}

    steps = config.rm_strong_train.steps
    built = judge(init, f"{steps} steps")
    rows = [row(steps, built, None, 0.0)]
    current = str(init)
    for extra in rounds:
        started = time.time()
        result = train_strong(StrongOptions(
            init=current, n_bins=config.rm_n_bins, steps=extra, lr=config.rm_strong_train.lr,
            groups_per_step=config.rm_strong_train.batch_size, match_pairs=0, max_length=config.rm_max_length,
            widen=1, grow_layers=0, pseudo_label=False, seed=steps, device="cpu"), settings, ZooOnDemand(settings),
            lambda line: None)
        steps += extra
        current = str(result.entry.path)
        rows.append(row(steps, judge(current, f"{steps} steps"), built, time.time() - started))
    args.out.write_text(json.dumps({"zoo": zoo.root.name, "rows": rows}, indent=2))
    print(f"figures: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
