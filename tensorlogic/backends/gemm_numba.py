"""GEMMs split over numba's threads, each block one single-threaded call into numpy's BLAS.

The "pool" thread mode (``numpy/threads.py``) runs a plan with BLAS limited to one thread and splits
each large matmul into blocks. Handing those blocks to Python threads costs a GIL round per
block (slicing, the ufunc call's setup): on many cores that serializes tens of microseconds per
thread on every GEMM. Here the blocks run inside one numba ``prange`` loop that calls the BLAS
library numpy loaded (found through threadpoolctl, entered through ctypes): no GIL, one
parallel-region launch per GEMM, on the same OpenMP threads that run the numba backend's
generated kernels, so a plan's GEMMs and its row ops share one pool.

``available()`` is False where numpy's BLAS exports no CBLAS ``sgemm``/``dgemm`` under one
of the names in ``_SYMBOLS`` (or threadpoolctl finds no BLAS library); callers then keep the
Python-thread split. Only float32 and float64 go through here.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ..runtime.memo import build_once
from .mkl import batch_offsets, blas_layout

_ROW_MAJOR = 101


def cblas_symbols(routine: str) -> tuple:
    """(single, double) CBLAS names of ``routine`` ("gemm", "gemv") and whether their integers
    are 64-bit, in the order tried: numpy >= 2 ships scipy-openblas (ILP64, prefixed and
    suffixed), numpy 1.x openblas64_, other builds and MKL plain CBLAS."""
    return (
        (f"scipy_cblas_s{routine}64_", f"scipy_cblas_d{routine}64_", True),
        (f"cblas_s{routine}64_", f"cblas_d{routine}64_", True),
        (f"scipy_cblas_s{routine}", f"scipy_cblas_d{routine}", False),
        (f"cblas_s{routine}", f"cblas_d{routine}", False),
    )


_SYMBOLS = cblas_symbols("gemm")


def find_cblas(paths, routine: str, argtypes):
    """ctypes (single, double) ``routine`` of the first library in ``paths`` that exports both
    under one of ``cblas_symbols`` names, with ``argtypes(idx, real, ptr)`` set, or None.
    Pointers travel as 64-bit integers (the same registers as a pointer on x86-64 and aarch64),
    so a numba kernel passes addresses it computed itself."""
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for s_name, d_name, ilp64 in cblas_symbols(routine):
            if hasattr(lib, s_name) and hasattr(lib, d_name):
                idx = ctypes.c_int64 if ilp64 else ctypes.c_int
                fns = []
                for name, real in ((s_name, ctypes.c_float), (d_name, ctypes.c_double)):
                    fn = getattr(lib, name)
                    fn.argtypes = argtypes(idx, real, ctypes.c_int64)
                    fn.restype = None
                    fns.append(fn)
                return tuple(fns)
    return None


_lock = threading.RLock()
# library ("mkl" or "numpy") -> {dtype name: (ctypes gemm, item size)}; {} when unavailable
_gemms: dict[str, dict] = {}
_kernels: dict = {}  # (library, dtype name) -> compiled split loop


def _library() -> str:
    """The BLAS the blocks call: MKL where it is in use (``backends.mkl``), else numpy's."""
    from . import mkl

    return "mkl" if mkl.available() else "numpy"


def _find_gemms(library: str):
    """ctypes (sgemm, dgemm) of the library, or None."""
    from .numpy.threads import blas_libraries

    if library == "mkl":
        from . import mkl

        paths = [mkl.loaded_path()]
    else:
        paths = blas_libraries()
    # order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc
    return find_cblas(
        paths,
        "gemm",
        lambda idx, real, ptr: (
            [ctypes.c_int] * 3 + [idx] * 3 + [real, ptr, idx, ptr, idx] + [real, ptr, idx]
        ),
    )


def _compile(gemm, itemsize: int):
    import numba

    from .numba import threads as numba_threads

    numba_threads.configure()

    @numba.njit(parallel=True, nogil=True, cache=False)
    def split(
        blocks, a_ptr, a_off, a_sr, ta, lda, b_ptr, b_off, b_sc, tb, ldb, c_ptr, c_off, c_sr, k
    ):
        # blocks[i] = (batch, row0, row1, col0, col1); offsets (per batch entry), strides and
        # leading dims in elements, the transposition flags chosen by the caller
        for i in numba.prange(blocks.shape[0]):
            bt, r0, r1 = blocks[i, 0], blocks[i, 1], blocks[i, 2]
            c0, c1 = blocks[i, 3], blocks[i, 4]
            pa = a_ptr + (a_off[bt] + r0 * a_sr) * itemsize
            pb = b_ptr + (b_off[bt] + c0 * b_sc) * itemsize
            pc = c_ptr + (c_off[bt] + r0 * c_sr + c0) * itemsize
            gemm(_ROW_MAJOR, ta, tb, r1 - r0, c1 - c0, k, 1.0, pa, lda, pb, ldb, 0.0, pc, c_sr)

    return split


# epilogue codes of the split loop with an epilogue (``epilogue.Epilogue.activation``)
ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2}


def _compile_epilogue(gemm, itemsize: int, dtype: str):
    """The split loop whose blocks each finish their tile, still in cache, with
    ``act(tile + bias [+ residual])`` (``ACTIVATIONS``; GELU in the tanh form written through
    exp, ``x / (1 + exp(-2u))``, as the numba backend's fused kernels compute it)."""
    import numba

    from .numba import threads as numba_threads

    numba_threads.configure()
    finish = _finisher(dtype)

    @numba.njit(parallel=True, nogil=True, cache=False)
    def split_epilogue(
        blocks, a_ptr, a_off, a_sr, ta, lda, b_ptr, b_off, b_sc, tb, ldb, c_ptr, c_off, c_sr, k,
        out, bias, res, act, has_res,
    ):  # fmt: skip
        for i in numba.prange(blocks.shape[0]):
            r0, r1 = blocks[i, 1], blocks[i, 2]
            c0, c1 = blocks[i, 3], blocks[i, 4]
            pa = a_ptr + (a_off[0] + r0 * a_sr) * itemsize
            pb = b_ptr + (b_off[0] + c0 * b_sc) * itemsize
            pc = c_ptr + (c_off[0] + r0 * c_sr + c0) * itemsize
            gemm(_ROW_MAJOR, ta, tb, r1 - r0, c1 - c0, k, 1.0, pa, lda, pb, ldb, 0.0, pc, c_sr)
            finish(out, bias, res, r0, r1, c0, c1, act, has_res)

    return split_epilogue


def _compile_packed(compute, itemsize: int, dtype: str):
    """The split loop whose blocks call ``cblas_?gemm_compute`` with one operand's block
    packed beforehand (``packed[i]``: its address for block i; ``pack_b``: B's, else A's),
    finishing their tiles as ``_compile_epilogue``'s do where ``act`` >= 0."""
    import numba

    from . import mkl
    from .numba import threads as numba_threads

    numba_threads.configure()
    finish = _finisher(dtype)
    packed_flag = mkl.PACKED

    @numba.njit(parallel=True, nogil=True, cache=False)
    def split_packed(
        blocks, packed, pack_b, a_ptr, a_sr, ta, lda, b_ptr, b_sc, tb, ldb, c_ptr, c_sr, k,
        out, bias, res, act, has_res,
    ):  # fmt: skip
        for i in numba.prange(blocks.shape[0]):
            r0, r1 = blocks[i, 1], blocks[i, 2]
            c0, c1 = blocks[i, 3], blocks[i, 4]
            pc = c_ptr + (r0 * c_sr + c0) * itemsize
            if pack_b:
                pa, fa = a_ptr + r0 * a_sr * itemsize, ta
                pb, fb = packed[i], packed_flag
            else:
                pa, fa = packed[i], packed_flag
                pb, fb = b_ptr + c0 * b_sc * itemsize, tb
            compute(_ROW_MAJOR, fa, fb, r1 - r0, c1 - c0, k, pa, lda, pb, ldb, 0.0, pc, c_sr)
            if act >= 0:
                finish(out, bias, res, r0, r1, c0, c1, act, has_res)

    return split_packed


def _find_compute(dtype: str):
    """MKL's ``cblas_?gemm_compute`` as numba calls it (pointers as 64-bit integers)."""
    from . import mkl

    lib = ctypes.CDLL(mkl.loaded_path())
    fn = getattr(lib, f"cblas_{'s' if dtype == 'float32' else 'd'}gemm_compute")
    real = ctypes.c_float if dtype == "float32" else ctypes.c_double
    i, ptr = ctypes.c_int, ctypes.c_int64
    fn.argtypes = [i] * 6 + [ptr, i, ptr, i, real, ptr, i]
    fn.restype = None
    return fn


def prepare_packed(A, B, out, blocks: np.ndarray, which: str, unpacked, act=None, res=False):
    """``call(A, B, out, bias=None, residual=None)``: ``prepare``'s split (``prepare_epilogue``'s
    where ``act``/``res`` or a bias is given) with the constant operand ``which`` ("A" or "B")
    packed by MKL once per block shape and place (``mkl.ConstantPacks``) instead of by every
    block on every call; ``unpacked`` runs where that operand is no plan constant. A (m, k), B
    (k, n), ``out`` (m, n) C-contiguous, operands ``mkl.can_pack`` takes."""
    from . import mkl

    dtype = out.dtype.name
    itemsize = out.itemsize
    key = ("packed", dtype)
    loop = build_once(
        _kernels, key, _lock, lambda: _compile_packed(_find_compute(dtype), itemsize, dtype)
    )
    ta, lda = mkl.blas_layout(A)
    tb, ldb = mkl.blas_layout(B)
    a_sr, b_sc, k = A.strides[0] // itemsize, B.strides[1] // itemsize, A.shape[1]
    if which == "B":
        pieces = [(c0 * b_sc, r1 - r0, c1 - c0, k) for _, r0, r1, c0, c1 in blocks]
        packs = mkl.ConstantPacks("B", tb, ldb, dtype, pieces)
    else:
        pieces = [(r0 * a_sr, r1 - r0, c1 - c0, k) for _, r0, r1, c0, c1 in blocks]
        packs = mkl.ConstantPacks("A", ta, lda, dtype, pieces)
    launch = _launcher(loop, blocks)
    code = ACTIVATIONS[act]  # -1 below: a product alone, no epilogue
    no_bias, no_residual = np.zeros(1, dtype), np.zeros((1, 1), dtype)
    n = out.shape[1]

    def call(A, B, out, bias=None, residual=None):
        addrs = packs.addresses(B if which == "B" else A)
        if addrs is None:
            return unpacked(A, B, out) if bias is None else unpacked(A, B, out, bias, residual)
        launch(
            addrs, which == "B", A.ctypes.data, a_sr, ta, lda, B.ctypes.data, b_sc, tb, ldb,
            out.ctypes.data, n, k, out, no_bias if bias is None else bias,
            residual if res else no_residual, code if bias is not None else -1, res,
        )  # fmt: skip
        return out

    return call


def _compile_finish(dtype: str):
    """The loop that finishes every tile of a product another call computed whole (MKL on its
    own threads), one block per thread as the split loop's epilogue does."""
    import numba

    from .numba import threads as numba_threads

    numba_threads.configure()
    finish = _finisher(dtype)

    @numba.njit(parallel=True, nogil=True, cache=False)
    def finish_tiles(blocks, out, bias, res, act, has_res):
        for i in numba.prange(blocks.shape[0]):
            r0, r1, c0, c1 = blocks[i, 1], blocks[i, 2], blocks[i, 3], blocks[i, 4]
            finish(out, bias, res, r0, r1, c0, c1, act, has_res)

    return finish_tiles


def _finisher(dtype: str):
    """``finish(out, bias, res, r0, r1, c0, c1, act, has_res)``: one tile's epilogue, in its
    own function so that its loops vectorize (numpy's error model: no division checks)."""
    import numba

    from .numba import fastmath

    t = np.dtype(dtype).type
    exp = fastmath.exp_f32 if dtype == "float32" else fastmath.exp_f64
    # gelu(v) = v / (1 + exp(-2 sqrt(2/pi) (v + 0.044715 v^3)))
    zero, one, two_c, cubic = t(0), t(1), t(-1.5957691216057308), t(0.044715)

    @numba.njit(nogil=True, cache=False, fastmath={"contract", "nsz", "arcp"}, error_model="numpy")
    def finish(out, bias, res, r0, r1, c0, c1, act, has_res):
        # indices from 0 over slices: numba then drops its negative-index wraparound, which
        # kept these loops scalar (GELU of a 256 x 1024 tile: 2.3 -> 0.4 ms)
        b = bias[c0:c1]
        for r in range(r0, r1):
            row = out[r, c0:c1]
            if has_res:
                rr = res[r, c0:c1]
                for j in range(row.shape[0]):
                    row[j] = row[j] + b[j] + rr[j]
            elif act == 0:
                for j in range(row.shape[0]):
                    row[j] = row[j] + b[j]
            elif act == 1:  # NaN stays NaN, as numpy's maximum(x, 0)
                for j in range(row.shape[0]):
                    v = row[j] + b[j]
                    row[j] = zero if v < zero else v
            else:
                for j in range(row.shape[0]):
                    v = row[j] + b[j]
                    row[j] = v / (one + exp(two_c * (v + cubic * v * v * v)))

    return finish


def _load(library: str) -> dict:
    """dtype name -> the library's CBLAS gemm (empty where it has none we can enter)."""

    def find() -> dict:
        fns = _find_gemms(library)
        return {} if fns is None else {"float32": (fns[0], 4), "float64": (fns[1], 8)}

    return build_once(_gemms, library, _lock, find)


def _kernel(dtype: str, epilogue: bool = False):
    """The split loop for one dtype (``epilogue``: the one that finishes tiles,
    ``_compile_epilogue``), compiled on first use (about a second; not cacheable on disk,
    since it holds the library's function address)."""
    key = (_library(), dtype, epilogue)
    if epilogue:
        return build_once(
            _kernels, key, _lock, lambda: _compile_epilogue(*_load(key[0])[dtype], dtype)
        )
    return build_once(_kernels, key, _lock, lambda: _compile(*_load(key[0])[dtype]))


def then_epilogue(product, blocks: np.ndarray, dtype: str, act: str | None, res: bool):
    """``call(A, B, out, bias, residual)``: ``product(A, B, out)`` (a whole GEMM on another
    pool of threads) and then ``act(out + bias [+ residual])`` over ``blocks`` of ``out`` on
    numba's threads, the tiles ``prepare_epilogue``'s blocks would finish."""
    finish = build_once(_kernels, ("finish", dtype), _lock, lambda: _compile_finish(dtype))
    launch = _launcher(finish, blocks)
    code = ACTIVATIONS[act]
    no_residual = np.zeros((1, 1), dtype)

    def call(A, B, out, bias, residual=None):
        product(A, B, out)
        launch(out, bias, residual if res else no_residual, code, res)
        return out

    return call


def available() -> bool:
    """Whether GEMMs can be split over numba's threads here (the BLAS in use has CBLAS gemm;
    MKL, called inside numba's OpenMP loop, runs each block on its calling thread)."""
    return bool(_load(_library()))


def grid(nb: int, m: int, n: int, parts: int, align_m: int = 8, align_n: int = 32) -> np.ndarray:
    """Blocks (batch, row0, row1, col0, col1) that cut a batch of m x n products into about
    ``parts`` pieces: whole batch entries first; within a product, a grid whose blocks are
    near square in (rows x k) + (k x cols) traffic (gm / gn ~ m / n), edges aligned to the
    micro-kernel tiles where the sizes allow."""
    gm, gn = _split(max(1, parts // nb) if nb < parts else 1, m, n, align_m, align_n)
    rows = _cuts(m, gm, align_m)
    cols = _cuts(n, gn, align_n)
    out = [
        (b, rows[i], rows[i + 1], cols[j], cols[j + 1])
        for b in range(nb)
        for i in range(len(rows) - 1)
        for j in range(len(cols) - 1)
    ]
    return np.array(out, dtype=np.int64).reshape(-1, 5)


def _split(per: int, m: int, n: int, align_m: int, align_n: int) -> tuple[int, int]:
    """(row blocks, column blocks) of one product: at most ``per`` blocks, none thinner than the
    alignment where the product has room; fewer blocks rather than thin ones (a 48-column
    product cut into 8 blocks of 6 columns packs all of A, rows x k, eight times over)."""
    for p in range(per, 0, -1):
        best = None
        for a in range(1, p + 1):
            b = p // a
            if p % a or a > max(1, m // align_m) or b > max(1, n // align_n):
                continue
            cost = b * m + a * n  # elements packed (x k): every block reads its A rows, B cols
            if best is None or cost < best[0]:
                best = (cost, a, b)
        if best is not None:
            return best[1], best[2]
    return 1, 1


def _cuts(n: int, parts: int, align: int) -> list[int]:
    step = -(-n // max(parts, 1))
    if n >= parts * align:
        step = -(-step // align) * align
    return list(range(0, n, step)) + [n] if n else [0, 0]


def matmul(A: np.ndarray, B: np.ndarray, out: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """``out = A @ B`` over the given blocks (``grid``): A (*batch, m, k), B (*batch, k, n),
    ``out`` (*batch, m, n) C-contiguous, A's and B's batch axes each of ``out``'s size or 1
    (broadcast), float32 or float64 alike. Batch axes may have any strides (views of heads
    inside a sequence layout); an operand BLAS cannot read as it is (no unit stride in its
    matrix dims) is copied first."""
    return prepare(A, B, out, blocks)(A, B, out)


def prepare(A: np.ndarray, B: np.ndarray, out: np.ndarray, blocks: np.ndarray):
    """``call(A, B, out)`` computing ``matmul(A, B, out, blocks)`` for operands of these
    shapes, strides and dtypes (any data): layouts, leading dims and batch offsets are worked
    out here once, so that a call reads three pointers and launches the loop once."""
    split, args = _prepared(A, B, out)
    launch = _launcher(split, blocks)

    def call(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> np.ndarray:
        pointers, _held = args(A, B, out)
        launch(*pointers)
        return out

    return call


def prepare_epilogue(
    A: np.ndarray, B: np.ndarray, out: np.ndarray, blocks: np.ndarray, act: str | None, res: bool
):
    """``call(A, B, out, bias, residual)`` computing ``out = act(A @ B + bias [+ residual])``
    (``ACTIVATIONS``; a residual only without an activation) over the blocks of one 2-D
    product, each block finishing its own tile: A (m, k), B (k, n), ``out`` (m, n)
    C-contiguous, ``bias`` (n,), ``residual`` (m, n) or None, all of ``out``'s dtype."""
    if out.ndim != 2 or (res and act is not None):
        raise ValueError("prepare_epilogue: a 2-D product; a residual only without activation")
    split, args = _prepared(A, B, out, epilogue=True)
    launch = _launcher(split, blocks)
    code = ACTIVATIONS[act]
    no_residual = np.zeros((1, 1), out.dtype)  # the loop's typed stand-in

    def call(A, B, out, bias, residual=None):
        pointers, _held = args(A, B, out)
        launch(*pointers, out, bias, residual if res else no_residual, code, res)
        return out

    return call


def _launcher(split, blocks):
    """``launch(*args)`` running ``split(blocks, *args)``, under the launch lock only on a
    threading layer that is not thread-safe."""
    from .numba import threads as numba_threads

    free, lock = numba_threads.launch_is_free, numba_threads.launch_lock

    def launch(*args) -> None:
        if free():
            split(blocks, *args)
        else:
            with lock():
                split(blocks, *args)

    return launch


def _prepared(A: np.ndarray, B: np.ndarray, out: np.ndarray, epilogue: bool = False):
    """(the split loop, ``args(A, B, out)``: its pointer, offset, stride and size arguments,
    and the operands those point into, copies included, which the caller holds meanwhile)."""
    split = _kernel(out.dtype.name, epilogue)
    copy_a, copy_b = blas_layout(A) is None, blas_layout(B) is None
    # a copy's layout is that of a C-contiguous array of the same shape
    la = blas_layout(np.empty(A.shape, A.dtype) if copy_a else A)
    lb = blas_layout(np.empty(B.shape, B.dtype) if copy_b else B)
    it = out.itemsize
    batch = out.shape[:-2]

    def layout(x: np.ndarray, copied: bool) -> tuple[np.ndarray, int, int]:
        """(batch offsets, row stride, column stride) in elements."""
        st = np.empty(x.shape, x.dtype).strides if copied else x.strides
        lead = len(batch) - (x.ndim - 2)  # missing leading axes broadcast
        sh, st = (1,) * lead + x.shape[:-2] + x.shape[-2:], (0,) * lead + st
        batch_st = tuple(0 if d == 1 else s // it for d, s in zip(sh[:-2], st[:-2]))
        return batch_offsets(batch, batch_st), st[-2] // it, st[-1] // it

    oa, a_sr, _ = layout(A, copy_a)
    ob, _, b_sc = layout(B, copy_b)
    oc, c_sr, _ = layout(out, False)
    ta, lda, tb, ldb, k = la[0], la[1], lb[0], lb[1], A.shape[-1]

    def args(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> tuple:
        """(the loop's arguments, the operands they point into: held until it has run)."""
        if copy_a:
            A = np.ascontiguousarray(A)
        if copy_b:
            B = np.ascontiguousarray(B)
        a = (A.ctypes.data, oa, a_sr, ta, lda, B.ctypes.data, ob, b_sc, tb, ldb)
        return (*a, out.ctypes.data, oc, c_sr, k), (A, B)

    return split, args
