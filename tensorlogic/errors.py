"""Error classes. Every user-facing failure raises a TensorLogicError subclass.

Each error carries a short machine-readable ``code`` and a message that names what was wrong,
where it happened (node name, program line/column) and what was expected.
"""

from __future__ import annotations


class TensorLogicError(Exception):
    """Base class of every error the library raises on purpose."""

    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None, **context: object) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.context = context


class SpecError(TensorLogicError):
    """A malformed einsum specification."""

    code = "spec_error"


class ShapeError(TensorLogicError):
    """Operand shapes that do not fit together."""

    code = "shape_error"


class DTypeError(TensorLogicError):
    """An unsupported dtype or a dtype mismatch."""

    code = "dtype_error"


class GraphError(TensorLogicError):
    """A malformed graph: unknown nodes or ops, cycles, missing outputs, bad arguments."""

    code = "graph_error"


class InputError(TensorLogicError):
    """Inputs given to a plan that are missing, extra, mis-shaped, mis-typed or not finite."""

    code = "input_error"


class SerializationError(TensorLogicError):
    """A saved graph that cannot be read: malformed, corrupted, or beyond the accepted bounds."""

    code = "serialization_error"


class BackendError(TensorLogicError):
    """A backend that is unknown, unavailable, or cannot run a step."""

    code = "backend_error"


class MemoryBudgetError(TensorLogicError):
    """A plan whose planned memory exceeds the allowed budget."""

    code = "memory_budget"


class ProgramError(TensorLogicError):
    """A TensorLogic / Datalog program that cannot be parsed or evaluated.

    ``code`` is one of ``parse_error``, ``arity_mismatch``, ``unbound_variable``,
    ``cyclic_negation``, ``unknown_predicate``, ``max_iterations`` and friends.
    """

    code = "program_error"


class GradError(TensorLogicError):
    """A gradient that cannot be taken: an unknown or non-float ``wrt``, a non-scalar loss,
    an op without a derivative where one is needed."""

    code = "grad_error"


class MissingDependencyError(TensorLogicError, ImportError):
    """An optional dependency (an extra such as ``plot``) that a feature needs is not installed."""

    code = "missing_dependency"


class UnknownPredicateError(ProgramError, KeyError):
    """A query of a relation the program never mentions (also a KeyError, for dict lookups)."""

    code = "unknown_predicate"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
