"""The README's Python blocks run as written, top to bottom, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


# a block right after this comment cannot run here (it names what it needs, e.g. two GPUs)
SKIP = "<!-- readme-test: skip"


def _blocks() -> list[tuple[int, str]]:
    text = README.read_text(encoding="utf-8")
    out = []
    for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if not before.startswith(SKIP):
            out.append((text.count("\n", 0, m.start()) + 2, m.group(1)))
    return out


def test_readme_has_python_blocks():
    assert len(_blocks()) >= 3


def test_readme_python_blocks_run_in_order(tmp_path, monkeypatch):
    matplotlib.use("Agg")  # the profiling block draws plots
    monkeypatch.chdir(tmp_path)  # the blocks write trace.json and plots
    namespace: dict = {"__name__": "readme"}
    for line, code in _blocks():
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - reported with the block's line
            pytest.fail(f"README block at line {line} failed: {type(exc).__name__}: {exc}")
    assert (tmp_path / "trace.json").exists()
