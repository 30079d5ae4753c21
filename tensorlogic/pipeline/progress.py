"""A tqdm progress bar over batches that also shows items per second."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO


class Progress:
    """Counts batches (tqdm's own rate: batches/s) and items (shown as items/s).

    The bar is off when ``enabled`` is False or when ``file`` is not a terminal. ``note`` is
    shown after the rates (training puts the latest loss there).
    """

    def __init__(
        self, enabled: bool, total: int | None, file: TextIO | None = None, desc: str = "batches"
    ) -> None:
        self.items = 0
        self.failed = 0
        self.note = ""
        self._t0 = time.perf_counter()
        self._bar: Any = None
        file = file if file is not None else sys.stderr
        if not enabled or not _is_terminal(file):
            return
        from tqdm.auto import tqdm

        self._bar = tqdm(
            total=total, unit="batch", desc=desc, file=file, mininterval=0.1, **_fallback_size(file)
        )
        self._t0 = time.perf_counter()

    @property
    def active(self) -> bool:
        """True when a bar is drawn."""
        return self._bar is not None

    def update(self, n_items: int, ok: bool = True) -> None:
        """One more batch of ``n_items`` items is done (``ok=False``: it failed)."""
        self.items += n_items
        self.failed += not ok
        if self._bar is None:
            return
        rate = self.items / max(time.perf_counter() - self._t0, 1e-9)
        post = f"{_si(rate)} items/s"
        if self.failed:
            post += f", {self.failed} failed"
        if self.note:
            post += f", {self.note}"
        self._bar.set_postfix_str(post, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        """Finish the bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _is_terminal(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


def _fallback_size(file: Any) -> dict[str, int]:
    """80x24 for a terminal that reports a zero size (a fresh pty), where tqdm would hide
    the bar; nothing (tqdm measures the terminal) otherwise."""
    try:
        size = os.get_terminal_size(file.fileno())
    except (AttributeError, ValueError, OSError):
        return {}
    out = {}
    if size.columns == 0:
        out["ncols"] = 80
    if size.lines == 0:
        out["nrows"] = 24
    return out


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


__all__ = ["Progress"]
