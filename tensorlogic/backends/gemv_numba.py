"""Matrix-vector products split over numba's threads, each block one single-threaded BLAS GEMV.

The "pool" thread mode cuts large matmuls into blocks of single-threaded BLAS calls
(``gemm_numba``). A product whose m or n is 1 is a GEMV: one pass over the matrix, bound by
memory. Handed to BLAS's GEMM it is first packed into panels, then run by a micro-kernel built
for several columns; on the 2-core development machine (AMD EPYC, OpenBLAS's Haswell kernels) a
331776 x 24 matrix times a vector took 18-19 ms as one single-threaded GEMM and 11-13 ms as one
GEMV, and 30 ms as two GEMM blocks against 16 ms on OpenBLAS's own threads (numpy's matmul calls
GEMV there). This module runs such products as GEMV blocks in one numba ``prange`` loop, the
same way ``gemm_numba`` runs GEMM blocks: rows of the matrix cut over the threads, or whole
products of a batch.

``available()`` is False where numpy's BLAS exports no CBLAS ``sgemv``/``dgemv`` under one of
the names in ``_SYMBOLS``; callers then keep their other split. Only float32 and float64.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np


from .gemm_numba import cblas_symbols, find_cblas
from ..runtime.memo import build_once
from .mkl import batch_offsets, blas_layout

_SYMBOLS = cblas_symbols("gemv")
_ROW_MAJOR, _NO_TRANS = 101, 111

_lock = threading.RLock()
_gemvs: dict | None = None  # dtype name -> (ctypes gemv, item size); {} when unavailable
_kernels: dict = {}  # dtype name -> compiled split loop


def _find_gemvs():
    """ctypes (sgemv, dgemv) of numpy's BLAS, or None."""
    from .numpy.threads import blas_libraries

    # order, trans, M, N, alpha, A, lda, X, incX, beta, Y, incY
    return find_cblas(
        blas_libraries(),
        "gemv",
        lambda idx, real, ptr: (
            [ctypes.c_int] * 2 + [idx] * 2 + [real, ptr, idx, ptr, idx] + [real, ptr, idx]
        ),
    )


def _compile(gemv, itemsize: int):
    import numba

    from .numba import threads as numba_threads

    numba_threads.configure()

    @numba.njit(parallel=True, nogil=True, cache=False)
    def split(blocks, a_ptr, a_off, a_sr, trans, lda, k, x_ptr, x_off, incx, y_ptr, y_off, incy):
        # blocks[i] = (batch, row0, row1) of the result; the matrix's rows step by a_sr
        # elements (1 when BLAS reads it transposed, as k x rows with leading dim lda)
        for i in numba.prange(blocks.shape[0]):
            bt, r0, r1 = blocks[i, 0], blocks[i, 1], blocks[i, 2]
            pa = a_ptr + (a_off[bt] + r0 * a_sr) * itemsize
            px = x_ptr + x_off[bt] * itemsize
            py = y_ptr + (y_off[bt] + r0 * incy) * itemsize
            if trans == _NO_TRANS:
                gemv(_ROW_MAJOR, trans, r1 - r0, k, 1.0, pa, lda, px, incx, 0.0, py, incy)
            else:
                gemv(_ROW_MAJOR, trans, k, r1 - r0, 1.0, pa, lda, px, incx, 0.0, py, incy)

    return split


def _load() -> dict:
    """dtype name -> its CBLAS gemv (empty where numpy's BLAS has none we can enter)."""
    global _gemvs
    if _gemvs is None:
        with _lock:
            if _gemvs is None:
                found = _find_gemvs()
                _gemvs = (
                    {} if found is None else {"float32": (found[0], 4), "float64": (found[1], 8)}
                )
    return _gemvs


def _kernel(dtype: str):
    """The split loop for one dtype, compiled on first use (not cacheable on disk: it holds
    the library's function address)."""
    return build_once(_kernels, dtype, _lock, lambda: _compile(*_load()[dtype]))


def available() -> bool:
    """Whether GEMVs can be split over numba's threads here (numpy's BLAS has CBLAS gemv)."""
    return bool(_load())


@functools.lru_cache(maxsize=256)
def grid(nb: int, rows: int, parts: int, align: int = 16) -> np.ndarray:
    """Blocks (batch, row0, row1) that share a batch of ``rows``-long results out over
    ``parts`` threads: each product cut into the number of row blocks (at most ``parts``, none
    under ``align`` rows where the product has room) that leaves the busiest thread the least
    work, whole products where cutting gains nothing (24 products on 16 threads: two row blocks
    each, 3 per thread, where whole products give some threads 2 and others 1)."""
    parts = max(1, parts)
    best, per = None, 1
    for p in range(1, min(parts, max(1, rows // align)) + 1):
        busiest = -(-nb * p // parts) / p  # products' worth of work on the busiest thread
        if best is None or busiest < best - 1e-9:
            best, per = busiest, p
    step = -(-rows // per)
    if rows >= per * align:
        step = -(-step // align) * align
    cuts = list(range(0, rows, step)) + [rows]
    out = [(b, cuts[i], cuts[i + 1]) for b in range(nb) for i in range(len(cuts) - 1)]
    blocks = np.array(out, dtype=np.int64).reshape(-1, 3)
    blocks.flags.writeable = False  # shared by every call of this shape
    return blocks


def _offsets(x: np.ndarray, batch: tuple[int, ...]) -> np.ndarray:
    """Element offset of every batch entry of ``x`` (C order over ``batch``; an axis of size 1
    is broadcast)."""
    it = x.itemsize
    return batch_offsets(
        batch, tuple(0 if d == 1 else s // it for d, s in zip(x.shape[:-2], x.strides[:-2]))
    )


def _as_column(A: np.ndarray, B: np.ndarray, out: np.ndarray):
    """(matrix, vector, result) of the product with the vector as a column: a (1 x k) @
    (k x n) product is (B^T @ A^T)^T, swapped axes of the same memory."""
    if out.shape[-1] == 1:
        return A, B, out
    return B.swapaxes(-1, -2), A.swapaxes(-1, -2), out.swapaxes(-1, -2)


def _step(x: np.ndarray, axis: int) -> int:
    """Elements between neighbours along ``axis`` (1 where the axis has one element)."""
    return x.strides[axis] // x.itemsize if x.shape[axis] > 1 else 1


def usable(A: np.ndarray, B: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``matmul`` takes this product: m or n is 1, float32 or float64 alike, operands
    of ``out``'s rank whose batch axes are its sizes or 1, non-negative strides in whole
    elements, a matrix BLAS reads as it lies and a vector and result stepping forward."""
    if out.shape[-1] != 1 and out.shape[-2] != 1:
        return False
    if out.dtype.name not in ("float32", "float64") or not A.dtype == B.dtype == out.dtype:
        return False
    if not A.ndim == B.ndim == out.ndim or A.shape[-1] == 0:
        return False
    batch = zip(A.shape[:-2], B.shape[:-2], out.shape[:-2])
    if any(a not in (1, o) or b not in (1, o) for a, b, o in batch):
        return False
    it = out.itemsize
    if any(s < 0 or s % it for x in (A, B, out) for s in x.strides):
        return False
    M, X, Y = _as_column(A, B, out)
    return blas_layout(M) is not None and _step(X, -2) > 0 and _step(Y, -2) > 0 and available()


def matmul(A: np.ndarray, B: np.ndarray, out: np.ndarray, parts: int) -> np.ndarray:
    """``out = A @ B`` for a batch of matrix-vector products (``usable``), cut into about
    ``parts`` GEMV blocks run on numba's threads."""
    M, X, Y = _as_column(A, B, out)
    trans, lda = blas_layout(M)
    rows, k = M.shape[-2:]
    batch = out.shape[:-2]
    nb = int(np.prod(batch)) if batch else 1
    split = _kernel(out.dtype.name)
    from .numba import threads as numba_threads

    with numba_threads.launch_lock():  # serializes launches only on a non-thread-safe layer
        split(
            grid(nb, rows, parts),
            M.ctypes.data,
            _offsets(M, batch),
            lda if trans == _NO_TRANS else 1,  # elements from one row of M to the next
            trans,
            lda,
            k,
            X.ctypes.data,
            _offsets(X, batch),
            _step(X, -2),
            Y.ctypes.data,
            _offsets(Y, batch),
            _step(Y, -2),
        )
    return out
