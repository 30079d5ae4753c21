"""Tensor handles: a node of a graph, with numpy-like operators that add nodes to that graph."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import GraphError
from . import ops
from .node import Dim, Node

if TYPE_CHECKING:
    from .graph import EinsumGraph


class Tensor:
    """A handle on a graph node; arithmetic on handles adds nodes to the same graph."""

    __slots__ = ("graph", "id")
    __array_priority__ = 1000  # make numpy defer to our reflected operators

    def __init__(self, graph: EinsumGraph, node_id: int) -> None:
        self.graph = graph
        self.id = node_id

    @property
    def node(self) -> Node:
        """The node record."""
        return self.graph.node(self.id)

    @property
    def shape(self) -> tuple[Dim, ...]:
        """Inferred shape (dims may be symbols)."""
        return self.graph.node(self.id).shape

    @property
    def dtype(self) -> str:
        """Inferred dtype name."""
        return self.graph.node(self.id).dtype

    @property
    def name(self) -> str:
        """Node name."""
        return self.graph.node(self.id).name

    @property
    def ndim(self) -> int:
        """Rank."""
        return len(self.shape)

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, shape={self.shape}, dtype={self.dtype})"

    def __hash__(self) -> int:
        return hash((id(self.graph), self.id))

    def __bool__(self) -> bool:
        raise GraphError(
            "a Tensor has no truth value at graph-build time; use g.where or comparisons"
        )

    def _bin(self, op, other, reflected=False):
        a, b = (other, self) if reflected else (self, other)
        return self.graph.binary(op, a, b)

    def __add__(self, o):
        return self._bin("add", o)  # noqa: E704

    def __radd__(self, o):
        return self._bin("add", o, True)  # noqa: E704

    def __sub__(self, o):
        return self._bin("sub", o)  # noqa: E704

    def __rsub__(self, o):
        return self._bin("sub", o, True)  # noqa: E704

    def __mul__(self, o):
        return self._bin("mul", o)  # noqa: E704

    def __rmul__(self, o):
        return self._bin("mul", o, True)  # noqa: E704

    def __truediv__(self, o):
        return self._bin("div", o)  # noqa: E704

    def __rtruediv__(self, o):
        return self._bin("div", o, True)  # noqa: E704

    def __pow__(self, o):
        return self._bin("pow", o)  # noqa: E704

    def __rpow__(self, o):
        return self._bin("pow", o, True)  # noqa: E704

    def __gt__(self, o):
        return self._bin("gt", o)  # noqa: E704

    def __ge__(self, o):
        return self._bin("ge", o)  # noqa: E704

    def __lt__(self, o):
        return self._bin("lt", o)  # noqa: E704

    def __le__(self, o):
        return self._bin("le", o)  # noqa: E704

    def __eq__(self, o):
        return self._bin("eq", o)  # type: ignore[override]  # noqa: E704

    def __ne__(self, o):
        return self._bin("ne", o)  # type: ignore[override]  # noqa: E704

    def __neg__(self):
        return self.graph.unary("neg", self)  # noqa: E704

    def __abs__(self):
        return self.graph.unary("abs", self)  # noqa: E704

    def __matmul__(self, o):
        return self.graph.einsum("...ij,...jk->...ik", self, o)

    @property
    def T(self) -> "Tensor":
        """Axes reversed."""
        return self.graph.transpose(self)

    def sum(self, axis=None, keepdims=False):
        return self.graph.sum(self, axis, keepdims)  # noqa: D102,E704

    def mean(self, axis=None, keepdims=False):
        return self.graph.mean(self, axis, keepdims)  # noqa: D102,E704

    def max(self, axis=None, keepdims=False):
        return self.graph.max(self, axis, keepdims)  # noqa: D102,E704

    def min(self, axis=None, keepdims=False):
        return self.graph.min(self, axis, keepdims)  # noqa: D102,E704

    def reshape(self, *shape):
        return self.graph.reshape(
            self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        )  # noqa: D102,E501,E704

    def transpose(self, *perm):
        return self.graph.transpose(self, perm or None)  # noqa: D102,E704

    def astype(self, dtype):
        return self.graph.cast(self, dtype)  # noqa: D102,E704


def _install_tensor_unary() -> None:
    for op in ops.UNARY_OPS:
        if hasattr(Tensor, op):
            continue

        def method(self, _op=op):
            return self.graph.unary(_op, self)

        method.__name__ = op
        method.__doc__ = f"Elementwise {op}."
        setattr(Tensor, op, method)
    for op in ops.ROW_OPS:
        if ops.takes_eps(op):

            def rmethod(self, axis=-1, eps=ops.LAYER_NORM_EPS, _op=op):
                return self.graph._rowop(_op, self, axis, None, {"eps": eps})

            rmethod.__doc__ = f"{op} over one axis (see EinsumGraph.{op})."
        else:

            def rmethod(self, axis=-1, _op=op):
                return self.graph._rowop(_op, self, axis, None)

            rmethod.__doc__ = f"{op} over one axis."

        rmethod.__name__ = op
        setattr(Tensor, op, rmethod)


_install_tensor_unary()
