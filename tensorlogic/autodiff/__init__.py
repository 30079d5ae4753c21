"""Reverse-mode differentiation of einsum graphs: ``grad`` and ``vjp`` (graph to graph)."""

from __future__ import annotations

from .rules import RULES
from .transform import DIFFERENTIABLE_LEAVES, grad, vjp

__all__ = ["DIFFERENTIABLE_LEAVES", "RULES", "grad", "vjp"]
