"""The skip audit's summary: its error, its precision and the error's 95 % interval (pure)."""

from __future__ import annotations

import math

import pytest

from svc_scheduler.store import mean_ci95, summarise_audits


def test_the_audit_summary_gives_the_error_with_its_interval() -> None:
    # (prompt, reused, fresh count, fresh sum): errors 0.2, 1.0, 0.0 on three prompts; the unscored audit
    # counts, not its error.
    summary = summarise_audits([("p", 4.0, 2, 7.6), ("q", 4.0, 1, 3.0), ("r", 3.0, 4, 12.0), ("s", 2.0, 0, 0.0)],
                               tolerance=0.5)
    assert (summary.audits, summary.scored) == (4, 3)
    assert summary.reuse_mae == pytest.approx(0.4)
    assert summary.precision == pytest.approx(2 / 3)
    # One audit per prompt: CR1's SE is the usual one (sum of squared residuals / n^2, times G / (G - 1)).
    sd = math.sqrt(((0.2 - 0.4) ** 2 + (1.0 - 0.4) ** 2 + 0.4 ** 2) / 2)
    assert summary.reuse_mae_ci95 == pytest.approx(1.96 * sd / math.sqrt(3))
    assert "0.400 ± " in summary.describe()


def test_audits_of_one_prompt_count_as_one_piece_of_evidence() -> None:
    # Errors 0.2, 0.2 (prompt p, audited twice) and 1.0 (q): mean 0.4667. Residuals summed per prompt:
    # p: 2 * (0.2 - 0.4667) = -0.5333, q: 0.5333; SE = sqrt(2 / 1 * (0.2844 + 0.2844)) / 3.
    records = [("p", 4.0, 1, 3.8), ("p", 4.0, 1, 3.8), ("q", 4.0, 1, 3.0)]
    summary = summarise_audits(records, tolerance=0.5)
    mean = 1.4 / 3
    se = math.sqrt(2 * 2 * (2 * (0.2 - mean)) ** 2) / 3
    assert summary.reuse_mae_ci95 == pytest.approx(1.96 * se)
    # Treated as three independent audits, the interval would be narrower than the clustered one.
    assert mean_ci95([0.2, 0.2, 1.0]) < summary.reuse_mae_ci95  # type: ignore[operator]
    # All audits of one prompt: no interval to give.
    assert summarise_audits(records[:2], tolerance=0.5).reuse_mae_ci95 is None


def test_one_scored_audit_has_no_interval() -> None:
    assert mean_ci95([0.3]) is None and mean_ci95([]) is None
    summary = summarise_audits([("p", 4.0, 1, 3.5)], tolerance=0.5)
    assert summary.reuse_mae_ci95 is None and "±" not in summary.describe()
