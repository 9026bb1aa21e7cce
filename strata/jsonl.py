"""Reading JSON Lines files a user gave (prompt files, RM pairs): errors name the file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from strata.errors import CliError


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) for each non-blank line of a JSONL file given on the command line; a
    missing file or a line that is not JSON is a ``CliError`` naming the file and the line."""
    if not path.is_file():
        raise CliError(f"{path}: no such file")
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise CliError(f"{path}:{number}: not JSON ({exc.msg})") from exc
