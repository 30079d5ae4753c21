"""The syntax tree of a TensorLogic program: Datalog rules, tensor equations and declarations.

Every node keeps the line and column where it starts so that later stages can point at it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

Scalar = Union[str, int, float, bool]


@dataclass(frozen=True)
class Pos:
    """A 1-based line and column in the program text."""

    line: int
    col: int

    def __str__(self) -> str:
        return f"line {self.line}, column {self.col}"


NOWHERE = Pos(0, 0)


def where(pos: Pos) -> str:
    """`` at line L, column C`` or nothing when the position is unknown."""
    return f" at {pos}" if pos.line else ""


# ---------------------------------------------------------------------- Datalog
@dataclass(frozen=True)
class Var:
    """A variable; ``_`` (anonymous) variables get a unique name each when parsed."""

    name: str
    pos: Pos = NOWHERE
    anonymous: bool = False


@dataclass(frozen=True)
class Const:
    """A constant: a Python string, int or float. ``"1"`` and ``1`` are different constants."""

    value: Scalar
    pos: Pos = NOWHERE


@dataclass(frozen=True)
class Arith:
    """An arithmetic term ``left op right`` with op one of ``+ - * / %``."""

    op: str
    left: Term
    right: Term
    pos: Pos = NOWHERE


Term = Union[Var, Const, Arith]


def term_vars(t: Term) -> list[Var]:
    """The variables of a term, in order."""
    if isinstance(t, Var):
        return [t]
    if isinstance(t, Arith):
        return term_vars(t.left) + term_vars(t.right)
    return []


@dataclass(frozen=True)
class Atom:
    """``pred(t1, ..., tn)``; a nullary atom has no arguments."""

    pred: str
    args: tuple[Term, ...]
    pos: Pos = NOWHERE

    @property
    def arity(self) -> int:
        """Number of arguments."""
        return len(self.args)

    def variables(self) -> list[Var]:
        """The variables in argument order (with repeats)."""
        return [v for a in self.args for v in term_vars(a)]


@dataclass(frozen=True)
class Literal:
    """A body atom, possibly negated (``not p(X)``)."""

    atom: Atom
    negated: bool = False


COMPARISONS = ("=", "!=", "<", "<=", ">", ">=")


@dataclass(frozen=True)
class Comparison:
    """A built-in comparison ``left op right`` between terms (variables, constants, arithmetic)."""

    op: str
    left: Term
    right: Term
    pos: Pos = NOWHERE


BodyItem = Union[Literal, Comparison]


@dataclass(frozen=True)
class Rule:
    """``head :- body.``; a rule with an empty body is a fact."""

    head: Atom
    body: tuple[BodyItem, ...] = ()
    pos: Pos = NOWHERE


# ---------------------------------------------------------------------- tensor equations
@dataclass(frozen=True)
class Index:
    """An index name in a tensor reference; ``marked`` is the paper's ``p'.`` softmax mark."""

    name: str
    marked: bool = False
    pos: Pos = NOWHERE


@dataclass(frozen=True)
class Ref:
    """A tensor ``W[i,j]`` (brackets) or a relation used as a tensor ``R(x,y)`` (parentheses)."""

    name: str
    indices: tuple[Index, ...]
    relation: bool = False
    pos: Pos = NOWHERE


@dataclass(frozen=True)
class Number:
    """A numeric literal."""

    value: float
    pos: Pos = NOWHERE


@dataclass(frozen=True)
class Call:
    """A nonlinearity applied elementwise: ``relu(...)``, ``sig(x, T)``, ``softmax(...)``."""

    func: str
    args: tuple[Expr, ...]
    pos: Pos = NOWHERE


@dataclass(frozen=True)
class BinOp:
    """``left op right`` with op one of ``+ - * /``; ``*`` (or juxtaposition) is a join."""

    op: str
    left: Expr
    right: Expr
    pos: Pos = NOWHERE


@dataclass(frozen=True)
class Neg:
    """Unary minus."""

    operand: Expr
    pos: Pos = NOWHERE


Expr = Union[Ref, Number, Call, BinOp, Neg]


@dataclass(frozen=True)
class Equation:
    """``LHS[idx] op= expr`` with op ``""`` (sum), ``"max"`` or ``"avg"`` projection."""

    lhs: Ref
    expr: Expr
    projection: str = "sum"
    pos: Pos = NOWHERE


@dataclass(frozen=True)
class Declaration:
    """``W: float32[4, n]``: a tensor given as data with its dtype and shape (ints or symbols)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...] | None
    pos: Pos = NOWHERE


@dataclass
class ProgramAST:
    """Everything one program text holds, in order of appearance."""

    rules: list[Rule] = field(default_factory=list)
    equations: list[Equation] = field(default_factory=list)
    declarations: list[Declaration] = field(default_factory=list)
    queries: list[Atom] = field(default_factory=list)  # ``?- atom.`` lines, in order
    #: relations declared with Souffle's ``.decl name(attr: type, ...)``: name -> arity
    relations: dict[str, int] = field(default_factory=dict)
