"""The annotation desk's default gold set (R18): what lets the drift alarm work out of the box.

Gold items are answers with a known score, mixed into each annotator's stream; only their residuals
raise the drift alarm (docs/annotation.md). svc_annotation ships this set as
``svc_annotation/data/gold.jsonl`` and uses it unless ``gold_items_path`` names a deployment's own.
Each item is a suite prompt of the eval split (never trained on) with its reference answer, degraded
one or two ways or not, scored by the oracle; only scores in [1, 4] are kept, because an annotator
cannot score a gold 5 higher or a gold 0 lower, which would hide a drift that way. The set is spread
over the score range and the topics.

The file is generated, not edited: ``python -m strata_tools.task.gold`` rewrites it, and a test fails when
the suite, the corpus or the oracle changed what it would hold.
"""

from __future__ import annotations

import argparse
import json
import random
from importlib import resources
from pathlib import Path

from strata_tools.task.corpus import rm_pairs
from strata_tools.task.oracle import oracle_score
from strata_tools.task.suite import load_suite

N_ITEMS = 48
SEED = 0
SCORE_RANGE = (1.0, 4.0)  # away from the ends of the 0-5 scale, so a drift either way shows


def default_gold_path() -> Path:
    """Where svc_annotation's packaged default gold set lives."""
    return Path(str(resources.files("svc_annotation") / "data" / "gold.jsonl"))


def gold_items(n: int = N_ITEMS, seed: int = SEED) -> list[dict[str, object]]:
    """``n`` gold items (``{"prompt", "response", "score"}``), evenly over the score bands in
    ``SCORE_RANGE``, each from another eval prompt; seeded, so the file is reproducible."""
    records = load_suite("eval")
    pairs = rm_pairs(records, 2, seed)
    low, high = SCORE_RANGE
    bands: dict[int, list[dict[str, object]]] = {}
    for pair in pairs:
        score = oracle_score(pair.record, pair.response)
        if low <= score <= high:
            band = min(int(score), int(high) - 1)  # [1, 2), [2, 3), [3, 4]
            bands.setdefault(band, []).append({"prompt": pair.record.text, "response": pair.response,
                                               "score": round(score, 3), "id": pair.record.id})
    rng = random.Random(seed)
    for band in bands.values():
        rng.shuffle(band)
    chosen: list[dict[str, object]] = []
    used: set[object] = set()
    while len(chosen) < n and any(bands.values()):
        for key in sorted(bands):  # one per band in turn: the set covers the whole range
            while bands[key] and bands[key][-1]["id"] in used:
                bands[key].pop()
            if bands[key] and len(chosen) < n:
                item = bands[key].pop()
                used.add(item["id"])
                chosen.append({k: v for k, v in item.items() if k != "id"})
    return chosen


def render(items: list[dict[str, object]]) -> str:
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="rewrite svc_annotation's default gold set")
    parser.add_argument("--out", type=Path, default=None, help="file to write (default: the packaged one)")
    args = parser.parse_args(argv)
    out = args.out or default_gold_path()
    items = gold_items()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(items), encoding="utf-8")
    print(f"wrote {len(items)} gold items to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
