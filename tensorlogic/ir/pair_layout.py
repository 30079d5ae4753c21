"""Pairwise contractions without layout copies, and the measured choice between layouts.

A pairwise contraction ``A[batch, left, contr] x B[batch, contr, right]`` becomes one matmul
once each operand is viewed as a stack of matrices. Merging all of ``left`` (and of ``right``)
into one matrix dimension often needs a transposing copy (a 16^5 tensor whose contracted index
sits in the middle: 1M elements copied to contract 16 numbers each). A strided batch needs
none: the contracted letters and a run of ``left`` letters form the matrix (one of its two
dims with a unit stride, the other with any stride: BLAS's leading dimension), every other
letter becomes a batch axis of the matmul (numpy's and the thread split's walk any strides and
broadcast over the other operand), and each matrix goes to BLAS as it lies, transposed where
its unit stride is on the other side. It pays one BLAS call per batch element instead of the
copy; which is faster depends on the shapes and the machine, so the host backends time both on
the real shapes when the step is large enough for it to matter (``choose``).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

# Rough costs for steps too small to be worth timing: a transposing copy per byte and a BLAS
# call of numpy's batched matmul loop (2-vCPU AVX-512 machine, measured on 16^5 float64).
COPY_NS_PER_BYTE = 0.25
CALL_NS = 400.0
NS_PER_FLOP = 0.1  # small GEMMs on one core
# Steps whose cheaper estimate is below this are chosen by the estimates alone.
MEASURE_MIN_NS = 20_000.0
# Operands larger than this are not materialized to time a step (the estimates decide).
MEASURE_MAX_BYTES = 64 << 20
# Candidates estimated slower than this many times the best are not timed (and a choice whose
# every other candidate is that far off is made by the estimates alone).
CLEAR_RATIO = 4.0
# Timing an einsum's layouts may cost at most this many of its estimated calls (the compile
# target: a first compile of at most ten calls, or 100 ms for short calls), at least
# MEASURE_BUDGET_MIN_S and never more than MEASURE_BUDGET_S.
MEASURE_BUDGET_CALLS = 3.0
MEASURE_BUDGET_MIN_S = 0.02
MEASURE_BUDGET_S = 1.0
# What entering a timing context costs the first time in a process (threadpoolctl's scan of
# the loaded libraries: 10-20 ms), counted against the budget of the first timing.
CONTEXT_SETUP_S = 0.015
# Runs of each timed candidate: a warm-up (first touch of its scratch) and the best of two.
TIMING_RUNS = 3
# What the timing runs inside: a host backend sets BLAS's threads as its plan calls will run
# them. A context factory entered only when a step is timed, since setting it up can cost more
# than planning (threadpoolctl's first scan of the loaded libraries: ~30 ms per process).
TIMING_CONTEXT: contextvars.ContextVar[Callable[[], Any]] = contextvars.ContextVar(
    "pair_layout_timing_context", default=contextlib.nullcontext
)


@dataclass(frozen=True)
class StridedPair:
    """How ``matmul`` runs a pair with no copy: each operand transposed by ``perm``, reshaped
    to ``shape`` (merging only axes adjacent in memory) and, with ``swap``, its last two axes
    swapped; the product has shape ``mm_shape`` and letters ``result``."""

    result: str
    perm_a: tuple[int, ...]
    shape_a: tuple[int, ...]
    swap_a: bool
    perm_b: tuple[int, ...]
    shape_b: tuple[int, ...]
    swap_b: bool
    mm_shape: tuple[int, ...]
    calls: int  # matrices in the batch (BLAS calls)
    rows: str = ""  # the letters of the product's rows and columns (the end of ``result``)
    cols: str = ""

    def views(self, A, B):
        """The operands as matmul stacks (views of their memory)."""
        Av = A.transpose(self.perm_a).reshape(self.shape_a)
        Bv = B.transpose(self.perm_b).reshape(self.shape_b)
        return (
            Av.swapaxes(-1, -2) if self.swap_a else Av,
            Bv.swapaxes(-1, -2) if self.swap_b else Bv,
        )


def _run(term: str, letters: list[str]) -> str | None:
    """``letters`` as they appear in ``term`` when they are adjacent there, else None."""
    pos = sorted(term.index(c) for c in letters)
    if pos[-1] - pos[0] != len(pos) - 1:
        return None
    return term[pos[0] : pos[-1] + 1]


def _matrix(term: str, k_run: str, free: set[str]) -> tuple[str, bool] | None:
    """The free letters that form the matrix with ``k_run`` in ``term`` without a copy, and
    whether the matrix is stored with K innermost ([M][K]); None if none has a unit stride.

    One of the two matrix dims must have a unit stride, the other may have any (BLAS's leading
    dimension): with K innermost, M is the run of free letters nearest before K, batch letters
    in between or not; otherwise M is the run of free letters that ends the term."""
    p = term.index(k_run[0])
    if p + len(k_run) == len(term):  # K innermost: [M][K]
        q = p
        while q > 0 and term[q - 1] not in free:
            q -= 1
        r = q
        while r > 0 and term[r - 1] in free:
            r -= 1
        return term[r:q], True
    r = len(term)
    while r > p + len(k_run) and term[r - 1] in free:
        r -= 1
    if r == len(term):  # the innermost letter is neither summed nor free: no unit stride
        return None
    return term[r:], False


def strided_pair(
    a: str,
    b: str,
    batch: list[str],
    contr: list[str],
    left: list[str],
    right: list[str],
    sizes: dict[str, int],
) -> StridedPair | None:
    """The copy-free matmul of C-contiguous operands ``a`` and ``b``, or None when their
    contracted letters are not adjacent in the same order in both, or a matrix would have no
    unit stride."""
    if not contr:
        return None
    k_run = _run(a, contr)
    if k_run is None or _run(b, contr) != k_run:
        return None
    ma = _matrix(a, k_run, set(left))
    mb = _matrix(b, k_run, set(right))
    if ma is None or mb is None:
        return None
    m_letters, a_mk = ma
    n_letters, b_nk = mb
    pa = [c for c in left if c not in m_letters]
    pb = [c for c in right if c not in n_letters]
    m, n, k = (math.prod(sizes[c] for c in g) for g in (m_letters, n_letters, k_run))
    lead_a = [sizes[c] for c in batch + pa] + [1] * len(pb)
    lead_b = [sizes[c] for c in batch] + [1] * len(pa) + [sizes[c] for c in pb]
    # the matrix letters keep their memory order, so merging them is a view
    mat_a = m_letters + k_run if a_mk else k_run + m_letters
    mat_b = n_letters + k_run if b_nk else k_run + n_letters
    perm_a = tuple(a.index(c) for c in batch + pa + list(mat_a))
    perm_b = tuple(b.index(c) for c in batch + pb + list(mat_b))
    shape_a = tuple(lead_a) + ((m, k) if a_mk else (k, m))
    shape_b = tuple(lead_b) + ((n, k) if b_nk else (k, n))
    lead = [sizes[c] for c in batch + pa + pb]
    return StridedPair(
        "".join(batch + pa + pb) + m_letters + n_letters,
        perm_a,
        shape_a,
        not a_mk,
        perm_b,
        shape_b,
        b_nk,
        tuple(lead) + (m, n),
        math.prod(lead),
        m_letters,
        n_letters,
    )


def estimate_ns(copied_bytes: int, calls: int, flops: int = 0) -> float:
    """The estimated time of a layout: its copies, its BLAS calls and its arithmetic."""
    return copied_bytes * COPY_NS_PER_BYTE + calls * CALL_NS + flops * NS_PER_FLOP


class Chooser:
    """Picks the fastest of the ways to run a pair: by timing on the real shapes the candidates
    the estimates cannot tell apart, when the step is large enough and timing them fits what
    is left of the einsum's budget; else by the estimates.

    The budget scales with the einsum's estimated call (``budget_for``): a network that runs
    in a millisecond does not spend tens of milliseconds timing layouts. Choices timed once are
    remembered for the process (``_TIMED``), so a step that recurs (a layer, the same pair in
    another einsum) is timed once.
    """

    def __init__(self, measure: bool, budget_s: float | Callable[[], float] = MEASURE_BUDGET_S):
        self.measure = measure
        # a callable is asked only when a step could be timed (most einsums have none)
        self._budget = budget_s
        self.spent = 0.0
        self.timed = 0  # choices timed here (for tests and reports)

    @property
    def budget_s(self) -> float:
        """Seconds of timing this chooser may spend."""
        if callable(self._budget):
            self._budget = self._budget()
        return min(self._budget, MEASURE_BUDGET_S)

    def choose(
        self,
        est: list[float],
        build: list[Callable[[], tuple[Callable, list]]],
        shapes: list[tuple[tuple[int, ...], str]],
        key: Any = None,
    ) -> int:
        """Index of the candidate to use. ``build[i]()`` gives (fn, scratch specs) of candidate
        i; ``shapes`` are the two operands' (shape, dtype); ``key``, when given, identifies
        the step and its candidates for the process-wide memo of timed choices."""
        best = min(range(len(est)), key=est.__getitem__)
        near = [i for i in range(len(est)) if est[i] <= CLEAR_RATIO * est[best]]
        if not self.measure or len(near) == 1 or est[best] < MEASURE_MIN_NS:
            return best
        nbytes = sum(math.prod(s) * np.dtype(d).itemsize for s, d in shapes)
        if nbytes > MEASURE_MAX_BYTES:
            return best
        if key is not None:
            key = (key, TIMING_CONTEXT.get())  # BLAS's threads as timed
            hit = _TIMED.get(key)
            if hit is not None:
                return hit
        # what timing would cost: each candidate run TIMING_RUNS times, the operands, and the
        # first entry of the timing context in this process
        context = TIMING_CONTEXT.get()
        cost_s = 1e-9 * (TIMING_RUNS * sum(est[i] for i in near) + COPY_NS_PER_BYTE * nbytes)
        cost_s += 0.0 if context in _entered else CONTEXT_SETUP_S
        if self.spent + cost_s > self.budget_s:
            return best
        t0 = time.perf_counter()
        ops = [np.ones(s, d) for s, d in shapes]
        with context():
            _entered.add(context)
            times = {i: _time(*build[i](), ops) for i in near}
        self.spent += time.perf_counter() - t0
        self.timed += 1
        picked = min(times, key=times.__getitem__)
        if key is not None:
            with _timed_lock:
                _TIMED[key] = picked
                while len(_TIMED) > _TIMED_SIZE:
                    _TIMED.pop(next(iter(_TIMED)))
        return picked


def budget_for(flops: int, pairs: int) -> float:
    """Seconds of layout timing an einsum of ``flops`` in ``pairs`` products may spend."""
    call_ns = estimate_ns(0, pairs, flops)
    return max(MEASURE_BUDGET_CALLS * call_ns * 1e-9, MEASURE_BUDGET_MIN_S)


# timed choices by step (see ``Chooser``): a timing is a property of the shapes and the host
_TIMED: dict[Any, int] = {}
_TIMED_SIZE = 4096
_timed_lock = threading.Lock()
_entered: set = set()  # timing contexts entered in this process


def _time(fn: Callable, specs: list[tuple[tuple[int, ...], str]], ops: list[Any]) -> float:
    """Best of two timed runs of a pair function (after one warm-up) with its own scratch."""
    scratch = [np.empty(s, d) for s, d in specs]
    fn(np, ops[0], ops[1], None, scratch)
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        fn(np, ops[0], ops[1], None, scratch)
        best = min(best, time.perf_counter() - t0)
    return best
