"""Small JSON files of measured choices under TL_CACHE_DIR, read and written safely.

Several processes may measure at once: a write goes to a temporary file that replaces the
old one atomically, so a reader sees the old file or the new one, never half of one. An
unreadable file reads as nothing and an unwritable cache is no error: either only costs the
next process the measurement again.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path


def read(path: Path) -> object | None:
    """The file's JSON value, or None where it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write(path: Path, doc: object) -> None:
    """Replace the file with ``doc`` as JSON (creating its folder); errors are ignored. The
    temporary file is unique per call (``mkstemp``), so threads of one process writing the same
    file at once never rename each other's half-written text."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=1))
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def read_entries(path: Path) -> dict:
    """The file's JSON object (key -> choice), or {} where it holds none."""
    doc = read(path)
    return doc if isinstance(doc, dict) else {}


def store_entry(path: Path, key: str, value: object) -> None:
    """Add or replace one entry of the file's JSON object (read again just before writing, so
    entries other processes wrote meanwhile are kept)."""
    doc = read_entries(path)
    doc[key] = value
    write(path, doc)
