"""Einsum calls the way users bring them: a generated corpus and a hypothesis strategy.

A call is a spec, its operands' shapes and dtypes, and which operands are Python scalars
(``np.einsum("i,->i", a, 2)``). Specs come in the styles of numpy's and opt_einsum's own test
suites (repeated indices, ellipsis, broadcasting size-1 dims, scalars, implicit outputs,
networks); every IR dtype appears, alone and mixed. ``numpy_result`` is what a call must give:
``np.einsum`` of the same operands.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import dtypes as dt

# numpy's test_einsum.py styles (single operand views and sums, ellipsis, broadcasting)
NUMPY_STYLE = (
    "ii",
    "ii->i",
    "iii",
    "iii->i",
    "ij->ji",
    "ij->i",
    "ij->j",
    "ij->",
    "ji",
    "i->",
    "...->...",
    "...i->...",
    "i...->...",
    "...ii->...i",
    "i...i->...i",
    "...ij->...ji",
    "ij...->...ij",
    "i...->",
    "ijk->kji",
    "iij->ij",
    "jii->ij",
    "i,i",
    "i,i->",
    "i,i->i",
    "i,j",
    "i,j->ij",
    "ij,j",
    "ij,j->i",
    "ji,j->i",
    "ij,jk",
    "ij,jk->ik",
    "ij,kj->ik",
    "ijk,jil->kl",
    "ijk,jkl->il",
    "...ij,...jk->...ik",
    "...ij,...jk",
    "ij...,jk...->ik...",
    "i...,i...",
    "...i,...i",
    "...,...",
    "i,->i",
    ",i->i",
    ",->",
    "ab,->ab",
    ",ab->ab",
    "a,->",
    "ba,b",
    "ba,b->",
    "ab,ab->",
    "ab,ab->ab",
    "ab,ab->ba",
    "abc,abc->",
    "ijkl,lk->ij",
    "ij,ij,ij->ij",
    "i,i,i->i",
    "ijk,ik->ij",
    "ii,ij->j",
    "ijj,jk->ik",
    "...i,ij,jk->...k",
    "i,ij,j->",
    "abc,cd,db->a",
    "bca,cdb,dbf,afc->",
)


def opt_einsum_specs() -> tuple[str, ...]:
    """The spec list of opt_einsum's own contraction tests (its test_contract.tests)."""
    from opt_einsum.tests.test_contract import tests

    return tuple(dict.fromkeys(tests))


@dataclass(frozen=True)
class EinsumCall:
    """One call: ``spec`` over operands of ``shapes``/``dtypes``; a ``scalars`` entry is the
    Python type ("int", "float", "complex", "bool") of a scalar operand, or None for an array."""

    spec: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    scalars: tuple[str | None, ...]

    def operands(self, seed: int) -> list[Any]:
        """Fresh random operands (never all zeros); scalars as Python numbers."""
        rng = np.random.default_rng(seed)
        out: list[Any] = []
        for shape, d, s in zip(self.shapes, self.dtypes, self.scalars):
            if s is not None:
                out.append(python_scalar(rng, s))
            else:
                out.append(random_array(rng, shape, d))
        return out

    def __str__(self) -> str:
        ops_ = [
            f"{s}" if s else f"{d}{list(sh)}"
            for sh, d, s in zip(self.shapes, self.dtypes, self.scalars)
        ]
        return f"{self.spec} [{', '.join(ops_)}]"


def python_scalar(rng: np.random.Generator, kind: str) -> Any:
    """A nonzero Python scalar of the given type."""
    if kind == "bool":
        return True
    if kind == "int":
        return int(rng.integers(2, 9))
    if kind == "float":
        return float(rng.uniform(0.5, 2.0))
    return complex(rng.uniform(0.5, 2.0), rng.uniform(-1.0, 1.0))


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random values of ``dtype``; integers span the type's whole range so sums wrap around."""
    k = dt.kind(dtype)
    if k == "b":
        a = rng.random(shape) < 0.6
    elif k in "iu":
        info = np.iinfo(dtype)
        lo, hi = (int(info.min), int(info.max)) if info.bits <= 16 else (-(1 << 20), 1 << 20)
        lo = max(lo, 0) if k == "u" else lo
        if info.bits == 64 and k == "u":
            a = rng.integers(0, np.iinfo(np.uint64).max, shape, dtype=np.uint64, endpoint=True)
        else:
            a = rng.integers(lo, hi, shape, endpoint=True)
    elif k == "c":
        a = rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)
    else:
        a = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
    return np.asarray(a).astype(dtype)


def _shapes(spec: str, rnd: random.Random) -> list[tuple[int, ...]] | None:
    """Operand shapes for ``spec``: letter sizes 1-4 (a size-1 dim of a letter broadcasts,
    as numpy allows), ellipses of 0-2 dims, right-aligned with size-1 broadcasting."""
    lhs = spec.split("->")[0]
    terms = lhs.split(",")
    sizes = {c: rnd.choice((2, 3, 4)) for c in lhs if c.isalpha()}
    ell = [rnd.choice((2, 3)) for _ in range(rnd.choice((0, 1, 2)))]
    shapes = []
    for t in terms:
        head, _, tail = t.partition("...")
        dims = [sizes[c] for c in head]
        if "..." in t:
            n = rnd.randint(0, len(ell))
            part = ell[len(ell) - n :]
            dims += [1 if rnd.random() < 0.2 else d for d in part]
            dims += [sizes[c] for c in tail]
        shapes.append(tuple(dims))
    return shapes


DTYPE_MIXES = (
    ("int8",),
    ("uint8",),
    ("int16",),
    ("int32",),
    ("int64",),
    ("uint16",),
    ("uint32",),
    ("uint64",),
    ("bool",),
    ("float16",),
    ("float32",),
    ("float64",),
    ("complex64",),
    ("complex128",),
    ("int8", "int16"),
    ("bool", "int32"),
    ("uint8", "int8"),
    ("int64", "uint64"),
    ("float32", "complex64"),
    ("int32", "float32"),
    ("float64", "complex64"),
    ("int16", "float16"),
)


def corpus(seed: int = 0) -> list[EinsumCall]:
    """Every numpy-style and opt_einsum spec, each with several dtype mixes (all dtypes
    appear for every style), plus scalar-operand calls; only calls numpy accepts."""
    rnd = random.Random(seed)
    calls: list[EinsumCall] = []
    specs = list(NUMPY_STYLE) + list(opt_einsum_specs())
    for k, spec in enumerate(specs):
        n = spec.split("->")[0].count(",") + 1
        mixes = [DTYPE_MIXES[(k + j * 7) % len(DTYPE_MIXES)] for j in range(3)]
        for mix in mixes:
            shapes = _shapes(spec, rnd)
            dts = tuple(mix[(j + rnd.randrange(len(mix))) % len(mix)] for j in range(n))
            scalars: list[str | None] = [None] * n
            for j, sh in enumerate(shapes):
                if sh == () and rnd.random() < 0.7:
                    scalars[j] = rnd.choice(("int", "float", "complex", "bool"))
            call = EinsumCall(spec, tuple(shapes), dts, tuple(scalars))
            if accepted(call):
                calls.append(call)
    return calls


def accepted(call: EinsumCall) -> bool:
    """Whether numpy accepts the call (the corpus holds only those)."""
    try:
        numpy_result(call, call.operands(0))
    except (ValueError, TypeError):
        return False
    return True


def numpy_result(call: EinsumCall, operands: list[Any]) -> np.ndarray:
    """What the call must give: ``np.einsum`` of the operands."""
    with np.errstate(all="ignore"):
        return np.asarray(np.einsum(call.spec, *operands))


@st.composite
def einsum_calls(draw, max_operands: int = 4) -> EinsumCall:
    """Random einsum calls: repeated indices, ellipsis, broadcasting, scalars, every dtype."""
    n = draw(st.integers(1, max_operands))
    letters = "abcdef"
    use_ell = draw(st.booleans())
    terms = []
    for _ in range(n):
        rank = draw(st.integers(0, 3))
        t = "".join(draw(st.sampled_from(letters)) for _ in range(rank))
        if use_ell and draw(st.booleans()):
            pos = draw(st.integers(0, len(t)))
            t = t[:pos] + "..." + t[pos:]
        terms.append(t)
    present = sorted(set("".join(terms)) - {"."})
    if draw(st.booleans()):
        out = "".join(c for c in present if draw(st.booleans()))
        out = ("..." if any("..." in t for t in terms) else "") + out
        spec = ",".join(terms) + "->" + out
    else:
        spec = ",".join(terms)
    rnd = random.Random(draw(st.integers(0, 2**31)))
    shapes = _shapes(spec, rnd)
    pool = draw(st.sampled_from(DTYPE_MIXES))
    dts = tuple(draw(st.sampled_from(pool)) for _ in range(n))
    scalars = tuple(
        draw(st.sampled_from((None, "int", "float", "complex", "bool"))) if sh == () else None
        for sh in shapes
    )
    return EinsumCall(spec, tuple(shapes), dts, scalars)


# ---------------------------------------------------------------- integer/bool op programs
# ops whose numpy meaning is one ufunc call, so numpy itself is the reference
INT_UFUNCS = {
    "neg": "negative",
    "abs": "absolute",
    "square": "square",
    "add": "add",
    "sub": "subtract",
    "mul": "multiply",
    "maximum": "maximum",
    "minimum": "minimum",
    "gt": "greater",
    "ge": "greater_equal",
    "lt": "less",
    "le": "less_equal",
    "eq": "equal",
    "ne": "not_equal",
}
INT_DTYPES = tuple(d for d in dt.DTYPES if dt.kind(d) in "biu")


@dataclass(frozen=True)
class IntProgram:
    """Elementwise ops over integer/bool inputs (mixed dtypes, weak Python int scalars),
    optionally ending in a reduction; exact in numpy, so results compare bit for bit.

    ``steps``: (op, args) with args ("in", k), ("tmp", j) or ("int", value)."""

    shape: tuple[int, ...]
    dtypes: tuple[str, ...]
    steps: tuple[tuple[str, tuple], ...]
    reduce: str | None

    def evaluate(self, arrays: list[np.ndarray]) -> np.ndarray:
        """numpy's result: each op one ufunc call (comparisons give bool, as numpy's)."""
        vals: list[Any] = []
        for op, args in self.steps:
            xs = [arrays[v] if k == "in" else vals[v] if k == "tmp" else v for k, v in args]
            with np.errstate(all="ignore"):
                r = getattr(np, INT_UFUNCS[op])(*xs)
            vals.append(r)
        res = vals[-1]
        return getattr(np, self.reduce)(res, axis=-1) if self.reduce else res

    def build(self, g, inputs: list) -> Any:
        """The same program on graph handles."""
        vals: list[Any] = []
        for op, args in self.steps:
            xs = [inputs[v] if k == "in" else vals[v] if k == "tmp" else v for k, v in args]
            vals.append(g.unary(op, xs[0]) if len(xs) == 1 else g.binary(op, xs[0], xs[1]))
        res = vals[-1]
        return g.reduce(self.reduce, res, axis=-1) if self.reduce else res


COMPLEX_OPS = ("neg", "square", "add", "sub", "mul", "eq", "ne")


@st.composite
def int_programs(
    draw,
    max_steps: int = 5,
    dtypes: tuple[str, ...] = INT_DTYPES,
    ops: tuple[str, ...] = tuple(sorted(INT_UFUNCS)),
) -> IntProgram:
    """Random elementwise programs numpy (and so the graph builder) accepts, over integer and
    bool inputs by default (exact); ``dtypes=dt.COMPLEX, ops=COMPLEX_OPS`` gives complex ones
    (compared to their precision)."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    dts = tuple(draw(st.lists(st.sampled_from(dtypes), min_size=1, max_size=3)))
    steps: list[tuple[str, tuple]] = []
    kinds: list[str] = []  # result dtype of each step, to skip ops numpy refuses
    for _ in range(draw(st.integers(1, max_steps))):
        op = draw(st.sampled_from(ops))
        arity = 1 if op in ("neg", "abs", "square") else 2
        refs = [("in", k) for k in range(len(dts))] + [("tmp", i) for i in range(len(steps))]
        args = [draw(st.sampled_from(refs)) for _ in range(arity)]
        if arity == 2 and draw(st.integers(0, 3)) == 0:
            args[draw(st.integers(0, 1))] = ("int", draw(st.integers(-3, 3)))
        arg_dts = [dts[v] if k == "in" else kinds[v] if k == "tmp" else None for k, v in args]
        tensor_dts = [d for d in arg_dts if d is not None]
        if not tensor_dts:
            continue
        try:
            res = _numpy_dtype(op, args, arg_dts)
        except (TypeError, OverflowError):
            continue
        steps.append((op, tuple(args)))
        kinds.append(res)
    if not steps:
        steps, kinds = (
            [("add", (("in", 0), ("in", 0)))],
            [_numpy_dtype("add", [("in", 0), ("in", 0)], [dts[0], dts[0]])],
        )
    ordered = all(dt.kind(d) != "c" for d in dts)
    reduce = draw(
        st.sampled_from((None, "sum", "prod", "max", "min") if ordered else (None, "sum", "prod"))
    )
    return IntProgram(shape, dts, tuple(steps), reduce)


def _numpy_dtype(op: str, args, arg_dts) -> str:
    for (kind, v), other in zip(args, reversed(arg_dts)):
        # a Python int the tensor's dtype cannot hold: numpy refuses it in arithmetic, and so
        # does the graph builder for comparisons too (numpy 2 compares it exactly)
        if (
            kind == "int"
            and other is not None
            and dt.kind(other) in "iu"
            and not (np.iinfo(other).min <= v <= np.iinfo(other).max)
        ):
            raise OverflowError(v)
    xs = [np.ones(1, d) if d is not None else v for (_, v), d in zip(args, arg_dts)]
    with np.errstate(all="ignore"):
        r = getattr(np, INT_UFUNCS[op])(*xs)
    return r.dtype.name


__all__ = [
    "COMPLEX_OPS",
    "EinsumCall",
    "IntProgram",
    "NUMPY_STYLE",
    "accepted",
    "corpus",
    "einsum_calls",
    "int_programs",
    "numpy_result",
    "opt_einsum_specs",
    "random_array",
]
