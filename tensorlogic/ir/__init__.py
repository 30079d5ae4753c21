"""The intermediate representation: einsum specs, op table, EinsumGraph."""

from .graph import EinsumGraph, Node, Tensor

__all__ = ["EinsumGraph", "Node", "Tensor"]
