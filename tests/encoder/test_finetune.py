"""Fine-tuning the encoder for same reward: what it learns, what it writes, and how the scheduler serves it."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from strata.hashing import content_hash
from strata_tools.encoder.finetune import FinetuneConfig, _encode, _load, finetune_encoder, margin_loss
from strata_tools.encoder.pairs import ScoredPrompt, neighbour_pairs, pair_similarities
from strata_tools.task.suite import load_suite
from svc_scheduler.__main__ import with_card_thresholds
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.encoder import CARD_FILE, Encoder, read_card


def _history() -> list[ScoredPrompt]:
    """Every paraphrase of the intents of two subjects: one intent answered well (4.5), the others badly (1.0).

    Same subject, other intent reads alike to the off-the-shelf encoder; the reward says they differ.
    """
    by_subject: dict[str, list] = defaultdict(list)
    for record in load_suite():
        if not record.risk:
            by_subject[record.subject].append(record)
    subjects = sorted(s for s, rs in by_subject.items() if len({r.intent for r in rs}) >= 2)[:2]
    history = []
    for subject in subjects:
        good = sorted({r.intent for r in by_subject[subject]})[0]
        history += [ScoredPrompt(content_hash(r.text), r.text, 4.5 if r.intent == good else 1.0, 4,
                                 group=content_hash(r.text))  # held out alone: both subjects train
                    for r in by_subject[subject]]
    return history


def test_margin_loss_pulls_agreeing_pairs_up_and_pushes_the_rest_down() -> None:
    import torch

    agree = torch.tensor([True, False])
    assert float(margin_loss(torch.tensor([0.95, 0.4]), agree, 0.9, 0.5)) == 0.0
    assert float(margin_loss(torch.tensor([0.7, 0.4]), agree, 0.9, 0.5)) == pytest.approx(0.5 * 0.2 ** 2)
    assert float(margin_loss(torch.tensor([0.95, 0.8]), agree, 0.9, 0.5)) == pytest.approx(0.5 * 0.3 ** 2)


def test_fine_tuning_separates_what_the_rewards_separate_and_writes_a_card_the_scheduler_serves(
        tmp_path: Path) -> None:
    history = _history()
    config = FinetuneConfig(k=10, candidate_similarity=0.2, held_out_share=0.3, epochs=3, batch_size=16,
                            learning_rate=5e-5)
    lines: list[str] = []
    result = finetune_encoder(history, None, tmp_path, 0.75, config, lines.append)
    assert result.path.parent == tmp_path and result.encoder_name.startswith("all-MiniLM-L6-v2-samereward-")
    assert any("to train on" in line for line in lines) and len(result.losses) == 3

    # On every pair the scheduler would weigh, the fine-tuned space tells agreeing from disagreeing better.
    texts = [p.text for p in history]
    base, _, _ = _load(None)
    tuned, _, _ = _load(str(result.path))
    base_vectors = _encode(base, texts)
    pairs = neighbour_pairs(base_vectors, [p.mean for p in history], 10, 0.2, 0.5)
    agree = np.array([p.agree for p in pairs])
    assert agree.any() and (~agree).any()

    def gap(vectors: np.ndarray) -> float:
        sims = pair_similarities(vectors, pairs)
        return float(sims[agree].mean() - sims[~agree].mean())

    assert gap(_encode(tuned, texts)) > gap(base_vectors) + 0.1

    card = read_card(result.path)
    assert card["base"] == "all-MiniLM-L6-v2" and card["trained_on"]["pairs"] == result.train_pairs
    assert card["held_out"]["pairs"] == result.comparison.eval_pairs > 0
    chosen = result.comparison.tuned_floor
    if chosen is None:
        assert card["thresholds"] == {}
    else:  # the lowest floor at which the held-out pairs agree as often as the base's do at 0.75
        assert card["thresholds"] == {"min_similarity": round(chosen.floor, 4)}
        assert chosen.precision >= result.comparison.base_floor.precision

    encoder = Encoder(str(result.path), backend="torch")
    assert encoder.encoder_id == f"{result.encoder_name}/384" != Encoder(backend="torch").encoder_id
    assert encoder.card == card


def test_too_little_history_is_refused_with_what_to_do(tmp_path: Path) -> None:
    history = _history()[:4]
    with pytest.raises(ValueError, match="too few to fine-tune on"):
        finetune_encoder(history, None, tmp_path, 0.75, FinetuneConfig())
    agreeing = [dataclasses.replace(p, mean=3.0) for p in _history()]
    with pytest.raises(ValueError, match="training pairs agree: nothing to tell apart"):
        finetune_encoder(agreeing, None, tmp_path, 0.75, FinetuneConfig(batch_size=4, candidate_similarity=0.2))
    assert not any(tmp_path.iterdir())


def test_a_card_sets_the_thresholds_not_set_explicitly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRATA_MIN_SIMILARITY", raising=False)
    card = {"format": 1, "thresholds": {"min_similarity": 0.62}}
    assert with_card_thresholds(SchedulerSettings(), card).min_similarity == 0.62
    assert with_card_thresholds(SchedulerSettings(min_similarity=0.8), card).min_similarity == 0.8
    assert with_card_thresholds(SchedulerSettings(), {}).min_similarity == SchedulerSettings().min_similarity
    monkeypatch.setenv("STRATA_MIN_SIMILARITY", "0.7")  # the environment is explicit too
    assert with_card_thresholds(SchedulerSettings(), card).min_similarity == 0.7

    assert read_card(tmp_path) == {}
    (tmp_path / CARD_FILE).write_text(json.dumps({"thresholds": {"min_similarity": 3}}))
    with pytest.raises(ValueError, match=r"thresholds.min_similarity = 3: .* a cosine in \[-1, 1\]"):
        read_card(tmp_path)
    (tmp_path / CARD_FILE).write_text(json.dumps({"thresholds": {"k": 0.5}}))
    with pytest.raises(ValueError, match=r"thresholds\.k"):
        read_card(tmp_path)
    (tmp_path / CARD_FILE).write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        read_card(tmp_path)
    (tmp_path / CARD_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        read_card(tmp_path)
