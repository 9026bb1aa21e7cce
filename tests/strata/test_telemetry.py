import io
import logging
import sys

import pytest

from strata.hashing import content_hash
from strata.telemetry import Sensitive, setup_logging

PROMPT = "What dose of ibuprofen is safe for my child?"


def test_sensitive_renders_as_hash_only() -> None:
    rendered = str(Sensitive(PROMPT))
    assert PROMPT not in rendered
    assert content_hash(PROMPT)[:12] in rendered


@pytest.mark.parametrize(
    ("debug_rollout", "level", "shows_text"),
    [
        (False, logging.INFO, False),
        (False, logging.DEBUG, False),
        (True, logging.INFO, False),
        (True, logging.DEBUG, True),
    ],
)
def test_text_reaches_logs_only_at_debug_in_debug_rollout_mode(
    capsys: pytest.CaptureFixture[str], debug_rollout: bool, level: int, shows_text: bool
) -> None:
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        setup_logging("DEBUG", debug_rollout=debug_rollout)
        logging.getLogger("strata.test").log(level, "rollout prompt=%s reward=%.2f", Sensitive(PROMPT), 3.5)
        err = capsys.readouterr().err
    finally:
        # The handler wrote to capsys' stream, which closes after the test: put pytest's back.
        setup_logging("INFO")
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    assert "reward=3.50" in err
    assert (PROMPT in err) is shows_text


def test_logging_follows_sys_stderr_after_it_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler set up while one stderr was current keeps working after that stream is closed and
    replaced (pytest does this per test; service threads log across tests)."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    first, second = io.StringIO(), io.StringIO()
    try:
        monkeypatch.setattr(sys, "stderr", first)
        setup_logging("INFO")
        logging.getLogger("strata.test").info("one")
        first.close()
        monkeypatch.setattr(sys, "stderr", second)
        monkeypatch.setattr(logging, "raiseExceptions", True)  # a write to a closed stream would be reported
        logging.getLogger("strata.test").info("two")
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    assert second.getvalue().rstrip().endswith("strata.test: two") and "one" not in second.getvalue()
