"""Silence numpy's floating-point warnings for the duration of a plan call, cheaply.

Plans compute what the graph says (``log(0) = -inf``, overflow to inf) without warnings, like the
reference interpreter. ``np.errstate`` does that but costs about 1 us per call, a visible share of
a small plan. numpy 2 keeps the error state in a context variable; setting it directly costs a
tenth of that. Other numpy versions fall back to ``np.errstate``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import numpy as np

try:  # numpy >= 2.0
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj

    _IGNORE = _make_extobj(all="ignore")

    def quiet() -> Any:
        """Enter the quiet state; returns the token that ``restore`` takes."""
        return _extobj_contextvar.set(_IGNORE)

    def restore(token: Any) -> None:
        """Leave the quiet state entered by ``quiet``."""
        _extobj_contextvar.reset(token)

except (ImportError, AttributeError, TypeError):  # pragma: no cover - older numpy

    def quiet() -> Any:
        """Enter the quiet state; returns the token that ``restore`` takes."""
        ctx: AbstractContextManager = np.errstate(all="ignore")
        ctx.__enter__()
        return ctx

    def restore(token: Any) -> None:
        """Leave the quiet state entered by ``quiet``."""
        token.__exit__(None, None, None)
