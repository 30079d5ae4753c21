"""Units for people."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """A byte count for people: ``1.5 MiB``."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
