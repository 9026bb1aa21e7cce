"""The probe's directions head (issue 25): trained on a user's model by `strata probe train`, served by
svc_probe. Tiny random Llama / Qwen2 checkpoints (strata.models.tiny) keep the real code path on a CPU."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from strata.contract.directions import DIRECTION_NAMES
from strata.models.loading import load_causal_lm
from strata.models.probe_head import (
    HEAD_INFO,
    HEAD_WEIGHTS,
    DirectionsHead,
    HeadError,
    load_head,
    prompt_features,
    roc_auc,
    save_head,
)
from strata.models.prompts import PromptFormat
from strata.models.tiny import build_tiny_model
from strata_tools.cli.main import main
from strata_tools.zoo.build import ZooPaths
from svc_probe.__main__ import main as service_main
from svc_probe.__main__ import make_probe_fn
from svc_probe.config import ProbeSettings
from svc_probe.core import ProbeRules, ProbeSetupError, choose_method, probe

SUBJECTS = ("a linked list", "binary search", "my garden", "the budget", "a web server", "taxes", "sorting",
            "holiday photos", "a birthday cake", "the old car", "my dog", "an essay")
# The direction is in the words: "code" -> give_code, "steps" -> give_steps, "example" -> give_example.
TEMPLATES = {
    "give_code": ("Write code for {s}.", "Show me code to handle {s}.", "I need code for {s}, please."),
    "give_steps": ("List the steps for {s}.", "What are the steps to fix {s}?", "Give me steps about {s}."),
    "give_example": ("Show an example of {s}.", "Give me an example with {s}.", "One example of {s}, please."),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: build_tiny_model(arch, root / arch) for arch in ("llama", "qwen2")}


def write_rows(path: Path, rename: dict[str, str] | None = None) -> Path:
    rename = rename or {}
    rows = [{"prompt": t.format(s=s), "direction": rename.get(d, d), "risk": s == "taxes"}
            for d, templates in TEMPLATES.items() for t in templates for s in SUBJECTS]
    random.Random(0).shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train(model: Path, data: Path, out: Path, *extra: str) -> int:
    return main(["probe", "train", "--model", str(model), "--data", str(data), "--out", str(out), "--threads", "1",
                 "--device", "cpu", *extra])


def test_a_head_learns_the_direction_from_the_words_of_the_prompt(
        models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "probe"
    assert train(models["qwen2"], write_rows(tmp_path / "data.jsonl"), out, "--holdout", "0.25") == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    fields = dict(item.split("=") for item in summary.split()[1:])
    assert summary.startswith("probe-train ") and fields["directions"] == "3" and fields["examples"] == "108"
    assert float(fields["top1"]) >= 0.8  # chance: 1/3
    info = json.loads((out / HEAD_INFO).read_text())
    assert [d["name"] for d in info["directions"]] == ["give_code", "give_steps", "give_example"]
    assert info["directions"][0]["description"] == "give code"  # the canonical set's words
    assert info["hidden_size"] == 64 and info["pooling"] == "last_token" and info["prompt_format"] == "chat"
    assert info["metrics"]["held_out"]["examples"] == 27 and info["metrics"]["held_out"]["top1"] >= 0.8
    assert len(info["data"]["sha256"]) == 64 and info["created_at"]
    assert {"config.json", "model.safetensors", "tokenizer.json", HEAD_WEIGHTS} <= {p.name for p in out.iterdir()}

    # The service serves it with the head: one forward, the head's directions.
    probe_fn, lm = make_probe_fn(ProbeSettings(model=str(out), device="cpu", min_confidence=0.0))
    code, steps = probe_fn(["Write code for my garden.", "What are the steps to fix the budget?"])
    assert code.directions[0][0] == "give_code" and steps.directions[0][0] == "give_steps"
    assert len(code.directions) == 3 and abs(sum(s for _, s in code.directions) - 1) < 1e-5
    fmt = PromptFormat.of(lm.tokenizer)  # the ledger's tokens: the query's, chat template included
    assert code.tokens == len(fmt.encode([fmt.query_text("Write code for my garden.")])["input_ids"][0])


def test_a_custom_direction_set_flows_through_the_service(
        models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    custom = {"write_program": "write a program", "list_procedure": "list the procedure",
              "show_instance": "show an instance", "tell_story": "tell a story (not in the data)"}
    directions = tmp_path / "directions.json"
    directions.write_text(json.dumps(custom))
    data = write_rows(tmp_path / "data.jsonl", {"give_code": "write_program", "give_steps": "list_procedure",
                                                "give_example": "show_instance"})
    out = tmp_path / "probe"
    assert train(models["llama"], data, out, "--directions", str(directions)) == 0
    printed = capsys.readouterr().out
    assert "not in the data, left out of the head: tell_story" in printed
    info = json.loads((out / HEAD_INFO).read_text())
    assert info["directions"][0] == {"name": "write_program", "description": "write a program"}

    probe_fn, _ = make_probe_fn(ProbeSettings(model=str(out), device="cpu", top_k=2))
    [result] = probe_fn(["Write code for the old car."])
    assert result.directions[0][0] == "write_program" and len(result.directions) == 2
    assert {name for name, _ in result.directions} <= {"write_program", "list_procedure", "show_instance"}


def test_the_service_refuses_a_user_model_without_a_head_unless_asked_for_likelihood(
        models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bare = str(models["llama"])
    with pytest.raises(ProbeSetupError, match=r"strata probe train --model .*llama"):
        make_probe_fn(ProbeSettings(model=bare, device="cpu"))
    with pytest.raises(ProbeSetupError, match="has no probe head"):
        make_probe_fn(ProbeSettings(model=bare, device="cpu", probe_method="head"))
    # `python -m svc_probe`: exit 2 with the message; never starts serving (the guard would return 99).
    monkeypatch.setattr("strata.service.run_service", lambda parts: 99)
    assert service_main(["--model", bare, "--device", "cpu"]) == 2
    logged = capsys.readouterr().err
    assert "strata probe train" in logged and "--probe-method likelihood" in logged

    probe_fn, _ = make_probe_fn(ProbeSettings(model=bare, device="cpu", probe_method="likelihood"))
    [result] = probe_fn(["How do I sort a list?"])
    assert len(result.directions) == 3 and result.tokens > 0  # the canonical names, by likelihood


@pytest.mark.parametrize(("requested", "has_head", "zoo", "expected"), [
    ("auto", True, False, "head"), ("auto", True, True, "head"), ("auto", False, True, "likelihood"),
    ("head", True, True, "head"), ("likelihood", True, False, "likelihood"), ("likelihood", False, False, "likelihood"),
])
def test_choose_method(requested: str, has_head: bool, zoo: bool, expected: str) -> None:
    assert choose_method(requested, has_head, zoo, "/m") == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("requested", "zoo", "message"), [
    ("auto", False, "neither the zoo's probe nor a probe with a directions head"),
    ("head", True, "probe_method=head but /m has no probe head"),
])
def test_choose_method_refusals(requested: str, zoo: bool, message: str) -> None:
    with pytest.raises(ProbeSetupError, match=message) as caught:
        choose_method(requested, False, zoo, "/m")  # type: ignore[arg-type]
    assert "`strata probe train --model /m --data PROMPTS.jsonl --out DIR`" in str(caught.value)


def _rows(*rows: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


GOOD = {"prompt": "Write code for x.", "direction": "give_code"}
OTHER = {"prompt": "List the steps for x.", "direction": "give_steps"}


@pytest.mark.parametrize(("data", "directions", "extra", "message"), [
    (None, None, (), "data.jsonl: no such file"),
    ("", None, (), "data.jsonl: no examples (the file is empty)"),
    (_rows(GOOD, "{not json"), None, (), "data.jsonl:2: not JSON"),
    (_rows(GOOD, OTHER, {"prompt": "p", "direction": "give_poem"}), None, (),
     "data.jsonl:3: unknown direction 'give_poem'; the canonical set"),
    (_rows(GOOD, {"prompt": "Write code for y.", "direction": "give_code"}), None, (),
     "every example has direction 'give_code'; a head needs examples of at least 2 directions"),
    (_rows(GOOD, {"prompt": "", "direction": "give_steps"}), None, (), 'data.jsonl:2: "prompt" must be a non-empty'),
    (_rows(GOOD, {"prompt": "p", "direction": "give_steps", "risk": "yes"}), None, (),
     'data.jsonl:2: "risk" must be true or false'),
    (_rows(GOOD, ["a list"]), None, (), "data.jsonl:2: expected an object"),
    (_rows(GOOD, OTHER), '["give_code"]', (), "directions.json: expected a JSON object {name: description}"),
    (_rows(GOOD, OTHER), '{"give_code": "code"}', (), "directions.json: name at least 2 directions, got 1"),
    (_rows(GOOD, OTHER), '{"give_code": "code", "Bad Name": "x"}', (), "bad direction name 'Bad Name'"),
    (_rows(GOOD, OTHER), '{"give_code": "code", "other": ""}', (), "direction 'other': the description must be"),
    (_rows(GOOD, OTHER), '{"give_code": "a", "give_code": "b", "x": "c"}', (), "'give_code' is given twice"),
    (_rows(GOOD, OTHER), '{"give_code": "code", "other": "o"}', (), "data.jsonl:2: unknown direction 'give_steps'; "),
    (_rows(GOOD, OTHER), None, ("--holdout", "1.5"), "--holdout must be in [0, 1), got 1.5"),
    (_rows(GOOD, OTHER), None, ("--holdout", "0.2"), "--holdout 0.2 holds out no example of 2"),
    (_rows(GOOD, OTHER), None, ("--epochs", "0"), "--epochs must be >= 1, got 0"),
])
def test_train_errors_name_what_to_fix_and_write_nothing(
        models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], data: str | None,
        directions: str | None, extra: tuple[str, ...], message: str) -> None:
    data_path = tmp_path / "data.jsonl"
    if data is not None:
        data_path.write_text(data)
    args = list(extra)
    if directions is not None:
        (tmp_path / "directions.json").write_text(directions)
        args += ["--directions", str(tmp_path / "directions.json")]
    out = tmp_path / "out" / "probe"
    assert train(models["qwen2"], data_path, out, *args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # no OUT, no staging


def test_train_refuses_a_non_empty_out_and_a_bad_model(
        models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_rows(tmp_path / "data.jsonl")
    out = tmp_path / "probe"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert train(models["qwen2"], data, out) == 2
    assert "--out" in capsys.readouterr().err and [p.name for p in out.iterdir()] == ["notes.txt"]
    assert train(tmp_path / "nowhere", data, tmp_path / "probe2") == 2
    assert "no model at" in capsys.readouterr().err and not (tmp_path / "probe2").exists()
    assert train(models["qwen2"], data, models["qwen2"], "--force") == 2  # never over the model itself
    assert "is the model directory itself" in capsys.readouterr().err

    assert train(models["qwen2"], data, out, "--force", "--epochs", "5") == 0  # --force replaces it whole
    assert not (out / "notes.txt").exists() and (out / HEAD_INFO).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "probe"]  # no staging left behind


def _head(directions: tuple[tuple[str, str], ...], hidden: int, seed: int = 0) -> DirectionsHead:
    g = torch.Generator().manual_seed(seed)
    d = len(directions)
    return DirectionsHead(directions, torch.randn(d, hidden, generator=g), torch.randn(d, generator=g),
                          torch.randn(1, hidden, generator=g), torch.randn(1, generator=g), {"note": "kept"})


def test_head_files_round_trip_and_a_wrong_model_is_refused(tmp_path: Path) -> None:
    head = _head((("write_poem", "write a poem"), ("give_code", "give code")), 16)
    save_head(head, tmp_path)
    loaded = load_head(tmp_path, 16)
    assert loaded.directions == head.directions and loaded.info["note"] == "kept"
    for a, b in ((loaded.direction_weight, head.direction_weight), (loaded.direction_bias, head.direction_bias),
                 (loaded.risk_weight, head.risk_weight), (loaded.risk_bias, head.risk_bias)):
        assert torch.equal(a, b)
    with pytest.raises(HeadError, match="hidden states of size 16, but the model there has hidden size 64"):
        load_head(tmp_path, 64)
    # A weights file of another shape than its json says.
    save_head(_head((("a", "a"), ("b", "b"), ("c", "c")), 16), tmp_path)
    info = json.loads((tmp_path / HEAD_INFO).read_text())
    info["directions"] = info["directions"][:2]
    (tmp_path / HEAD_INFO).write_text(json.dumps(info))
    with pytest.raises(HeadError, match=r"directions.weight has shape \(3, 16\), expected \(2, 16\)"):
        load_head(tmp_path, 16)
    (tmp_path / HEAD_WEIGHTS).unlink()
    with pytest.raises(HeadError, match="half a probe head"):
        load_head(tmp_path, 16)


def test_a_head_of_another_model_stops_the_service_with_exit_2(
        models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    probe_dir = tmp_path / "probe"
    shutil.copytree(models["qwen2"], probe_dir)
    save_head(_head((("give_code", "code"), ("give_steps", "steps")), 32), probe_dir)
    monkeypatch.setattr("strata.service.run_service", lambda parts: 99)
    assert service_main(["--model", str(probe_dir), "--device", "cpu"]) == 2
    logged = capsys.readouterr().err
    assert "hidden size 64" in logged and "strata probe train" in logged


def test_left_and_right_padding_give_the_same_features(models: dict[str, Path]) -> None:
    lm = load_causal_lm(models["llama"], device="cpu")  # no pad token: pads with EOS, as users do with Llama
    prompts = ["hi", "Write code to sort a list, please, and explain every line of it.", "Give me the steps"]
    left, left_tokens = prompt_features(lm, prompts, 128, padding_side="left")
    right, right_tokens = prompt_features(lm, prompts, 128, padding_side="right")
    alone = torch.cat([prompt_features(lm, [p], 128)[0] for p in prompts])
    assert left_tokens == right_tokens and len(set(left_tokens)) == 3
    torch.testing.assert_close(left, right, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(left, alone, atol=1e-5, rtol=1e-5)
    # A query over the limit keeps its end: the generation prompt the head reads is still there.
    cut, cut_tokens = prompt_features(lm, prompts[1:2], 8)
    assert cut_tokens == [8] and cut.shape == (1, 64)


def test_probe_with_a_head_applies_the_rules(models: dict[str, Path]) -> None:
    lm = load_causal_lm(models["qwen2"], device="cpu")
    hidden = lm.model.config.hidden_size
    zeros = torch.zeros
    # Zero weights: the biases alone decide. softmax([2, 0, 0]) = (0.787, 0.107, 0.107); sigmoid(3) = 0.953.
    head = DirectionsHead((("write_poem", "p"), ("give_code", "c"), ("tell_joke", "j")), zeros(3, hidden),
                          torch.tensor([2.0, 0.0, 0.0]), zeros(1, hidden), torch.tensor([3.0]))
    rules = ProbeRules(top_k=2, min_confidence=0.8, risk_threshold=0.5, risk_keywords=("dose",))
    first, second = probe(lm, ["What dose is safe?", "Write a poem"], rules, head=head)
    assert [n for n, _ in first.directions] == ["write_poem", "give_code"]
    assert first.confidence == pytest.approx(0.7870, abs=1e-4) and first.risk == pytest.approx(0.9526, abs=1e-4)
    assert first.caution_reason == "risk topic (p=0.95); risk keyword 'dose'; low confidence (0.79 < 0.8)"
    assert second.caution_reason == "risk topic (p=0.95); low confidence (0.79 < 0.8)"
    assert first.tokens > second.tokens > 0
    assert probe(lm, [], rules, head=head) == []


def test_roc_auc_by_hand() -> None:
    assert roc_auc([0.9, 0.8, 0.1], [True, False, False]) == 1.0
    assert roc_auc([0.5, 0.5], [True, False]) == 0.5
    assert roc_auc([0.2, 0.9, 0.4, 0.3], [True, False, True, False]) == 0.25
    assert roc_auc([0.1], [True]) is None


def test_a_failure_while_writing_leaves_no_half_written_out(
        models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(head: DirectionsHead, directory: Path) -> None:
        (Path(directory) / HEAD_WEIGHTS).write_bytes(b"half")
        raise OSError("No space left on device")

    monkeypatch.setattr("strata.models.probe_head.save_head", disk_full)
    data = write_rows(tmp_path / "data.jsonl")
    with pytest.raises(OSError, match="No space left"):
        train(models["qwen2"], data, tmp_path / "probe", "--epochs", "5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl"]


def test_the_zoo_probe_without_a_head_keeps_the_likelihood_method(zoo: ZooPaths) -> None:
    probe_fn, lm = make_probe_fn(ProbeSettings(model=str(zoo.probe), device="cpu"))
    assert lm.zoo_info is not None
    [result] = probe_fn(["Write a Python function to reverse a linked list."])
    assert len(result.directions) == 3 and {n for n, _ in result.directions} <= set(DIRECTION_NAMES)
