"""Testing tools: differential checks of every backend and opt level against numpy.

- ``assert_backends_agree(graph, backends=..., opt_levels=..., rtol=..., atol=...)`` runs a graph
  on fresh random inputs everywhere and compares each result with the numpy backend at O0 (and
  that with an independent reference interpreter), with tolerances derived from the graph.
- ``assert_grads_agree(graph, of=..., wrt=...)`` checks ``tl.grad``/``tl.vjp`` against central
  finite differences in float64 on every backend at O0 and O2.
- ``graph_cases()`` (needs hypothesis) draws random graphs covering every op.
- ``bounds.analyze`` gives value ranges and rounding-error bounds of a graph's nodes.
"""

from __future__ import annotations

from typing import Any

from . import bounds
from .agree import (
    AgreementReport,
    Tolerance,
    assert_backends_agree,
    choose_ranges,
    derive_tolerances,
    random_inputs,
)
from .grads import GradReport, assert_grads_agree
from .reference import evaluate as reference_evaluate

_HYPOTHESIS_NAMES = ("GraphCase", "graph_cases")


def __getattr__(name: str) -> Any:
    # the strategies need hypothesis, a test-only dependency: import them on first use
    if name in _HYPOTHESIS_NAMES:
        from . import strategies

        return getattr(strategies, name)
    raise AttributeError(f"module 'tensorlogic.testing' has no attribute {name!r}")


__all__ = [
    "AgreementReport",
    "GradReport",
    "GraphCase",
    "Tolerance",
    "assert_backends_agree",
    "assert_grads_agree",
    "bounds",
    "choose_ranges",
    "derive_tolerances",
    "graph_cases",
    "random_inputs",
    "reference_evaluate",
]
