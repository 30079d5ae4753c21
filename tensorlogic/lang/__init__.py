"""The TensorLogic language: tensor equations and Datalog rules compiled to einsum graphs."""

from __future__ import annotations

from .program import Program, load_program, parse

__all__ = ["Program", "load_program", "parse"]
