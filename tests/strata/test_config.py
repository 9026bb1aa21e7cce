from pathlib import Path

import pytest
from pydantic import ValidationError

from strata.config import StrataSettings


def test_defaults_manage_local_infra(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("STRATA_KAFKA_BOOTSTRAP", "STRATA_REDIS_URL", "STRATA_KAFKA_PORT", "STRATA_REDIS_PORT"):
        monkeypatch.delenv(var, raising=False)
    settings = StrataSettings()
    assert settings.kafka_managed and settings.redis_managed
    assert settings.kafka_address == "127.0.0.1:19092"
    assert settings.redis_address == "redis://127.0.0.1:16379/0"


def test_env_points_at_existing_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", "kafka-1:9092,kafka-2:9092")
    monkeypatch.setenv("STRATA_REDIS_URL", "redis://cache:6379/2")
    settings = StrataSettings()
    assert not settings.kafka_managed and not settings.redis_managed
    assert settings.kafka_address == "kafka-1:9092,kafka-2:9092"
    assert settings.redis_address == "redis://cache:6379/2"


def test_flags_win_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_TOPIC_PARTITIONS", "12")
    assert StrataSettings().topic_partitions == 12
    assert StrataSettings(topic_partitions=3).topic_partitions == 3


def test_bad_values_name_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_KAFKA_PORT", "99999")
    with pytest.raises(ValidationError, match="kafka_port"):
        StrataSettings()


def test_settings_are_frozen_and_loggable() -> None:
    settings = StrataSettings(state_dir=Path("/tmp/x"))
    with pytest.raises(ValidationError):
        settings.topic_partitions = 1  # type: ignore[misc]
    assert settings.as_log_dict()["state_dir"] == "/tmp/x"


def test_log_dict_masks_url_passwords() -> None:
    settings = StrataSettings(redis_url="redis://user:s3cret@cache:6379/0", kafka_bootstrap="k:9092")
    logged = settings.as_log_dict()
    assert logged["redis_url"] == "redis://user:***@cache:6379/0"
    assert "s3cret" not in str(logged)
    assert logged["kafka_bootstrap"] == "k:9092"


def test_bad_flags_and_env_end_as_one_line_each_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from strata.config import add_settings_flags, parse_settings

    parser = argparse.ArgumentParser(prog="svc")
    add_settings_flags(parser, StrataSettings)
    monkeypatch.setenv("STRATA_KAFKA_PORT", "99999")
    with pytest.raises(SystemExit) as exited:
        parse_settings(parser, StrataSettings, ["--topic-partitions", "0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage: svc" in err and "Traceback" not in err
    assert "--topic-partitions (env STRATA_TOPIC_PARTITIONS) = 0: Input should be greater than or equal to 1" in err
    assert "STRATA_KAFKA_PORT (flag --kafka-port) = '99999'" in err  # from the environment: named as such

    monkeypatch.delenv("STRATA_KAFKA_PORT")
    settings, args = parse_settings(parser, StrataSettings, ["--topic-partitions", "4"])
    assert settings.topic_partitions == 4 and args.topic_partitions == 4
