"""`strata status` with nothing running and Kafka unreachable: the table, one line naming the broker for the
unknown lag, and none of kafka-python's per-connection log lines."""

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
    with caplog.at_level(logging.DEBUG, logger="kafka"):
        assert stack_cmd._status(argparse.Namespace()) == 1  # no service is healthy
        assert logging.getLogger("kafka").level == logging.DEBUG  # the level set before is back
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["service", "pid", "port", "state", "health", "restarts", "hung", "lag"]
    assert out[-1].startswith(f"lag: unknown (Kafka at 127.0.0.1:{port} did not answer")
    assert not [r for r in caplog.records if r.name.startswith("kafka")]
