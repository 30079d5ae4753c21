"""One thread pool for a CPU plan: GEMMs split over our helper threads, BLAS on one thread.

numpy's OpenBLAS (a pthreads build) keeps its own workers, which spin for about 0.1 s after
each call. In a plan that alternates GEMMs with elementwise and row-op kernels, those spinning
workers fight the kernels' threads (ours, or numba's OpenMP pool) for the cores, so either the
kernels stay on one thread or both sides slow down. In the "pool" thread mode a plan call
instead runs with BLAS limited to one thread (``single_threaded_blas``, set and restored
around the call through threadpoolctl's library handles), and every large matmul is cut into
blocks along its batch, row or column axis that the caller and the shared helper pool
(``host_pool``) compute with single-threaded BLAS calls. Every step of the plan then runs on the
same threads, which sleep between steps instead of spinning, as torch's one intra-op pool does.

The "blas" mode keeps OpenBLAS's own threads for GEMMs (and, on the numpy backend, fused
kernels on the calling thread); the O3 autotuner times both on the real shapes.

Where Intel MKL is installed (``backends.mkl``, TL_BLAS) it runs the GEMMs instead: its threads
are the GNU OpenMP pool of numba's kernels, so in the "pool" mode a product goes whole to MKL
(one pool, no spinning pthreads to limit) or, as ``mkl_splits`` says by default, is cut into
single-threaded MKL blocks over numba's loop; in the "blas" mode every product is one MKL call.
OpenBLAS stays limited to one thread in "pool" plans (it still runs the small products).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import threading
from collections.abc import Iterator

import numpy as np

from ... import config
from .. import gemm_choice, gemm_numba, gemv_numba, mkl
from . import host_pool

THREAD_MODES = ("pool", "blas")
DEFAULT_MODE = "pool"

# Below this many FLOPs a matmul runs on the calling thread: waking helpers (tens of us) costs
# more than splitting saves (a 64x256x256 product is 8 MFLOP, ~0.1 ms on one core).
MIN_SPLIT_FLOPS = 4_000_000
# How "pool" mode splits a GEMM: "numba" (one numba parallel loop of BLAS calls, gemm_numba;
# Python threads where that is unavailable) or "python" (blocks on the host_pool threads)
SPLIT = "numba"
# Blocks along a row/column axis are multiples of this many elements (full SIMD tiles of the
# GEMM micro-kernels, so no block gets a ragged edge in the middle of the output).
ALIGN = 16

_lock = threading.Lock()
_depth = 0
_saved: list[tuple[object, int]] = []
_controllers: list | None = None


def check_mode(mode: object) -> str:
    """The thread mode named by the ``threads`` compile option (default "pool")."""
    from ...errors import BackendError

    if mode is None:
        return DEFAULT_MODE
    if mode not in THREAD_MODES:
        raise BackendError(f"compile option threads={mode!r}: expected one of {THREAD_MODES}")
    return str(mode)


def _blas_controllers() -> list:
    """threadpoolctl's handles of the BLAS libraries loaded when the first plan runs (found
    once: numpy's, which runs every GEMM of a plan; a BLAS loaded later is not ours to limit)."""
    global _controllers
    if _controllers is None:
        from threadpoolctl import ThreadpoolController

        found = ThreadpoolController().select(user_api="blas").lib_controllers
        # MKL loaded by ``backends.mkl`` shares numba's OpenMP pool and keeps its threads
        _controllers = [c for c in found if not _is_our_mkl(c.filepath)]
    return _controllers


def _is_our_mkl(path: str) -> bool:
    import os

    ours = mkl.loaded_path()
    return ours is not None and os.path.realpath(path) == os.path.realpath(ours)


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """BLAS on one thread while any plan call of the "pool" mode runs (nested and concurrent
    calls share one setting; the last to leave restores the previous thread counts)."""
    global _depth
    with _lock:
        if _depth == 0:
            _saved.clear()
            for c in _blas_controllers():
                n = c.get_num_threads()
                if n != 1:
                    _saved.append((c, n))
                    c.set_num_threads(1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for c, n in _saved:
                    c.set_num_threads(n)
                _saved.clear()


def blas_libraries() -> list[str]:
    """Paths of the BLAS libraries whose threads a plan call limits (numpy's first)."""
    return [c.filepath for c in _blas_controllers()]


def blas_threads() -> int:
    """Threads BLAS uses now (MKL's where it runs the GEMMs, else the largest count among the
    libraries found)."""
    if mkl.available():
        return mkl.mkl_threads()
    return max((c.get_num_threads() or 1 for c in _blas_controllers()), default=1)


def _cuts(n: int, parts: int, align: int) -> list[int]:
    """Boundaries of ``parts`` near-equal blocks of ``range(n)``, aligned where n allows."""
    step = -(-n // parts)
    if n >= parts * align:
        step = -(-step // align) * align
    return list(range(0, n, step)) + [n]


def parallel_matmul(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``np.matmul(A, B, out=out)`` split over the threads.

    A is (*batch, m, k) or (m, k), B (*batch, k, n) or (k, n), ``out`` C-contiguous. Where
    numpy's BLAS can be entered directly (``gemm_numba``), the blocks run as one numba parallel
    loop of single-threaded BLAS calls. Otherwise they run on the caller and the helper pool:
    the split goes along the batch axis when it has a block per thread, else along the longer
    of m and n (a column block keeps B's slab and the output's columns together; a row block
    reuses all of B), each block one single-threaded BLAS call into its slice of ``out``.

    The way a product runs (numpy's matmul, MKL whole, the numba split with its grid, layouts
    and batch offsets) depends only on the operands' shapes, strides and dtypes and on the
    settings (``_settings``): it is chosen once per such key (``_dispatch``) and kept, so a
    call of a plan step reads its pointers and launches once.
    """
    settings = _CALL.get() or _settings("free")
    key = (A.shape, A.strides, A.dtype, B.shape, B.strides, B.dtype, out.shape, out.strides)
    key += (out.dtype, settings)
    call = _DISPATCH.get(key)
    if call is None:
        call = _remember(key, _dispatch(A, B, out, settings))
    return call(A, B, out)


def matmul_epilogue(
    A: np.ndarray,
    B: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray,
    residual: np.ndarray | None,
    act: str | None,
) -> np.ndarray:
    """``out = act(A @ B + bias [+ residual])`` for a 2-D product (A (m, k), B (k, n), ``out``
    (m, n) C-contiguous, ``bias`` (n,), ``act`` None, "relu" or "gelu"; a residual only
    without an activation): GEMM blocks that each finish their own tile while it is in cache
    (``gemm_numba.prepare_epilogue``), split over the threads like ``parallel_matmul``'s.
    With MKL whole on its own threads (TL_MKL_SPLIT=0, or as ``gemm_choice`` timed it) the
    same tiles are finished on numba's threads after the product. Where the loop is
    unavailable (no CBLAS entry, dtypes it does not take) or the product is a matrix-vector
    one, the product runs as ``parallel_matmul`` and the epilogue after it."""
    settings = _CALL.get() or _settings("free")
    key = ("epilogue", A.shape, A.strides, A.dtype, B.shape, B.strides, B.dtype, out.shape)
    key += (out.strides, out.dtype, bias.dtype, act, residual is not None, settings)
    call = _DISPATCH.get(key)
    if call is None:
        call = _remember(key, _dispatch_epilogue(A, B, out, bias, residual, act, settings))
    return call(A, B, out, bias, residual)


def _dispatch_epilogue(A, B, out, bias, residual, act, settings: tuple):
    where = settings[0]
    m, k = A.shape
    n = B.shape[1]
    dtypes = {A.dtype, B.dtype, bias.dtype} | ({residual.dtype} if residual is not None else set())
    usable = (
        SPLIT == "numba"
        and min(m, n) > 1  # a matrix-vector product keeps its GEMV blocks (no GEMM packing)
        and dtypes == {out.dtype}
        and _numba_split(A, B, out)
    )
    whole = mkl.available() and settings[2] is False  # TL_MKL_SPLIT=0: MKL's threads
    if not usable or (whole and not out.flags.c_contiguous):
        return functools.partial(_matmul_then_epilogue, act=act)
    small = where == "own" or 2 * m * n * k < MIN_SPLIT_FLOPS
    blocks = _grid_of(1, m, n, 1 if small else split_parts())
    if whole:  # the product whole, then its tiles on numba's threads (not numpy on one)
        product = mkl.prepare_whole(A, B, out)
        return gemm_numba.then_epilogue(product, blocks, out.dtype.name, act, residual is not None)
    split = _blas_limited(
        gemm_numba.prepare_epilogue(A, B, out, blocks, act, residual is not None), where
    )
    if not small and gemm_choice.races(A, B, out, settings):
        return gemm_choice.epilogue(A, B, out, bias, residual, act, split, blocks)
    return split


def _blas_limited(split, where: str):
    """``split`` (a numba loop of BLAS calls) as it runs from ``where``: inside a "pool"-mode
    plan call, which already holds BLAS on one thread, as it is; elsewhere with BLAS limited
    around it (BLAS called from many threads at once needs it)."""
    if where == "plan":
        return split

    def limited(*args):
        with single_threaded_blas():
            return split(*args)

    return limited


def _matmul_then_epilogue(A, B, out, bias, residual, act):
    from ...ir import ops

    parallel_matmul(A, B, out)
    np.add(out, bias, out=out)
    if residual is not None:
        np.add(out, residual, out=out)
    if act is not None:  # the op table's numpy kernel (gelu's may not write over its input)
        row = ops.ELEMENTWISE[act]
        row.numpy(out if row.alias_safe else out.copy(), out=out)
    return out


# (shapes, strides, dtypes, settings) -> call(A, B, out): the way each product runs
_DISPATCH: dict = {}
_DISPATCH_SIZE = 4096
# the settings of the plan call in progress (``pool_call``, ``blas_own_threads``); None outside
_CALL: contextvars.ContextVar[tuple | None] = contextvars.ContextVar(
    "tensorlogic_gemm_settings", default=None
)


def _settings(where: str) -> tuple:
    """What a product's dispatch depends on beyond its operands: where it is called from
    ("plan": a "pool"-mode plan call, BLAS already on one thread; "own": a blas-bound plan;
    "free": a call of its own), the BLAS choice, the split rule and the thread counts."""
    from ..numba import threads as numba_threads

    if where == "free" and _BLAS_OWN.get():
        where = "own"
    return (
        where,
        config.cpu_blas(),
        config.mkl_split(),
        host_pool.helper_count(),
        numba_threads.thread_count(),
        SPLIT,
        MIN_SPLIT_FLOPS,
    )


def _remember(key: tuple, call):
    if len(_DISPATCH) >= _DISPATCH_SIZE:  # shapes of a long-running process come and go
        _DISPATCH.clear()
    _DISPATCH[key] = call
    return call


def clear_dispatch() -> None:
    """Forget the chosen ways of running products (after changing what ``_settings`` does not
    see, such as the BLAS symbols found)."""
    _DISPATCH.clear()
    mkl.clear_calls()


def _np_matmul(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.matmul(A, B, out=out)


def _dispatch(A: np.ndarray, B: np.ndarray, out: np.ndarray, settings: tuple):
    """``call(A, B, out)``: how a product of these operands runs under ``settings``."""
    where, helpers = settings[0], settings[3]
    k = A.shape[-1]
    m, n = A.shape[-2], B.shape[-1]
    nb = math.prod(out.shape[:-2])
    if 2 * nb * m * n * k < MIN_SPLIT_FLOPS:  # most GEMMs of a net are small
        return _np_matmul
    use_mkl = mkl.available() and mkl.supports(A, B, out) and out.flags.c_contiguous
    threads = helpers + 1
    blas_own = where == "own"
    if use_mkl and (blas_own or threads == 1 or not mkl_splits(nb, m, n, k)):
        return mkl.prepare_whole(A, B, out)  # on MKL's threads: numba's OpenMP pool
    if blas_own or threads == 1:
        return _np_matmul
    if A.ndim < out.ndim or B.ndim < out.ndim:  # leading 1s broadcast like numpy's (views)
        A = A.reshape((1,) * (out.ndim - A.ndim) + A.shape)
        B = B.reshape((1,) * (out.ndim - B.ndim) + B.shape)
    if SPLIT == "numba" and _gemv_split(A, B, out):  # GEMV blocks: no GEMM packing
        return functools.partial(_gemv_blocks, parts=split_parts(), limit=where != "plan")
    if (SPLIT == "numba" or use_mkl) and _numba_split(A, B, out):
        blocks = _grid(nb, m, n)
        split = _blas_limited(gemm_numba.prepare(A, B, out, blocks), where)
        if use_mkl and gemm_choice.races(A, B, out, settings):
            return gemm_choice.product(A, B, out, split, blocks)
        return split
    if out.ndim > 3 or not A.shape[:-2] == B.shape[:-2] == out.shape[:-2]:
        # several batch axes (strided views) or a broadcast one: numpy's own loop over them
        return _np_matmul
    return functools.partial(_python_split, threads=threads)


def _python_split(A: np.ndarray, B: np.ndarray, out: np.ndarray, threads: int) -> np.ndarray:
    """The product's blocks on the caller and the helper pool (no CBLAS entry for numba)."""
    if A.ndim < out.ndim or B.ndim < out.ndim:
        A = A.reshape((1,) * (out.ndim - A.ndim) + A.shape)
        B = B.reshape((1,) * (out.ndim - B.ndim) + B.shape)
    nb, m, n = math.prod(out.shape[:-2]), A.shape[-2], B.shape[-1]
    if nb >= threads:
        cuts = _cuts(nb, threads, 1)

        def work(i: int, _worker: int) -> None:
            s = slice(cuts[i], cuts[i + 1])
            np.matmul(A[s], B[s], out=out[s])
    elif m >= n:
        cuts = _cuts(m, threads, ALIGN)

        def work(i: int, _worker: int) -> None:
            s = slice(cuts[i], cuts[i + 1])
            np.matmul(A[..., s, :], B, out=out[..., s, :])
    else:
        cuts = _cuts(n, threads, ALIGN)

        def work(i: int, _worker: int) -> None:
            s = slice(cuts[i], cuts[i + 1])
            np.matmul(A, B[..., s], out=out[..., s])

    blocks = len(cuts) - 1
    host_pool.run_blocks(work, blocks, min(threads - 1, blocks - 1))
    return out


# products under this many FLOPs skip the call (``contract`` reads it at plan time)
parallel_matmul.min_flops = MIN_SPLIT_FLOPS  # type: ignore[attr-defined]


def mkl_splits(nb: int, m: int, n: int, k: int) -> bool:
    """Whether a "pool"-mode product on MKL is cut into single-threaded MKL blocks over numba's
    loop (True, the default) rather than handed whole to MKL's own threads; TL_MKL_SPLIT
    (``config.mkl_split``) overrides. On the 16-core Xeon host the split matched or beat MKL's
    own threading on six of the seven bench models (causal block 3.67 vs 4.56 ms, MLP 2.92 vs
    3.02; results/bench_models_16core_mkl.json); a large 2-D product is then timed both ways,
    and with a constant operand packed once, on its first call (``gemm_choice``). The "blas"
    thread mode, which O3 also times, keeps each product one MKL call on MKL's threads."""
    forced = config.mkl_split()
    return True if forced is None else forced


def whole_matmul(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The "blas" mode's products: one MKL call on MKL's threads where MKL runs the GEMMs and
    takes the operands, else numpy's matmul on its BLAS's threads (chosen once per shapes,
    strides, dtypes and BLAS setting, as in ``parallel_matmul``)."""
    key = (A.shape, A.strides, A.dtype, B.shape, B.strides, B.dtype, out.shape, out.strides)
    key += (out.dtype, "whole", config.cpu_blas())
    call = _DISPATCH.get(key)
    if call is None:
        use = mkl.available() and mkl.supports(A, B, out) and out.flags.c_contiguous
        call = _remember(key, mkl.prepare_whole(A, B, out) if use else _np_matmul)
    return call(A, B, out)


whole_matmul.min_flops = MIN_SPLIT_FLOPS  # type: ignore[attr-defined]


def blas_mode_matmul():
    """The matmul of "blas"-mode contractions (None: numpy's own), chosen at plan time."""
    return whole_matmul if mkl.available() else None


def blas_bound(step_gemms) -> bool:
    """Whether a "pool"-mode plan runs on BLAS's own threads instead: true when every step that
    computes is a contraction whose products are all single (unbatched) GEMMs, and there is one.

    ``step_gemms`` holds, per computing step, the (batch, m, n, k) of its GEMMs, or None for a
    step that is no contraction. The split exists so that GEMMs and the kernels between them
    share one pool of threads, and it wins on batches (one parallel region over all of a batch's
    products, where BLAS threads each small product on its own). A plan of plain GEMMs alone has
    nothing to share the pool with, and there BLAS's own threads won: a 256x256 product is
    4 MFLOP per block on 8 threads, so the region's launch and each block's own packing of its
    K-panels cost as much as the product (a chain of five such GEMMs: 1.0 ms split, 0.52 ms
    on BLAS's threads).
    """
    found = False
    for gemms in step_gemms:
        if gemms is None or any(g[0] > 1 for g in gemms):
            return False
        found = found or bool(gemms)
    return found


# set while a blas-bound plan runs (``blas_bound``): its products go to numpy's matmul whole
_BLAS_OWN = contextvars.ContextVar("tensorlogic_blas_own", default=False)


def plan_settings(blas_own: bool = False) -> tuple:
    """The settings a plan's products are dispatched by (``_settings``), read when its runner
    is built: reading them on every call (environment, affinity and thread counts) cost 8 us
    alone and 107 us inside a plan's rhythm on the 2-vCPU machine, where the products had just
    evicted that code from the caches. A plan compiled after TL_BLAS, TL_MKL_SPLIT or
    TL_NUM_THREADS change sees the new values."""
    return _settings("own" if blas_own else "plan")


@contextlib.contextmanager
def blas_own_threads(settings: tuple | None = None) -> Iterator[None]:
    """Products of ``parallel_matmul`` run unsplit on BLAS's own threads in this context
    (``settings``: ``plan_settings(blas_own=True)`` read before, else read now)."""
    token = _BLAS_OWN.set(True)
    call = _CALL.set(settings or _settings("own"))
    try:
        yield
    finally:
        _CALL.reset(call)
        _BLAS_OWN.reset(token)


@contextlib.contextmanager
def pool_call(settings: tuple | None = None) -> Iterator[None]:
    """A "pool"-mode plan call: BLAS on one thread (``single_threaded_blas``) and the settings
    its products are dispatched by (``plan_settings``, read now where not given) for the whole
    call."""
    with single_threaded_blas():
        token = _CALL.set(settings or _settings("plan"))
        try:
            yield
        finally:
            _CALL.reset(token)


def _numba_split(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> bool:
    """Whether this product runs as one numba loop of BLAS blocks (``gemm_numba``): ``out``
    C-contiguous, or each of its matrices rows of unit-stride columns apart (an intermediate
    an einsum writes in the letter order its next product reads, ``ir.pairwise``)."""
    return (
        out.dtype.name in ("float32", "float64")
        and A.dtype == out.dtype
        and B.dtype == out.dtype
        and _rows_of_columns(out)
        and A.ndim == B.ndim == out.ndim
        and all(a in (1, o) and b in (1, o) for a, b, o in zip(A.shape, B.shape, out.shape[:-2]))
        and A.shape[-1] > 0
        and gemm_numba.available()
    )


def _rows_of_columns(out: np.ndarray) -> bool:
    """Whether BLAS writes each matrix of ``out`` as it lies: C-contiguous, or unit-stride
    columns and positive row and batch strides in whole elements, rows that do not overlap."""
    if out.flags.c_contiguous:
        return True
    it = out.itemsize
    if out.ndim < 2 or out.strides[-1] != it or any(s <= 0 or s % it for s in out.strides):
        return False
    return out.shape[-2] == 1 or out.strides[-2] >= out.shape[-1] * it


def _gemv_split(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> bool:
    """Whether this product runs as one numba loop of BLAS GEMV blocks (``gemv_numba``): a
    matrix-vector product (m or n is 1), which BLAS's GEMM would pack into panels first (see
    ``gemv_numba``: 1.6x slower on one thread, 1.9x on two, on the development machine)."""
    return (out.shape[-1] == 1 or out.shape[-2] == 1) and gemv_numba.usable(A, B, out)


def _gemv_blocks(
    A: np.ndarray, B: np.ndarray, out: np.ndarray, parts: int, limit: bool
) -> np.ndarray:
    """``gemv_numba.matmul`` over ``parts`` blocks, with BLAS on one thread (``limit``: set it
    here; a "pool"-mode plan call already did)."""
    if A.ndim < out.ndim or B.ndim < out.ndim:  # leading 1s broadcast like numpy's (views)
        A = A.reshape((1,) * (out.ndim - A.ndim) + A.shape)
        B = B.reshape((1,) * (out.ndim - B.ndim) + B.shape)
    if not limit:
        return gemv_numba.matmul(A, B, out, parts)
    with single_threaded_blas():
        return gemv_numba.matmul(A, B, out, parts)


def split_parts() -> int:
    """Blocks of a split product: one per thread, at most TL_NUM_THREADS (config.host_threads)."""
    from ..numba import threads as numba_threads

    return min(host_pool.helper_count() + 1, numba_threads.thread_count())


def _grid(nb: int, m: int, n: int) -> np.ndarray:
    return _grid_of(nb, m, n, split_parts())


@functools.lru_cache(maxsize=256)
def _grid_of(nb: int, m: int, n: int, parts: int) -> np.ndarray:
    return gemm_numba.grid(nb, m, n, parts)


def describe(mode: str, blas_own: bool = False) -> str:
    """The line print(plan) shows about a CPU plan's threads (``blas_own``: a "pool"-mode plan
    that ``blas_bound`` hands to BLAS's threads)."""
    threads = host_pool.helper_count() + 1
    lib = "MKL" if mkl.available() else "BLAS"
    if mode == "pool" and blas_own:
        return f"threads: pool (unbatched GEMMs only: one {lib} call each, on BLAS's own threads)"
    if mode == "pool" and lib == "MKL":
        how = (
            "whole on MKL's threads (numba's OpenMP pool)"
            if config.mkl_split() is False
            else "split into single-threaded MKL blocks on one numba loop, or whole where "
            "that timed faster for the product"
        )
        return f"threads: pool ({threads} threads for every step; GEMMs {how})"
    if mode == "blas" and lib == "MKL":
        return f"threads: blas (GEMMs one MKL call each; {threads} threads for other steps)"
    if mode == "pool" and blas_own:
        return "threads: pool (unbatched GEMMs only: one BLAS call each, on BLAS's own threads)"
    if mode == "pool":
        where = (
            "one numba loop"
            if SPLIT == "numba" and gemm_numba.available()
            else "the helper threads"
        )
        return (
            f"threads: pool ({threads} threads for every step; GEMMs split into "
            f"single-threaded BLAS blocks on {where})"
        )
    return f"threads: blas (GEMMs on BLAS's own threads; {threads} threads for other steps)"
