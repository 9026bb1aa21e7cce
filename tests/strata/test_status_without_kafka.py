"""`strata status` with nothing running and Kafka and Redis unreachable: the table, one line naming the broker
and the error for the unknown lag, one naming Redis for the live audit, and none of kafka-python's
per-connection log lines."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from strata_tools.cli import stack_cmd
from strata_tools.infra.process import free_port


def test_status_names_the_unreachable_broker_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
                                                  ) -> None:
    port = free_port()  # nothing listens on it
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", f"127.0.0.1:{port}")
    monkeypatch.setenv("STRATA_STATE_DIR", str(tmp_path))
    redis_port = free_port(avoid={port})
    monkeypatch.setenv("STRATA_REDIS_URL", f"redis://127.0.0.1:{redis_port}/0")
    with caplog.at_level(logging.DEBUG, logger="kafka"):
        assert stack_cmd._status(argparse.Namespace()) == 1  # no service is healthy
        assert logging.getLogger("kafka").level == logging.DEBUG  # the level set before is back
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["service", "pid", "port", "state", "health", "restarts", "hung", "lag"]
    [lag] = [line for line in out if line.startswith("lag:")]
    assert lag.startswith(f"lag: unknown: reading consumer offsets from Kafka at 127.0.0.1:{port} failed (")
    assert "Error" in lag  # the exception's name, not a guess at the cause
    assert out[-1].startswith(f"live audit: Redis at redis://127.0.0.1:{redis_port}/0 did not answer")
    assert not [r for r in caplog.records if r.name.startswith("kafka")]
