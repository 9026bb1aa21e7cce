import argparse
import re

import pytest

from strata_tools.bench import annotators

LAST_LINE = re.compile(r"annotators drift_detected=(\d+)/(\d+) false_alarms=(\d+) detection_delay=(\d+|nan)")


def test_small_pool_flags_the_drifting_annotator(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    annotators.add_arguments(parser)
    # A step drift from item 100 (instead of the seed's ramp) keeps the pool small and the run short.
    args = parser.parse_args(["--trials", "4", "--annotators", "3", "--items", "400", "--drift-from", "100",
                              "--drift-items", "1", "--gold-share", "0.2"])
    assert annotators.run(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    match = LAST_LINE.fullmatch(out[-1])
    assert match, out[-1]
    detected, trials, false_alarms, delay = match.groups()
    assert int(trials) == 4 and int(detected) >= 3
    assert int(false_alarms) <= 1
    assert delay != "nan" and 0 <= int(delay) < 300
    assert any(line.startswith("baseline: window |bias| > 0.3") for line in out)


def test_late_drift_starts_at_its_item() -> None:
    annotator = annotators.LateDriftAnnotator(drift_from=10, drift=0.4, drift_items=4)
    biases = []
    for n in (0, 10, 12, 14, 100):
        annotator.n_seen = n
        biases.append(annotator.current_bias())
    assert biases == pytest.approx([0.0, 0.0, 0.2, 0.4, 0.4])
