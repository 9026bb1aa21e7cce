"""Imports inside functions are few and each has a reason scripts/inner_imports.py can see."""

from __future__ import annotations

from pathlib import Path

import scriptutil


def load_script():
    return scriptutil.load_script("inner_imports")


def test_every_import_inside_a_function_has_a_reason_and_they_are_few() -> None:
    assert load_script().problems() == []


def test_each_reason_is_recognised(tmp_path: Path) -> None:
    script = load_script()
    for package in ("strata", "strata_tools", "svc_demo"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "strata" / "heavy.py").write_text("import torch\n")
    (tmp_path / "strata" / "light.py").write_text("import json\n")
    (tmp_path / "strata" / "ring.py").write_text("from strata_tools import loop\n")
    (tmp_path / "strata_tools" / "loop.py").write_text(
        "import json\n\n\n"
        "def uses() -> None:\n"
        "    import strata.heavy\n"           # heavy, through a project module
        "    import svc_demo\n"               # a service
        "    import strata.ring\n"            # strata.ring imports this module: a cycle
        "    try:\n"
        "        import selenium_extra\n"     # optional
        "    except ImportError:\n"
        "        pass\n"
        "    import json\n"                   # already loaded by the module: no reason
        "    from strata import light\n")     # light: no reason
    found = {(i.line, i.reason) for i in script.inner_imports(tmp_path)}
    assert found == {(5, "heavy"), (6, "service"), (7, "cycle"), (9, "optional"), (12, ""), (13, "")}
    assert script.problems(tmp_path, limit=5) == [
        "strata_tools/loop.py:12 in uses: `json` has no reason to be imported here; move it to the top of the module",
        "strata_tools/loop.py:13 in uses: `strata` has no reason to be imported here; move it to the top of the module",
        "6 imports inside functions, over the limit of 5",
    ]
