"""A service given its model path serves with an empty zoo cache, and never builds a zoo (issue 20)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from stackutil import spawn
from test_tiers import wait_for_log

from strata.config import StrataSettings


def _env(infra: StrataSettings, cache_dir: Path) -> dict[str, str]:
    return {**os.environ, "STRATA_KAFKA_BOOTSTRAP": infra.kafka_address, "STRATA_REDIS_URL": infra.redis_address,
            "STRATA_CACHE_DIR": str(cache_dir)}


def test_probe_with_an_explicit_model_serves_from_an_empty_cache(infra, zoo, tmp_path: Path) -> None:
    cache_dir = tmp_path / "empty-cache"
    cache_dir.mkdir()
    log = tmp_path / "probe.log"
    argv = [sys.executable, "-m", "svc_probe", "--model", str(zoo.probe), "--device", "cpu", "--grpc-port", "0",
            "--group-id", f"test-model-paths-{os.getpid()}"]
    process = spawn(argv, _env(infra, cache_dir), log)
    try:
        wait_for_log(log, "gRPC serving", process)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()[-2000:]
    finally:
        if process.poll() is None:
            process.kill()
    assert not (cache_dir / "zoo").exists(), "the service built or fetched a zoo"


def test_no_model_and_no_built_zoo_stops_at_once_naming_the_setting(infra, tmp_path: Path) -> None:
    cache_dir = tmp_path / "empty-cache"
    cache_dir.mkdir()
    argv = [sys.executable, "-m", "svc_probe", "--device", "cpu", "--grpc-port", "0"]
    done = subprocess.run(argv, env=_env(infra, cache_dir), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "set --model (STRATA_MODEL)" in done.stderr and "Traceback" not in done.stderr
    assert not (cache_dir / "zoo").exists()
