"""The arrays that compiled plans hold as constants, so that a kernel may keep a transformed copy.

A plan's constants never change: the graph keeps read-only copies of what the user gave, and
folded values are the optimizer's own. A kernel that sees one of them as an operand (or a view of
one) may therefore prepare it once, as MKL's packed GEMM operand (``mkl.prepare_packed``), instead
of on every call. ``register`` records a plan's constant arrays when the plan is built;
``constant_root`` answers, for any array, the registered array it is a view of, or None. Entries
are weak: a constant dies with the last plan or graph that holds it.
"""

from __future__ import annotations

import weakref

import numpy as np

_ROOTS: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def _root(x: np.ndarray) -> np.ndarray:
    """The array that owns ``x``'s memory (itself, or the end of its chain of bases)."""
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x


def register(arrays) -> None:
    """Record the plan's constant host arrays (others, such as device arrays, are skipped)."""
    for arr in arrays:
        if isinstance(arr, np.ndarray):
            root = _root(arr)
            _ROOTS[id(root)] = root


def constant_root(x: object) -> np.ndarray | None:
    """The registered constant ``x`` is a view of (or is), else None."""
    if not isinstance(x, np.ndarray):
        return None
    root = _root(x)
    return root if _ROOTS.get(id(root)) is root else None
