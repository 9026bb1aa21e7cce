"""Load Hugging Face models from local paths: generators and probe (causal LMs), reward models.

The same functions load the zoo's tiny models and a user's own checkpoints: anything saved with
``save_pretrained`` (or a downloaded hub snapshot) works. Nothing is downloaded at run time: loading
always passes ``local_files_only=True``, so ``HF_HUB_OFFLINE=1`` holds whether it is set or not.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from strata.contract.ensemble import ensemble_members
from strata.errors import ServiceConfigError
from strata.models.ensemble import RewardEnsemble

logger = logging.getLogger(__name__)

ZOO_INFO_FILE = "strata_zoo.json"  # resolved build config stored next to every zoo model
_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


class ModelLoadError(ServiceConfigError):
    """A model path that cannot be loaded; the message says what to fix."""


@dataclass(frozen=True)
class LoadedModel:
    model: PreTrainedModel  # in eval mode, on ``device``
    tokenizer: PreTrainedTokenizerBase  # has a pad token
    device: torch.device
    path: Path
    zoo_info: dict[str, Any] | None  # contents of strata_zoo.json for zoo models, else None

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def params_on_disk(model_dir: str | Path) -> int:
    """Parameters stored in a directory's safetensors files, read from their headers (no weights loaded)."""
    from safetensors import safe_open

    total = 0
    for weights in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(weights), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                shape = handle.get_slice(name).get_shape()
                count = 1
                for dim in shape:
                    count *= dim
                total += count
    return total


def resolve_device(spec: str = "auto") -> torch.device:
    """``auto`` (first GPU if any, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        index = 0 if spec == "cuda" else spec.split(":", 1)[1]
        if not str(index).isdigit():
            raise ModelLoadError(f"bad device {spec!r}: use auto, cpu, cuda or cuda:N")
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {spec!r} requested but no CUDA GPU is visible; use cpu or auto")
        if int(index) >= torch.cuda.device_count():
            raise ModelLoadError(f"device {spec!r} requested but only {torch.cuda.device_count()} GPU(s) are visible")
        return torch.device(f"cuda:{index}")
    raise ModelLoadError(f"bad device {spec!r}: use auto, cpu, cuda or cuda:N")


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """``auto`` (float32 on CPU; bfloat16 on a GPU that supports it, else float16) or a dtype name."""
    spec = spec.strip().lower()
    if spec == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if spec not in _DTYPES:
        raise ModelLoadError(f"bad dtype {spec!r}: use auto or one of {', '.join(sorted(_DTYPES))}")
    return _DTYPES[spec]


def check_model_dir(path: str | Path) -> Path:
    """The model directory as a ``Path``, or a ``ModelLoadError`` saying why it is not one."""
    model_dir = Path(path).expanduser()
    if not model_dir.exists():
        looks_like_hub_id = re.fullmatch(r"[\w.-]+(/[\w.-]+)?", str(path)) is not None
        hint = (
            " (if that is a hub id: Strata never downloads at run time; download the model first and"
            " pass its local directory)"
            if looks_like_hub_id
            else ""
        )
        raise ModelLoadError(f"no model at {model_dir}: the path does not exist{hint}")
    if not model_dir.is_dir():
        raise ModelLoadError(f"no model at {model_dir}: expected a directory written by save_pretrained, got a file")
    if not (model_dir / "config.json").is_file():
        raise ModelLoadError(
            f"no model at {model_dir}: config.json is missing (expected a save_pretrained directory; "
            "build the zoo with `strata models build` or point to your own checkpoint)"
        )
    return model_dir


def _read_zoo_info(model_dir: Path) -> dict[str, Any] | None:
    info = model_dir / ZOO_INFO_FILE
    return json.loads(info.read_text()) if info.is_file() else None


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")


def _load_tokenizer(model_dir: Path, padding_side: str) -> PreTrainedTokenizerBase:
    if not any((model_dir / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelLoadError(
            f"no tokenizer in {model_dir}: save it next to the model (tokenizer.save_pretrained) so that "
            "the model's text format travels with it"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"no usable tokenizer in {model_dir}: {exc}") from exc
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(f"the tokenizer in {model_dir} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


# ``from_pretrained`` is not thread-safe: it builds the model under process-wide init state (meta
# device, skipped weight init), so two loads in one process at once can corrupt each other (a tied
# lm_head left on the meta device). Services load from background threads (weight sync, RM hot
# swap, behaviour policies), so every load in Strata goes through this lock.
_LOAD_LOCK = threading.RLock()


def from_pretrained(auto_class: Any, model_dir: str | Path, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(model_dir, local_files_only=True, **kwargs)``, one load at a time."""
    with _LOAD_LOCK:
        return auto_class.from_pretrained(model_dir, local_files_only=True, **kwargs)


def _load(auto_class: Any, kind: str, path: str | Path, device: str, dtype: str, padding_side: str) -> LoadedModel:
    model_dir = check_model_dir(path)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    tokenizer = _load_tokenizer(model_dir, padding_side)
    try:
        model = from_pretrained(auto_class, model_dir, dtype=torch_dtype)
    except ValueError as exc:  # config of a model type the auto class has no head for
        model_type = json.loads((model_dir / "config.json").read_text()).get("model_type", "unknown")
        raise ModelLoadError(
            f"{model_dir} holds a {model_type!r} model that cannot be loaded as a {kind}: {exc}"
        ) from exc
    except OSError as exc:  # missing or unreadable weights
        raise ModelLoadError(f"cannot read the weights in {model_dir}: {exc}") from exc
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id  # sequence classifiers need it for batches
    model.to(torch_device).eval()
    logger.info("loaded %s from %s on %s (%s)", kind, model_dir, torch_device, torch_dtype)
    return LoadedModel(model, tokenizer, torch_device, model_dir, _read_zoo_info(model_dir))


def load_causal_lm(path: str | Path, device: str = "auto", dtype: str = "auto") -> LoadedModel:
    """A generator or probe: any ``AutoModelForCausalLM`` checkpoint (left padding for generation)."""
    return _load(AutoModelForCausalLM, "causal LM", path, device, dtype, padding_side="left")


def load_reward_model(path: str | Path, device: str = "auto", dtype: str = "auto") -> LoadedModel:
    """A reward model: any ``AutoModelForSequenceClassification`` checkpoint (see ``strata.models.reward``),
    or an ensemble directory of them (``strata.contract.ensemble``), read as one model."""
    kind = "sequence-classification reward model"
    try:
        members = ensemble_members(Path(path).expanduser())
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    if members is not None:
        loaded = [_load(AutoModelForSequenceClassification, kind, m, device, dtype, padding_side="right")
                  for m in members]
        vocabularies = {json.dumps(m.tokenizer.get_vocab(), sort_keys=True) for m in loaded}
        if len(vocabularies) != 1:
            raise ModelLoadError(f"the members of the ensemble at {path} do not share a tokenizer")
        try:
            ensemble = RewardEnsemble([m.model for m in loaded])
        except ValueError as exc:
            raise ModelLoadError(f"the ensemble at {path}: {exc}") from None
        first = loaded[0]
        return LoadedModel(ensemble, first.tokenizer, first.device, Path(path).expanduser(),  # type: ignore[arg-type]
                           first.zoo_info)
    return _load(AutoModelForSequenceClassification, kind, path, device, dtype, padding_side="right")
