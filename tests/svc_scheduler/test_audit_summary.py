"""The skip audit's summary: its error, its precision and the error's 95 % interval (pure)."""

from __future__ import annotations

import math

import pytest

from svc_scheduler.store import mean_ci95, summarise_audits


def test_the_audit_summary_gives_the_error_with_its_interval() -> None:
    # (reused, fresh count, fresh sum): errors 0.2, 1.0, 0.0; the unscored audit counts, not its error.
    summary = summarise_audits([(4.0, 2, 7.6), (4.0, 1, 3.0), (3.0, 4, 12.0), (2.0, 0, 0.0)], tolerance=0.5)
    assert (summary.audits, summary.scored) == (4, 3)
    assert summary.reuse_mae == pytest.approx(0.4)
    assert summary.precision == pytest.approx(2 / 3)
    sd = math.sqrt(((0.2 - 0.4) ** 2 + (1.0 - 0.4) ** 2 + 0.4 ** 2) / 2)
    assert summary.reuse_mae_ci95 == pytest.approx(1.96 * sd / math.sqrt(3))
    assert "0.400 ± " in summary.describe()


def test_one_scored_audit_has_no_interval() -> None:
    assert mean_ci95([0.3]) is None and mean_ci95([]) is None
    summary = summarise_audits([(4.0, 1, 3.5)], tolerance=0.5)
    assert summary.reuse_mae_ci95 is None and "±" not in summary.describe()
