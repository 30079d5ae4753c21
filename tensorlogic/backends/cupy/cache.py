"""The on-disk kernel cache: compiled GPU code keyed by a hash of its source and the device.

A key hashes the generated source text, the path that compiled it (PTX or NVRTC), the device's
compute capability and the toolchain version, so a second process loads the binary instead of
generating and compiling it again. Writes go to a temporary file and are renamed into place, so
concurrent processes never read half a file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ... import config


@dataclass
class CacheStats:
    """What the cache did in this process."""

    hits: int = 0  # loaded from disk
    misses: int = 0  # compiled here (and stored)
    memory_hits: int = 0  # found in this process's in-memory table
    errors: list[str] = field(default_factory=list)  # unreadable or unwritable entries


class KernelCache:
    """Compiled kernels on disk under ``root`` (default: ``config.cache_dir()/"kernels"``)."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else config.cache_dir() / "kernels"
        self.stats = CacheStats()
        self._lock = threading.Lock()

    @staticmethod
    def key(source: str, path: str, arch: str, toolchain: str) -> str:
        """The cache key of one compiled kernel."""
        h = hashlib.sha256()
        for part in (path, arch, toolchain, source):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def _file(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.bin"

    def get(self, key: str) -> bytes | None:
        """The stored binary for ``key``, or None."""
        f = self._file(key)
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.stats.errors.append(f"read {f}: {exc}")
            return None
        with self._lock:
            self.stats.hits += 1
        return data

    def put(self, key: str, data: bytes) -> None:
        """Store a binary (atomically); a failure to write only costs a later recompile."""
        f = self._file(key)
        with self._lock:
            self.stats.misses += 1
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=f.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, f)
        except OSError as exc:
            self.stats.errors.append(f"write {f}: {exc}")

    def clear(self) -> int:
        """Delete every cached kernel; returns how many files were removed."""
        n = 0
        if not self.root.exists():
            return 0
        for f in self.root.glob("*/*.bin"):
            try:
                f.unlink()
                n += 1
            except OSError:
                pass
        return n
