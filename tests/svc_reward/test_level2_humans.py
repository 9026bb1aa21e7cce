"""Level-2 has its human in it wherever the desk has annotators (R3): the reward service resolves
``await_annotation`` at start from the desk's tokens file and says which way, once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from strata.errors import ServiceConfigError
from strata.rpc_auth import token_line
from svc_reward.config import RewardSettings


@pytest.fixture(autouse=True)
def _no_tokens_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("STRATA_GRPC_TOKENS_FILE", "STRATA_ANNOTATORS_FILE", "STRATA_AWAIT_ANNOTATION",
                 "STRATA_ANNOTATE_LEVEL2"):
        monkeypatch.delenv(name, raising=False)


def tokens_file(path: Path, *names: str) -> Path:
    path.write_text("# the desk's clients\n" + "".join(token_line(n, f"token-of-{n}-0123456789") + "\n"
                                                        for n in names))
    return path


def test_without_annotators_level2_runs_without_humans() -> None:
    awaiting, why = RewardSettings().level2_humans()
    assert not awaiting
    assert why.startswith("Level-2 runs without humans") and "STRATA_ANNOTATORS_FILE" in why


def test_a_desk_with_annotators_makes_level2_await_their_scores(tmp_path: Path) -> None:
    desk = tokens_file(tmp_path / "desk-tokens", "ana", "bo")
    awaiting, why = RewardSettings(annotators_file=desk).level2_humans()
    assert awaiting and f"2 annotator(s) named in {desk}" in why
    assert RewardSettings(annotators_file=desk).annotators() == ["ana", "bo"]
    # The services' own tokens file says nothing of a desk: a stack can check tokens with no desk running,
    # and Level-2 would wait for scores nobody gives.
    assert RewardSettings(grpc_tokens_file=desk).level2_humans()[0] is False


def test_an_explicit_setting_wins_and_no_annotation_means_no_humans(tmp_path: Path) -> None:
    desk = tokens_file(tmp_path / "desk-tokens", "ana")
    assert RewardSettings(annotators_file=desk, await_annotation=False).level2_humans()[0] is False
    awaiting, why = RewardSettings(await_annotation=True).level2_humans()
    assert awaiting and "await_annotation on" in why
    awaiting, why = RewardSettings(annotators_file=desk, annotate_level2=False).level2_humans()
    assert not awaiting and "annotate_level2 is off" in why
    # Told to await, unsafe Level-2 answers still wait for the desk with annotate_level2 off (decide).
    assert RewardSettings(await_annotation=True, annotate_level2=False).level2_humans()[0] is True


def test_an_unusable_desk_file_is_an_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "desk-tokens"
    bad.write_text("ana\n")
    with pytest.raises(ServiceConfigError, match=r"STRATA_ANNOTATORS_FILE.*desk-tokens:1"):
        RewardSettings(annotators_file=bad).level2_humans()
    with pytest.raises(ServiceConfigError, match="no clients"):
        RewardSettings(annotators_file=tokens_file(tmp_path / "empty")).level2_humans()
    with pytest.raises(ServiceConfigError, match="cannot read"):
        RewardSettings(annotators_file=tmp_path / "missing").level2_humans()


def test_the_service_says_it_once_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    import svc_reward.__main__ as main

    seen: list[RewardSettings] = []

    def stop_after_settings(settings: RewardSettings) -> tuple[list[str], str]:
        seen.append(settings)
        raise RuntimeError("stop: the test only needs the resolved settings")

    monkeypatch.setattr(main, "model_paths", stop_after_settings)
    with caplog.at_level(logging.INFO, logger="svc_reward.__main__"), pytest.raises(RuntimeError, match="stop"):
        main.build(RewardSettings())
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert caplog.records[0].getMessage().startswith("Level-2 runs without humans")
    assert seen[0].await_annotation is False
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="svc_reward.__main__"), pytest.raises(RuntimeError, match="stop"):
        main.build(RewardSettings(annotators_file=tokens_file(tmp_path / "desk", "ana")))
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert seen[1].await_annotation is True
