"""Does a strong RM of several members know more than the light RM? (issue 61, item 1)

Scores the policy's own answers to the sealed test split (the set `strata bench rm` reads) with the
zoo's light RM, its strong RM, the strong RM before growth (``student_init``, member 0) and every
``--member`` directory (strong RMs trained by ``strata rm train-strong --widen 1 --seed N``), then
prints each RM's Level-1 Spearman and bad-case AUC against the oracle, and the ensemble's (members'
mean reward) differences with 95 % intervals from a paired bootstrap over paraphrase families.

    STRATA_ZOO_PRESET=default strata rm train-strong --widen 1 --seed 1 --out /tmp/m1 --no-register \\
        --no-pseudo-label
    STRATA_ZOO_PRESET=default .venv/bin/python scripts/rm_second_opinion.py --member /tmp/m1

``--strong`` and ``--light`` compare another pair: an ensemble directory (``strata rm ensemble``) and the
light RM distilled from it (``strata rm distill --strong``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from strata_tools.intervals import cluster_bootstraps
from strata_tools.rm.lifecycle import mean_rewards
from strata_tools.rm.onpolicy import onpolicy_figures, policy_answers


def main() -> int:
    from strata.models.loading import load_reward_model
    from strata_tools.zoo.build import ZooSettings, ensure_zoo

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--member", action="append", default=[], help="another strong-RM member's directory")
    parser.add_argument("--light", type=Path, default=None, help="the light RM to compare (default: the zoo's)")
    parser.add_argument("--strong", type=Path, default=None, help="the strong RM to compare, one directory or an "
                        "ensemble (`strata rm ensemble`; default: the zoo's)")
    parser.add_argument("--split", default="test", choices=("test", "fresh", "eval"))
    parser.add_argument("--draws", type=int, default=1000)
    args = parser.parse_args()

    settings = ZooSettings()
    zoo = ensure_zoo(settings, progress=False)
    answers = policy_answers(zoo, args.split, cache_dir=Path(settings.cache_dir).expanduser() / "rm" / "onpolicy")
    prompts, texts = [a.prompt for a in answers], [a.response for a in answers]
    dirs = {"light": args.light or Path(zoo.rm_light), "strong": args.strong or Path(zoo.rm_strong),
            "member 0": Path(zoo.rm_strong) / "student_init"}
    dirs |= {f"member {i}": Path(d) for i, d in enumerate(args.member, start=1)}
    rewards = {name: mean_rewards([load_reward_model(d, device="cpu")], prompts, texts, zoo.config.rm_max_length,
                                  name, 1.0) for name, d in dirs.items()}
    members = [n for n in rewards if n.startswith("member")]
    rewards["ensemble"] = [sum(rewards[m][i] for m in members) / len(members) for i in range(len(answers))]
    for name, values in rewards.items():
        f = onpolicy_figures(answers, values)
        print(f"{name:10s} L1 spearman {f.spearman_level1:.3f}  L2 spearman {f.spearman_level2:.3f}  "
              f"bad AUC {f.bad_auc:.3f}  pair acc {f.pair_accuracy:.3f}  ({f.n_level1} Level-1 answers, {f.n_bad} bad)")
    families = [a.prompt_id.rsplit("#", 1)[0] for a in answers]

    def difference(a: str, b: str) -> None:
        def values(idx: Sequence[int]) -> tuple[float, float]:
            fa = onpolicy_figures([answers[i] for i in idx], [rewards[a][i] for i in idx])
            fb = onpolicy_figures([answers[i] for i in idx], [rewards[b][i] for i in idx])
            return fa.spearman_level1 - fb.spearman_level1, fa.bad_auc - fb.bad_auc

        spearman, auc = cluster_bootstraps(values, families, 0, args.draws)
        print(f"{a} - {b}: L1 spearman {spearman}; bad AUC {auc} (95 %, {len(set(families))} families)")

    difference("ensemble", "light")
    difference("ensemble", "member 0")
    difference("strong", "light")
    for i in range(1, len(args.member) + 1):
        difference(f"member {i}", "member 0")
        difference(f"member {i}", "light")
        difference("ensemble", f"member {i}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
