"""How a large product of a "pool"-mode plan runs on MKL: split into blocks on numba's threads or
whole on MKL's, with its constant operand packed once where it has one; timed on its first call
and kept per machine.

The split (``gemm_numba``: one single-threaded MKL call per block on numba's threads) lets a
plan's GEMMs and its other kernels share one pool, and its blocks finish their tiles in cache;
but every block packs its own panels of both operands on every call. MKL's own threads pack each
panel once and share it; and a weight (a plan constant, ``constants``) can be packed in MKL's
format once (``cblas_?gemm_pack``), for the whole product (``mkl.prepare_packed``) or per block
(``gemm_numba.prepare_packed``), and never again. Neither way wins every shape: on the 16-core
Xeon host (one process, interleaved, medians) 1024x2048x512 ran 1.82 ms split against 2.30
whole; 2048x1024x1024 4.25 split, 4.04 whole, 3.66 whole with its weight packed; 256x1024x1024
0.77 split, 0.50 split with the weight packed per block; 1024x512x2048 2.12 split, 1.74 whole
packed. So the first call of a product of at least ``RACE_MIN_FLOPS`` times each candidate on
its real operands (alternating, ``REPS`` rounds, medians) and keeps the fastest; the split stays
unless another way is at least ``MARGIN`` faster. The choice is remembered per machine, threads
and product (shapes, layout, dtype, epilogue, the operand packed) in ``TL_CACHE_DIR``, so
later processes pay nothing. TL_MKL_SPLIT set either way skips it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import numpy as np

from .. import config
from ..runtime import json_cache
from . import gemm_numba, mkl

RACE_MIN_FLOPS = 64_000_000
REPS = 5
MARGIN = 0.03
CHOICE_FILE = "gemm_choice.json"

_lock = threading.Lock()
_chosen: dict[str, str] = {}  # cache key -> the candidate's name


def races(A: np.ndarray, B: np.ndarray, out: np.ndarray, settings: tuple) -> bool:
    """Whether this product's way is chosen by timing: one 2-D product on MKL of at least
    ``RACE_MIN_FLOPS`` in a "pool"-mode plan call whose settings (``numpy.threads._settings``)
    leave TL_MKL_SPLIT unset."""
    where, mkl_split = settings[0], settings[2]
    return (
        where == "plan"
        and mkl_split is None
        and out.ndim == A.ndim == B.ndim == 2
        and 2 * out.size * A.shape[1] >= RACE_MIN_FLOPS
        and mkl.available()
        and mkl.supports(A, B, out)
        and out.flags.c_contiguous
    )


def product(A: np.ndarray, B: np.ndarray, out: np.ndarray, split, blocks) -> Callable:
    """``call(A, B, out)``: the fastest way to run this product, timed now on these operands
    unless known: ``split`` (over ``blocks``), MKL whole, and where an operand is a plan
    constant the same two with that operand packed once."""
    ways, which = _ways(A, B, out, split, blocks, None)
    return _choose(f"product packs={which}", ways, (A, B, out))


def epilogue(A, B, out, bias, residual, act: str | None, split, blocks: np.ndarray) -> Callable:
    """``call(A, B, out, bias, residual)``: ``product``'s choice for a product with an epilogue
    (the split ways finish each tile in its block; the whole ways finish the same tiles after,
    on numba's threads)."""
    res = residual is not None
    ways, which = _ways(A, B, out, split, blocks, (act, res))
    kind = f"epilogue {act} residual={res} packs={which}"
    return _choose(kind, ways, (A, B, out, bias, residual))


def _ways(A, B, out, split, blocks, finish: tuple | None) -> tuple[dict, str | None]:
    """(name -> factory of each way's call, the operand the packed ways pack or None);
    ``finish``: the epilogue's (activation, residual?), None for a product alone."""
    act, res = finish or (None, False)

    def whole(call):  # MKL whole, then the epilogue's tiles on numba's threads
        if finish is None:
            return call
        return gemm_numba.then_epilogue(call, blocks, out.dtype.name, act, res)

    ways = {"split": lambda: split, "whole": lambda: whole(mkl.prepare(A, B, out))}
    which = mkl.constant_side(A, B, out)
    if which is not None:
        ways["split packed"] = lambda: gemm_numba.prepare_packed(
            A, B, out, blocks, which, split, act, res
        )
        ways["whole packed"] = lambda: whole(mkl.prepare_packed(A, B, out, which))
    return ways, which


def _key(kind: str, A: np.ndarray, B: np.ndarray, out: np.ndarray) -> str:
    layout = (mkl.blas_layout(A), mkl.blas_layout(B))
    parts = (mkl.race_key(mkl.loaded_path()), mkl.threads(), kind, A.shape, B.shape, layout)
    return "|".join(map(str, (*parts, out.dtype.name)))


def _choose(kind: str, ways: dict[str, Callable[[], Callable]], args: tuple) -> Callable:
    """The chosen way, built (``ways`` hold factories: a way's loop compiles, about a second,
    only where it runs): known for ``args``' key, or raced among all of them now."""
    key = _key(kind, *args[:3])
    path = config.cache_dir() / CHOICE_FILE
    name = _chosen.get(key) or json_cache.read_entries(path).get(key)
    if name not in ways:
        with _lock:  # one race at a time; a call that waited here finds the choice made
            name = _chosen.get(key)
            if name not in ways:
                built = {n: make() for n, make in ways.items()}
                name = race(built, args)
                json_cache.store_entry(path, key, name)
                _chosen[key] = name
                return built[name]
    _chosen[key] = name
    return ways[name]()


def race(ways: dict[str, Callable], args: tuple, reps: int = REPS) -> str:
    """The name of the fastest way to run ``args`` (median of ``reps`` alternating rounds after
    one warm-up call each); "split" unless another is ``MARGIN`` faster."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for call in ways.values():
        call(*args)  # packs a constant, compiles a loop: not timed
    order = list(ways.items())
    for r in range(reps):
        for name, call in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            call(*args)
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = min(med, key=med.__getitem__)
    return best if med[best] < (1 - MARGIN) * med["split"] else "split"
