import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from strata.config import StrataSettings


def test_defaults_manage_local_infra(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("STRATA_KAFKA_BOOTSTRAP", "STRATA_REDIS_URL", "STRATA_KAFKA_PORT", "STRATA_REDIS_PORT",
                "STRATA_REDIS_USERNAME", "STRATA_REDIS_PASSWORD"):
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


def _without_security_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # `make test-auth` sets some of these; the cases here spell out their own.
    for name in StrataSettings.model_fields:
        if name.startswith(("kafka_", "redis_")):
            monkeypatch.delenv(f"STRATA_{name.upper()}", raising=False)


def test_log_dict_and_repr_mask_secret_fields() -> None:
    settings = StrataSettings(kafka_bootstrap="k:9093", kafka_security_protocol="SASL_SSL",
                              kafka_sasl_username="svc", kafka_sasl_password="kafka-s3cret",
                              redis_username="app", redis_password="redis-s3cret", grpc_token="grpc-s3cret")
    logged = settings.as_log_dict()
    assert logged["kafka_sasl_password"] == logged["redis_password"] == logged["grpc_token"] == "***"
    assert logged["kafka_sasl_username"] == "svc"
    for text in (json.dumps(logged), repr(settings), str(settings)):
        assert "s3cret" not in text


def test_managed_redis_address_carries_quoted_credentials_and_masks_them(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_security_env(monkeypatch)
    settings = StrataSettings(redis_port=6390, redis_username="app", redis_password="p@ss:w/rd")
    assert settings.redis_address == "redis://app:p%40ss%3Aw%2Frd@127.0.0.1:6390/0"
    assert settings.redis_address_masked == "redis://app:***@127.0.0.1:6390/0"
    assert settings.redis_auth
    password_only = StrataSettings(redis_port=6390, redis_password="pw")
    assert password_only.redis_address == "redis://:pw@127.0.0.1:6390/0"
    assert password_only.redis_address_masked == "redis://:***@127.0.0.1:6390/0"
    # An external Redis: its URL says everything, the redis_* credentials are for the managed one.
    external = StrataSettings(redis_url="rediss://u:pw@cache:6380/0?ssl_ca_certs=/ca.pem", redis_password="x")
    assert external.redis_address == "rediss://u:pw@cache:6380/0?ssl_ca_certs=/ca.pem"
    assert external.redis_auth and not StrataSettings(redis_url="redis://cache:6379/0").redis_auth


@pytest.mark.parametrize(("fields", "error"), [
    ({"kafka_security_protocol": "SASL_PLAINTEXT"}, "needs kafka_sasl_username and kafka_sasl_password"),
    ({"kafka_sasl_username": "u", "kafka_sasl_password": "p"}, "set it to SASL_PLAINTEXT"),
    ({"kafka_bootstrap": "k:9093", "kafka_ssl_cafile": "/ca.pem"}, "need kafka_security_protocol SSL or SASL_SSL"),
    ({"kafka_bootstrap": "k:9093", "kafka_security_protocol": "SSL", "kafka_ssl_certfile": "/c.pem"},
     "kafka_ssl_certfile and kafka_ssl_keyfile go together"),
    ({"kafka_security_protocol": "SSL"}, "the local broker of `strata infra up` speaks PLAINTEXT or SASL_PLAINTEXT"),
    ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "SCRAM-SHA-256",
      "kafka_sasl_username": "u", "kafka_sasl_password": "p"}, "does SASL/PLAIN only"),
    ({"redis_username": "app"}, "redis_username needs redis_password"),
    ({"kafka_security_protocol": "SASL_GSSAPI"}, "kafka_security_protocol"),
])
def test_security_settings_that_cannot_work_are_refused(fields: dict, error: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _without_security_env(monkeypatch)
    with pytest.raises(ValidationError, match=re.escape(error)):
        StrataSettings(**fields)


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
