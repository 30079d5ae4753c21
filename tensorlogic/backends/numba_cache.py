"""Content-addressed modules of generated numba kernels, compiled with ``cache=True``.

Each kernel's source text is written once to ``<cache dir>/numba/tl_<hash>.py`` (the hash covers
the text and the numba/Python versions) and imported from there. numba's own disk cache keys a
function by its source file's path and modification time; since a content-addressed file is never
rewritten (it is linked into place atomically, and an existing file is left alone), a second
process importing the same text finds numba's compiled object beside it in ``__pycache__`` and
does not compile again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numba

from .. import config

_loaded: dict[str, Any] = {}
_lock = threading.Lock()
_dir: Path | None = None


def cache_root() -> Path:
    """The directory of generated modules (created on first use; a temp dir if unwritable)."""
    global _dir
    if _dir is None:
        d = config.numba_cache_dir()
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe = d / f".probe-{os.getpid()}-{threading.get_ident()}"
            probe.write_text("")
            probe.unlink()
        except OSError:
            # read-only home (some CI runners): kernels still work, cached for this run only
            d = Path(tempfile.mkdtemp(prefix="tensorlogic-numba-"))
        _dir = d
    return _dir


def digest(text: str) -> str:
    """Content hash of a generated module (text plus the toolchain that compiles it)."""
    h = hashlib.sha256()
    h.update(text.encode())
    h.update(f"numba={numba.__version__};py={sys.version_info[:2]}".encode())
    return h.hexdigest()[:32]


def _write_once(path: Path, text: str) -> None:
    if path.exists():
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        try:
            os.link(tmp, path)  # atomic, and never replaces a file another process wrote
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def load(text: str, name: str) -> Any:
    """The function ``name`` of the module with this source text (written and imported once)."""
    key = digest(text)
    fn = _loaded.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _loaded.get(key)
        if fn is None:
            path = cache_root() / f"tl_{key}.py"
            _write_once(path, text)
            modname = f"_tensorlogic_numba_{key}"
            spec = importlib.util.spec_from_file_location(modname, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[modname] = mod  # numba's cache and pickling look modules up by name
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
            fn = getattr(mod, name)
            _loaded[key] = fn
    return fn


def module_path(text: str) -> Path:
    """Where the module of this text lives (for tests and diagnostics)."""
    return cache_root() / f"tl_{digest(text)}.py"
