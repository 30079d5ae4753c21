"""Content-addressed kernel modules and their compiled objects on disk.

Each kernel's source text is written once to ``<cache dir>/tl_<hash>.py`` (the hash covers the text
and the numba/Python versions; the text names the jit options and, for fast math, the digest of
``numba_fastmath``), executed as a small module, and its function compiled for one explicit
signature. Compiled objects go through numba's own cache format (index ``.nbi`` plus data ``.nbc``
files), but with our locator:

- the directory is always ``config.numba_cache_dir()`` (numba's ``NUMBA_CACHE_DIR`` and a
  read-only package directory do not matter);
- the freshness stamp is the content hash itself, so loading a kernel neither stats, reads nor
  hashes its source file, nor probes the directory with a temporary file (numba's default
  locator does all of these per function);
- an explicit signature means loading a cached kernel skips type inference and dispatch-time
  typing: the dispatcher is ready when ``load`` returns, with compilation of other signatures
  disabled (inputs are declared read-only, which accepts writable arrays at no cost).

- a cache load initializes only numba's runtime (NRT), not its whole target context (see
  ``_StampedCache.load_overload``); tests/backends/test_numba_runtime.py runs every kernel kind
  in a process that only loads.

A warm first call of a plan therefore costs, per kernel, one exec of a ~30-line module, one index
and one data file read, and numba's object-code load (the dominant part); the fixed costs are
numba's own import, its NRT set-up and the threading layer's start (measured in
benchmarks/bench_fused_cpu.py).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import tempfile
import threading
import types as pytypes
from pathlib import Path
from typing import Any

import numba
from numba.core.caching import CompileResultCacheImpl, FunctionCache, _CacheLocator
from numba.core.runtime import rtsys

from ... import config

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


class _Locator(_CacheLocator):
    """Objects live in the cache root; freshness is the content stamp given by the caller."""

    def __init__(self, py_file: str, stamp: str) -> None:
        self._py_file = py_file  # numba's warnings name it
        self._stamp = stamp

    def ensure_cache_path(self) -> None:
        # called before a save only; cache_root() already proved the directory writable
        cache_root().mkdir(parents=True, exist_ok=True)

    def get_cache_path(self) -> str:
        return str(cache_root())

    def get_source_stamp(self) -> str:
        return self._stamp

    def get_disambiguator(self) -> str:
        return "tl"

    @classmethod
    def from_function(cls, py_func, py_file):  # pragma: no cover - numba's discovery hook, unused
        return None


class _Impl(CompileResultCacheImpl):
    """numba's CompileResult (de)serialization with a fixed locator (no locator search)."""

    def __init__(self, py_func, stamp: str) -> None:
        self._lineno = py_func.__code__.co_firstlineno
        self._locator = _Locator(py_func.__code__.co_filename, stamp)
        module = py_func.__module__.rsplit(".", 1)[-1]
        self._filename_base = self.get_filename_base(
            f"{module}.{py_func.__qualname__}", getattr(sys, "abiflags", "")
        )


class _StampedCache(FunctionCache):
    """A numba function cache in the tensorlogic cache directory, fresh while ``stamp`` is."""

    def __init__(self, py_func, stamp: str) -> None:
        # numba's Cache.__init__ builds self._impl_class(py_func): bind the stamp first
        self._impl_class = functools.partial(_Impl, stamp=stamp)
        super().__init__(py_func)

    def load_overload(self, sig, target_context):
        """Load a cached object after initializing only the runtime it links against.

        numba's version calls ``target_context.refresh()`` first, which imports and installs
        every typing and lowering registry of numba (0.2-0.5 s on the test machine: most of a
        warm start). A cached kernel needs none of them: it links against the NRT (initialized
        here, exactly as refresh's first step does), numba's C helpers and math symbols
        (registered when the context is created) and, for parallel kernels, the threading
        layer (started by the object's own reload hook). Compiling still refreshes: numba's
        compiler pipeline does it itself.
        """
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)


def attach(dispatcher: Any, stamp: str) -> None:
    """Cache ``dispatcher``'s compiled overloads in the cache directory, fresh while ``stamp`` is.

    Used for library functions that kernels call (fast exp/log): ``stamp`` is their source digest.
    """
    dispatcher._cache = _StampedCache(dispatcher.py_func, stamp)


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


def _module(key: str, text: str) -> pytypes.ModuleType:
    path = cache_root() / f"tl_{key}.py"
    _write_once(path, text)
    name = f"_tensorlogic_numba_{key}"
    mod = pytypes.ModuleType(name)
    mod.__file__ = str(path)
    # numba's environment pickling finds a function's globals through its module's name
    sys.modules[name] = mod
    exec(compile(text, str(path), "exec"), mod.__dict__)  # noqa: S102 - our generated source
    return mod


def load(text: str, name: str, signature: Any) -> Any:
    """The jitted function ``name`` of the module with this text, compiled for ``signature``.

    The module must define ``JIT_OPTIONS`` (keyword arguments of ``numba.njit``), and its text
    must determine ``signature`` (generated kernels name it in a comment), since the text is the
    cache key. The first load in any process compiles and stores the object; later loads, in this
    process or another, read it back. Thread-safe. The dispatcher accepts exactly ``signature``
    (writable arrays where it names read-only ones) and compiles nothing at call time.
    """
    key = digest(text)
    disp = _loaded.get(key)
    if disp is not None:
        return disp
    with _lock:
        disp = _loaded.get(key)
        if disp is None:
            mod = _module(key, text)
            disp = numba.njit(**mod.JIT_OPTIONS)(getattr(mod, name))
            disp._cache = _StampedCache(disp.py_func, key)
            disp.compile(signature)
            disp.disable_compile()
            _loaded[key] = disp  # published only once compiled
    return disp
