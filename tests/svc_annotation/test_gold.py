"""The desk's gold set: the packaged default (so the drift alarm works out of the box) or a deployment's own."""

from __future__ import annotations

from pathlib import Path

from strata_tools.task.gold import SCORE_RANGE, default_gold_path, gold_items, render
from svc_annotation.__main__ import DEFAULT_GOLD_PATH, gold_set
from svc_annotation.config import AnnotationSettings


def test_the_default_settings_load_the_packaged_gold_set_away_from_the_ends_of_the_scale() -> None:
    items = gold_set(AnnotationSettings())
    assert len(items) == 48
    assert len({item.prompt for item in items}) == 48  # one answer per prompt
    low, high = SCORE_RANGE
    assert all(low <= item.score <= high for item in items)
    assert {int(min(item.score, high - 1)) for item in items} == {1, 2, 3}  # the whole range is covered


def test_a_deployments_own_file_replaces_the_default_and_gold_share_zero_turns_gold_off(tmp_path: Path) -> None:
    own = tmp_path / "gold.jsonl"
    own.write_text('{"prompt": "What is 2 + 2?", "response": "4", "score": 5}\n')
    assert [item.response for item in gold_set(AnnotationSettings(gold_items_path=own))] == ["4"]
    assert gold_set(AnnotationSettings(gold_share=0.0)) == []


def test_the_packaged_file_is_what_the_generator_writes_today() -> None:
    # The suite, corpus or oracle changed: rerun `python -m strata_tools.task.gold` and commit the file.
    assert default_gold_path() == DEFAULT_GOLD_PATH
    assert DEFAULT_GOLD_PATH.read_text(encoding="utf-8") == render(gold_items())
