"""Intel MKL as the GEMM library of the CPU backends, where the ``mkl`` package is installed.

On many-core Intel hosts MKL's sgemm runs 1.2-1.6x faster than the OpenBLAS that numpy ships
(1024x256x256 on 16 cores: 888 vs 740 GFLOP/s; 256x1024x1024: 1040 vs 664), and torch, the peer
of the model benchmarks, uses it. The ``mkl`` wheel puts ``libmkl_rt`` under ``<prefix>/lib``;
this module finds it through the installed distribution's file list (or ``sys.prefix/lib``),
loads it with ctypes and selects MKL's GNU OpenMP threading layer, so that MKL's threads are the
libgomp pool that numba's "omp" threading layer runs the generated kernels on: one pool of
threads for every step of a plan. Its thread count follows ours (``threads()``).

``matmul`` computes ``out = A @ B`` for float32/float64/complex64/complex128 (transposed and
strided operands as BLAS reads them, batch axes broadcast like numpy's): one ``cblas_?gemm``,
one ``cblas_?gemm_batch_strided`` where the batch has one stride per operand, else one
pointer-array ``cblas_?gemm_batch``. ``config.cpu_blas()`` (TL_BLAS) turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import platform
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np

from .. import config
from ..errors import BackendError
from ..runtime import json_cache
from ..runtime.memo import build_once

_ROW_MAJOR = 101
_THREADING_GNU, _INTERFACE_LP64 = 3, 0  # MKL_Set_Threading_Layer / MKL_Set_Interface_Layer
_PREFIX = {"float32": "s", "float64": "d", "complex64": "c", "complex128": "z"}
DTYPES = frozenset(_PREFIX)

_lock = threading.RLock()  # the race loads MKL under it
_loaded: dict[str, _Mkl | None] = {}  # library path -> its functions (None: failed to load)


@functools.cache
def library_path() -> str | None:
    """Where libmkl_rt is: among the files of the installed ``mkl`` distribution, else in
    ``sys.prefix/lib`` (a venv or conda prefix); None when neither has it (looked up once: the
    distribution's file list takes milliseconds to read)."""
    try:
        files = importlib.metadata.distribution("mkl").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    found = [f for f in files if Path(str(f)).name.startswith("libmkl_rt.so")]
    for f in sorted(found, key=lambda f: str(f)):
        path = Path(importlib.metadata.distribution("mkl").locate_file(f)).resolve()
        if path.is_file():
            return str(path)
    lib = Path(sys.prefix) / "lib"
    for name in ("libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"):
        if (lib / name).is_file():
            return str(lib / name)
    return None


class _Mkl:
    """The ctypes functions of one loaded libmkl_rt."""

    def __init__(self, path: str) -> None:
        # MKL's GNU threading layer calls into libgomp without linking it: make the libgomp
        # that numba's omp layer loaded (the same soname, so the same runtime) global first
        ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        # both must precede any other MKL call; they return the layer in effect
        if lib.MKL_Set_Threading_Layer(_THREADING_GNU) != _THREADING_GNU:
            raise OSError("MKL did not accept the GNU OpenMP threading layer")
        lib.MKL_Set_Interface_Layer(_INTERFACE_LP64)
        self.path = path
        self.lib = lib
        self.set_threads = lib.MKL_Set_Num_Threads
        self.get_threads = lib.MKL_Get_Max_Threads
        I, P = ctypes.c_int, ctypes.c_void_p  # noqa: E741 - LP64 integers, addresses
        self.gemm, self.strided, self.batch = {}, {}, {}
        for dtype, p in _PREFIX.items():
            s = {"s": ctypes.c_float, "d": ctypes.c_double}.get(p, P)
            fn = getattr(lib, f"cblas_{p}gemm")
            fn.argtypes = [I, I, I, I, I, I, s, P, I, P, I, s, P, I]
            fn.restype = None
            self.gemm[dtype] = fn
            fn = getattr(lib, f"cblas_{p}gemm_batch_strided")
            fn.argtypes = [I, I, I, I, I, I, s, P, I, I, P, I, I, s, P, I, I, I]
            fn.restype = None
            self.strided[dtype] = fn
            fn = getattr(lib, f"cblas_{p}gemm_batch")
            fn.argtypes = [I] + [P] * 13 + [I, P]
            fn.restype = None
            self.batch[dtype] = fn
        # packed-operand GEMMs (real types; absent from old MKLs, which then never pack)
        self.pack_size, self.pack, self.compute = {}, {}, {}
        for dtype, p in (("float32", "s"), ("float64", "d")):
            names = [f"cblas_{p}gemm_{x}" for x in ("pack_get_size", "pack", "compute")]
            if not all(hasattr(lib, x) for x in names):
                continue
            s = ctypes.c_float if p == "s" else ctypes.c_double
            size, pack, compute = (getattr(lib, x) for x in names)
            size.argtypes, size.restype = [I, I, I, I], ctypes.c_size_t
            pack.argtypes, pack.restype = [I, I, I, I, I, I, s, P, I, P], None
            compute.argtypes, compute.restype = [I, I, I, I, I, I, P, I, P, I, s, P, I], None
            self.pack_size[dtype], self.pack[dtype], self.compute[dtype] = size, pack, compute


def wanted() -> bool:
    """Whether the settings ask for MKL and it is installed (without loading it)."""
    choice = config.cpu_blas()
    if choice == "numpy":
        return False
    if library_path() is not None:
        return True
    if choice == "mkl":
        raise BackendError(
            "TL_BLAS=mkl: libmkl_rt not found (pip install mkl, or TL_BLAS=auto for numpy's BLAS)"
        )
    return False


def _load() -> _Mkl | None:
    path = library_path()
    if path is None:
        return None
    if path not in _loaded:
        with _lock:
            if path not in _loaded:
                from .numba import threads as numba_threads

                # numba's layer first: it loads libgomp with our OpenMP settings (spin policy)
                numba_threads.configure()
                try:
                    mkl = _Mkl(path)
                except (OSError, AttributeError):  # a broken or foreign install: numpy's BLAS
                    mkl = None
                if mkl is not None:
                    mkl.set_threads(threads())
                _loaded[path] = mkl
    return _loaded[path]


def available() -> bool:
    """Whether GEMMs go to MKL in this process: TL_BLAS=mkl, or "auto" with MKL installed,
    loadable and measured faster than numpy's BLAS on this machine (``faster_here``)."""
    if not wanted():
        return False
    # a cached "numpy" answer never loads MKL (its libraries take about a second to load)
    if config.cpu_blas() == "auto" and not faster_here(library_path()):
        return False
    if _load() is not None:
        return True
    if config.cpu_blas() == "mkl":
        raise BackendError(f"TL_BLAS=mkl: {library_path()} did not load as MKL")
    return False


# The race that decides "auto": pieces of the bench models' products, (batch, m, n, k), of the
# size one thread's block of them has in the "pool" mode's split
RACE_SHAPES = ((1, 256, 256, 256), (4, 256, 256, 64), (1, 128, 256, 1024))
CHOICE_FILE = "blas_choice.json"
_faster: dict[str, bool] = {}


def faster_here(path: str) -> bool:
    """Whether MKL ran the race's products faster than numpy's BLAS did, both on one thread as
    the blocks of the "pool" mode's split GEMMs run (measured once per machine, about 30 ms, and
    kept in ``config.cache_dir()``). One thread keeps the race fair on a shared machine, where
    a threaded BLAS loses whole scheduler ticks waiting for a descheduled worker.

    No CPU model decides it: MKL runs its fastest kernels only on CPUs it recognizes (on the
    2-vCPU AMD EPYC development machine its single-threaded products ran 10-20% slower than
    OpenBLAS's; on the 16-core Xeon host its blocks ran 1.0-1.4x faster).
    """
    return build_once(_faster, path, _lock, lambda: _cached_race(path))


def race_key(path: str) -> str:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return "|".join(map(str, (platform.node(), cpu, np.__version__, path)))


def _cached_race(lib_path: str) -> bool:
    path = config.cache_dir() / CHOICE_FILE
    key = race_key(lib_path)
    known = json_cache.read_entries(path)
    if key in known:
        return known[key] == "mkl"
    mkl = _load()
    if mkl is None:
        return False
    t_mkl, t_numpy = race(mkl)
    choice = "mkl" if t_mkl < t_numpy else "numpy"
    json_cache.store_entry(path, key, choice)
    return choice == "mkl"


def race(mkl: _Mkl, reps: int = 5) -> tuple[float, float]:
    """(MKL, numpy's BLAS) seconds for the race's products on one thread, each the best of
    ``reps`` rounds (numpy's BLAS held to one thread through threadpoolctl; MKL through its own
    setting, never threadpoolctl's, whose thread-local MKL limit would outlive the race)."""
    from threadpoolctl import ThreadpoolController

    rng = np.random.default_rng(0)
    cases = []
    for nb, m, n, k in RACE_SHAPES:
        a = rng.standard_normal((nb, m, k), dtype=np.float32)
        b = rng.standard_normal((nb, k, n), dtype=np.float32)
        cases.append((a, b, np.empty((nb, m, n), np.float32)))

    def best(run) -> float:
        times = []
        for _ in range(reps + 1):  # the first round warms up
            t0 = time.perf_counter()
            for a, b, c in cases:
                run(a, b, c)
            times.append(time.perf_counter() - t0)
        return min(times)

    found = ThreadpoolController().select(user_api="blas").lib_controllers
    others = [c for c in found if c.internal_api != "mkl"]
    saved = [(c, c.get_num_threads()) for c in others]
    try:
        for c in others:
            c.set_num_threads(1)
        mkl.set_threads(1)
        t_mkl = best(matmul)
        t_numpy = best(lambda a, b, c: np.matmul(a, b, out=c))
    finally:
        mkl.set_threads(threads())
        for c, n in saved:
            c.set_num_threads(n)
    return t_mkl, t_numpy


def loaded_path() -> str | None:
    """The libmkl_rt in use, or None (threadpoolctl must not limit it: ``numpy.threads``)."""
    found = [m for m in _loaded.values() if m is not None]
    return found[0].path if found else None


def threads() -> int:
    """Threads an MKL call uses: those of numba's pool, at most TL_NUM_THREADS."""
    from .numba import threads as numba_threads

    return max(1, min(config.host_threads(), numba_threads.thread_count()))


def mkl_threads() -> int:
    """Threads MKL is set to use now (0 when not loaded)."""
    mkl = _load() if wanted() else None
    return int(mkl.get_threads()) if mkl is not None else 0


def supports(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``matmul`` takes these operands (one dtype MKL has a GEMM for)."""
    return out.dtype.name in DTYPES and A.dtype == out.dtype and B.dtype == out.dtype


_NO_TRANS, _TRANS = 111, 112
PACKED, _A_MATRIX, _B_MATRIX = 151, 161, 162  # CBLAS_STORAGE, CBLAS_IDENTIFIER values


def blas_layout(x: np.ndarray) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) under which BLAS reads this (batch of) row-major
    matrices as they are, or None when neither matrix dim has a unit stride."""
    s0, s1 = x.strides[-2:]
    it = x.itemsize
    rows, cols = x.shape[-2:]
    # a dim of size 1 is never stepped along: its stride is whatever fits (numpy leaves any
    # value there, even in arrays it calls contiguous)
    if cols <= 1:
        s1 = it
    if rows <= 1:
        s0 = max(1, cols) * it
    if s1 == it and s0 % it == 0 and s0 >= max(1, cols) * it:
        return _NO_TRANS, s0 // it
    if s0 == it and s1 % it == 0 and s1 >= max(1, rows) * it:
        return _TRANS, s1 // it
    return None


@functools.lru_cache(maxsize=512)
def batch_offsets(batch: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """Element offset of every batch entry (C order) for these batch sizes and strides."""
    if not batch:
        return np.zeros(1, np.int64)
    idx = np.indices(batch, dtype=np.int64).reshape(len(batch), -1)
    offsets = (idx * np.array(strides, np.int64)[:, None]).sum(axis=0)
    offsets.flags.writeable = False  # shared by every call of this layout
    return offsets


@functools.lru_cache(maxsize=512)
def _uniform(batch: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The one stride between consecutive batch entries, or None where it varies."""
    off = batch_offsets(batch, strides)
    if len(off) < 2:
        return 0
    step = np.diff(off)
    return int(step[0]) if (step == step[0]).all() else None


def matmul(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = A @ B`` on MKL: A (*batch, m, k), B (*batch, k, n), ``out`` (*batch, m, n)
    C-contiguous; A's and B's batch axes each of ``out``'s size or 1 (broadcast), leading ones
    may be missing; one dtype of ``DTYPES``. The call for these shapes, strides and dtypes is
    prepared once (``prepare``) and kept."""
    key = (A.shape, A.strides, A.dtype, B.shape, B.strides, B.dtype, out.shape, out.strides)
    call = _calls.get(key)
    if call is None:
        call = prepare(A, B, out)
        if len(_calls) >= _CALLS_SIZE:
            _calls.clear()
        _calls[key] = call
    return call(A, B, out)


_CALLS_SIZE = 1024
_calls: dict = {}  # (shapes, strides, dtypes) -> prepared call (``matmul``)


def clear_calls() -> None:
    """Forget the prepared calls (``matmul``)."""
    _calls.clear()


def prepare(A: np.ndarray, B: np.ndarray, out: np.ndarray):
    """``call(A, B, out)`` computing ``matmul(A, B, out)`` for operands of these shapes,
    strides and dtypes (any data): the CBLAS entry, transpositions, leading dims and batch
    strides are chosen here once, so that a call reads the pointers and makes one MKL call."""
    mkl = _load()
    if mkl is None or not supports(A, B, out) or not out.flags.c_contiguous:
        raise BackendError(f"MKL matmul: unsupported operands {A.dtype}, {B.dtype} -> {out.dtype}")
    m, k, n = A.shape[-2], A.shape[-1], B.shape[-1]
    if out.size == 0:
        return lambda A, B, out: out
    if k == 0:

        def zero_fill(A, B, out):
            out[...] = 0
            return out

        return zero_fill
    # an operand with no unit stride in its matrix dims goes in as a C-contiguous copy
    copy_a, copy_b = blas_layout(A) is None, blas_layout(B) is None
    sa_full = np.empty(A.shape, A.dtype).strides if copy_a else A.strides
    sb_full = np.empty(B.shape, B.dtype).strides if copy_b else B.strides
    ta, lda = blas_layout(np.empty(A.shape, A.dtype) if copy_a else A)
    tb, ldb = blas_layout(np.empty(B.shape, B.dtype) if copy_b else B)
    batch = out.shape[:-2]
    nb = out.size // (m * n)
    name = out.dtype.name
    scal = np.array([1.0, 0.0], out.dtype)  # alpha, beta (arrays: the batch call's form)
    # real alpha/beta travel by value, complex ones by address (scal outlives the call)
    one, zero = (
        (scal[:1].ctypes.data, scal[1:].ctypes.data) if scal.dtype.kind == "c" else (1.0, 0.0)
    )

    def readable(x: np.ndarray, copy: bool) -> np.ndarray:
        return np.ascontiguousarray(x) if copy else x

    if nb == 1:
        gemm = mkl.gemm[name]

        def single(A, B, out):
            A, B = readable(A, copy_a), readable(B, copy_b)
            gemm(
                _ROW_MAJOR, ta, tb, m, n, k, one, A.ctypes.data, lda, B.ctypes.data, ldb, zero,
                out.ctypes.data, n,
            )  # fmt: skip
            scal  # noqa: B018 - the closure keeps alpha/beta alive
            return out

        return single
    it = out.itemsize

    def strides(shape: tuple[int, ...], st: tuple[int, ...]) -> tuple[int, ...]:
        lead = len(batch) - (len(shape) - 2)  # missing leading axes broadcast
        sh, st = (1,) * lead + shape[:-2], (0,) * lead + st[:-2]
        return tuple(0 if d == 1 else s // it for d, s in zip(sh, st))

    sa, sb = strides(A.shape, sa_full), strides(B.shape, sb_full)
    sc = tuple(s // it for s in out.strides[:-2])
    ua, ub, uc = _uniform(batch, sa), _uniform(batch, sb), _uniform(batch, sc)
    if ua is not None and ub is not None and uc is not None:
        strided = mkl.strided[name]

        def uniform(A, B, out):
            A, B = readable(A, copy_a), readable(B, copy_b)
            strided(
                _ROW_MAJOR, ta, tb, m, n, k, one, A.ctypes.data, lda, ua, B.ctypes.data, ldb,
                ub, zero, out.ctypes.data, n, uc, nb,
            )  # fmt: skip
            scal  # noqa: B018 - the closure keeps alpha/beta alive
            return out

        return uniform
    # one group of nb products at any offsets (several batch axes with their own strides)
    offs = [batch_offsets(batch, s) * it for s in (sa, sb, sc)]
    i32 = functools.partial(np.array, dtype=np.int32)  # MKL_INT of the LP64 interface
    args = [i32([ta]), i32([tb]), i32([m]), i32([n]), i32([k])]
    args += [scal[:1], None, i32([lda]), None, i32([ldb]), scal[1:], None, i32([n])]
    addr = [None if a is None else a.ctypes.data for a in args]
    size = i32([nb])
    batched = mkl.batch[name]

    def grouped(A, B, out):
        A, B = readable(A, copy_a), readable(B, copy_b)
        ptrs = [x.ctypes.data + o for x, o in zip((A, B, out), offs)]
        call_addr = list(addr)  # a copy per call: concurrent calls share this closure
        call_addr[6], call_addr[8], call_addr[11] = (p.ctypes.data for p in ptrs)
        batched(_ROW_MAJOR, *call_addr, 1, size.ctypes.data)
        args  # noqa: B018 - the closure keeps the argument arrays alive
        return out

    return grouped


def can_pack(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``prepare_packed`` takes these operands: one float32/float64 product (2-D), both
    operands readable by BLAS as they lie, ``out`` C-contiguous, the packed routines present."""
    mkl = _load()
    return (
        mkl is not None
        and out.dtype.name in mkl.compute
        and A.dtype == B.dtype == out.dtype
        and A.ndim == B.ndim == out.ndim == 2
        and min(out.shape) > 0
        and A.shape[1] > 0
        and out.flags.c_contiguous
        and blas_layout(A) is not None
        and blas_layout(B) is not None
    )


class ConstantPacks:
    """MKL-packed copies of one operand of a product, made the first time a plan constant
    (``constants.constant_root``: its data never changes) arrives there and kept while it
    lives, one set per address, so that one prepared call serves every constant of its shapes.

    ``pieces`` lists what to pack, each ``(offset, m, n, k)``: the piece starting ``offset``
    elements into the operand (a block's rows of A or columns of B), packed as the operand of a
    ``m x n x k`` product (``cblas_?gemm_pack_get_size``: the format depends on all three).
    ``addresses(x)`` gives the packed pieces' addresses in that order (equal pieces packed once),
    or None where ``x`` is no constant."""

    def __init__(self, which: str, trans: int, ld: int, dtype: str, pieces) -> None:
        mkl = _load()
        self.ident = _A_MATRIX if which == "A" else _B_MATRIX
        self.trans, self.ld, self.itemsize = trans, ld, np.dtype(dtype).itemsize
        self.size, self.pack = mkl.pack_size[dtype], mkl.pack[dtype]
        pieces = [tuple(int(v) for v in p) for p in pieces]
        self.pieces = sorted(set(pieces))  # blocks of one size and place share a pack
        self.index = np.array([self.pieces.index(p) for p in pieces], np.int64)
        self._packs: dict[int, tuple] = {}  # address -> (weak ref to its constant, packs, addrs)
        self._lock = threading.Lock()

    def addresses(self, x: np.ndarray) -> np.ndarray | None:
        from . import constants

        addr = x.ctypes.data
        hit = self._packs.get(addr)
        if hit is not None and hit[0]() is not None:  # alive: the same data at that address
            return hit[2]
        root = constants.constant_root(x)
        if root is None:
            return None
        with self._lock:
            bufs = [self._packed(addr, *piece) for piece in self.pieces]
            addrs = np.array([b.ctypes.data for b in bufs], np.int64)[self.index]
            # the packs go when the constant does (a deleted plan's weights are not held here)
            self._packs[addr] = (weakref.ref(root, self._forget_at(addr)), bufs, addrs)
        return addrs

    def _forget_at(self, addr: int):
        owner = weakref.ref(self)

        def forget(ref: weakref.ref) -> None:
            packs = owner()
            if packs is not None and packs._packs.get(addr, (None,))[0] is ref:
                packs._packs.pop(addr, None)

        return forget

    def _packed(self, addr: int, offset: int, m: int, n: int, k: int) -> np.ndarray:
        size = self.size(self.ident, m, n, k)
        raw = np.empty(size + 64, np.uint8)  # MKL's panels want 64-byte alignment
        buf = raw[-raw.ctypes.data % 64 :][:size]
        src = addr + offset * self.itemsize
        self.pack(_ROW_MAJOR, self.ident, self.trans, m, n, k, 1.0, src, self.ld, buf.ctypes.data)
        return buf


def constant_side(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> str | None:
    """Which operand of a product ``can_pack`` takes is a plan constant (``constants``), "B"
    before "A", or None where neither is: the one to pack."""
    from . import constants

    if not can_pack(A, B, out):
        return None
    for which, x in (("B", B), ("A", A)):
        if constants.constant_root(x) is not None:
            return which
    return None


def prepare_whole(A: np.ndarray, B: np.ndarray, out: np.ndarray):
    """``prepare``'s call for a product that runs whole on MKL's threads, with a constant
    operand packed once where it has one now (``constant_side``, ``prepare_packed``; a later
    call that passes no constant there runs the plain call): on the 16-core Xeon host the packed
    call was the faster on every product shape measured (2048x1024x1024 3.66-4.07 ms against
    4.04-4.19, 256x1024x1024 0.55-0.62 against 0.78-1.01, 1024x2048x512 2.14 against 2.30)."""
    which = constant_side(A, B, out)
    return prepare(A, B, out) if which is None else prepare_packed(A, B, out, which)


def prepare_packed(A: np.ndarray, B: np.ndarray, out: np.ndarray, which: str = "B"):
    """``call(A, B, out)`` computing ``A @ B`` on MKL's threads with one operand (``which``,
    "A" or "B") in MKL's internal packed format (``cblas_?gemm_pack`` once per plan constant,
    ``ConstantPacks``; ``cblas_?gemm_compute`` per call), for operands ``can_pack`` takes; a
    call whose operand is no constant runs the plain MKL call. Packing saves the copy into
    MKL's panels that every call otherwise makes of a weight."""
    plain = prepare(A, B, out)
    m, k, n = A.shape[0], A.shape[1], B.shape[1]
    ta, lda = blas_layout(A)
    tb, ldb = blas_layout(B)
    name = out.dtype.name
    trans, ld = (tb, ldb) if which == "B" else (ta, lda)
    packs = ConstantPacks(which, trans, ld, name, [(0, m, n, k)])
    compute = _load().compute[name]

    def call(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> np.ndarray:
        addrs = packs.addresses(B if which == "B" else A)
        if addrs is None:
            return plain(A, B, out)
        pa, fa = (A.ctypes.data, ta) if which == "B" else (int(addrs[0]), PACKED)
        pb, fb = (int(addrs[0]), PACKED) if which == "B" else (B.ctypes.data, tb)
        compute(_ROW_MAJOR, fa, fb, m, n, k, pa, lda, pb, ldb, 0.0, out.ctypes.data, n)
        return out

    return call
