"""More on-policy labels for a strong-RM member the light RM's data does not hold (issue 61, item 1)

Writes the zoo's RM data (``rm_data/pairs.jsonl``) plus, for ``--prompts`` train-split prompts drawn with
``--seed``, one answer each from ``--tiers`` (Level-1 and Level-2), prompted and sampled as live
(``strata_tools.rm.onpolicy.sample_policy_answers``) with other seeds than the build's, and a near miss of
each (``strata_tools.rm.augment``), every added answer labelled by the oracle and placed in its prompt's
group. ``strata rm train-strong --data`` trains a member on the result; ``scripts/rm_second_opinion.py
--member`` judges it on the sealed test split:

    STRATA_ZOO_PRESET=default .venv/bin/python scripts/rm_more_labels.py --out /tmp/more.jsonl
    STRATA_ZOO_PRESET=default .venv/bin/strata rm train-strong --data /tmp/more.jsonl --widen 1 --seed 1 \\
        --out /tmp/member-more --no-register --no-pseudo-label
    STRATA_ZOO_PRESET=default .venv/bin/python scripts/rm_second_opinion.py --member /tmp/member-more
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

from strata_tools.rm.onpolicy import sample_policy_answers
from strata_tools.rm.rows import near_miss_rows, pair_row
from strata_tools.task.suite import load_suite
from strata_tools.zoo.build import ZooSettings, zoo_paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the JSONL to write (zoo rows + added rows)")
    parser.add_argument("--prompts", type=int, default=1200, help="train-split prompts to answer (default 1200)")
    parser.add_argument("--seed", type=int, default=7, help="draws the prompts; the answers' seeds follow from it")
    parser.add_argument("--tiers", default="level1,level2", help="whose answers to add (default level1,level2)")
    parser.add_argument("--no-base", action="store_true", help="write the added rows only, not the zoo's")
    args = parser.parse_args()

    zoo = zoo_paths(ZooSettings())  # reads the built LMs and RM data; builds nothing
    if not (Path(zoo.level1).is_dir() and Path(zoo.probe).is_dir()):
        print(f"the zoo at {zoo.root} has no probe or Level-1 yet: build it first (strata models build)",
              file=sys.stderr)
        return 2
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    if not tiers or set(tiers) - {"level1", "level2"}:
        print(f"--tiers takes level1 and/or level2, got {args.tiers!r}", file=sys.stderr)
        return 2
    train = load_suite("train")
    if not 0 < args.prompts <= len(train):
        print(f"--prompts must be in 1..{len(train)} (the train split), got {args.prompts}", file=sys.stderr)
        return 2
    records = random.Random(args.seed).sample(train, args.prompts)
    by_id = {r.id: r for r in records}
    answers = {tier: sample_policy_answers(zoo.probe, {tier: Path(zoo.level1 if tier == "level1" else zoo.level2)},
                                           records, 1000 * args.seed + offset)
               for offset, tier in enumerate(tiers)}
    # A build may still be writing the RM data (its stage directory ends in .partial): the groups come from it.
    while not Path(zoo.rm_data).is_file() and Path(str(Path(zoo.rm_data).parent) + ".partial").is_dir():
        time.sleep(10)
    if not Path(zoo.rm_data).is_file():
        print(f"no RM data at {zoo.rm_data}: build the zoo first (strata models build)", file=sys.stderr)
        return 2
    base = [json.loads(line) for line in Path(zoo.rm_data).read_text(encoding="utf-8").splitlines()]
    group_of = {row["prompt_id"]: row["group"] for row in base}
    next_group = max(group_of.values(), default=-1) + 1
    added: list[dict] = []
    for offset, tier in enumerate(tiers):
        samples = []
        for answer in answers[tier]:
            if answer.prompt_id not in group_of:
                group_of[answer.prompt_id], next_group = next_group, next_group + 1
            samples.append(pair_row(by_id[answer.prompt_id], answer.response, f"more:{tier}",
                                    group_of[answer.prompt_id]))
        added += samples
        added += near_miss_rows([dict(row, kind=f"sample:{tier}") for row in samples], by_id, args.seed + offset)
        print(f"{tier}: {len(samples)} answers (of {len(records)} prompts; the probe is cautious about the rest)",
              file=sys.stderr)
    rows = added if args.no_base else base + added
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    kinds = Counter(row["kind"] for row in added)
    mean = sum(row["score"] for row in added) / max(len(added), 1)
    print(f"wrote {len(rows)} rows to {args.out}: {len(base) if not args.no_base else 0} of the zoo's, "
          f"{len(added)} added ({dict(kinds)}; mean oracle {mean:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
