"""Row programs (``ops.ROW_PROGRAMS``) rendered to array calls: the host kernels of every row op
and of the reductions that no single combine computes (logsumexp).

``RowKernel(name, dtype, axes, eps)`` turns a program once into a list of calls of the op
table's numpy functions (each writing into a buffer with ``out=``) and of the array module's
reductions, so a call costs what a hand-written kernel costs. Values live in

- the input ``x`` and the output ``out``, which may be the same array: nothing is written to
  ``out`` while ``x`` is still to be read;
- full-size buffers (maps, and expressions a reduce step reads) and per-row buffers (reduce
  and let values), each reused as soon as the value in it is dead.

A map is computed once, into ``out`` itself when ``x`` is no longer read. softmax thus runs as
max, subtract, exp (in ``out``), sum, scale; layer_norm as sum, centre (in ``out``), square,
sum, scale: the passes and temporaries of the hand-written kernels these programs replaced.
The buffers are scratch of the plan's arena (``scratch``) or, when the caller passes none,
allocated per call; they may be longer than a block needs (a fused kernel's last block).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...errors import BackendError
from ...ir import ops

# slots of a call's operands and destinations (then the full-size buffers, then the per-row)
_X, _OUT, _INV_N, _EPS = 0, 1, 2, 3
_FIRST_BUF = 4
# the ufunc whose reduction is each combine of the reduction table (max/min propagate NaN)
_COMBINE_UFUNC = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


@dataclass(frozen=True)
class _Call:
    """``fn(*args, out=dest)`` (or a reduction of args[0] over the row axes into dest); an
    argument is ``(True, slot)`` or ``(False, constant)``."""

    fn: Callable[..., Any]
    args: tuple[tuple[bool, Any], ...]
    dest: int
    reduce: bool = False


class _Schedule:
    """The calls of one program and its buffer counts (the compiler of ``RowKernel``)."""

    def __init__(self, name: str, xp, dtype: np.dtype) -> None:
        if name not in ops.ROW_PROGRAMS:
            raise BackendError(f"no row program for {name!r} (ops.ROW_PROGRAMS)")
        prog = ops.ROW_PROGRAMS[name]
        self.xp, self.dtype = xp, dtype
        self.calls: list[_Call] = []
        self.n_full = self.n_row = 0
        self.full_slot: set[int] = {_X, _OUT}
        self.free: dict[bool, list[int]] = {True: [], False: []}  # by fullness
        self.loc: dict[str, int] = {"x": _X}
        self.last = {"x": 0}  # the last step reading each value
        for i, st in enumerate(prog):
            for n in _leaves(st.expr):
                self.last[n] = i
        self.out_free = prog[-1].kind == "write"  # a reduction's out holds only its result
        result = prog[-1].expr if prog[-1].kind == "result" else None
        for i, st in enumerate(prog):
            dying = [self.loc[n] for n in _leaves(st.expr) if n in self.loc and self.last[n] == i]
            if st.kind == "reduce":
                full = self._full(st.expr)
                if not full:
                    raise BackendError(f"row program {name}: a reduce step must read the row")
                src = self.loc[st.expr] if isinstance(st.expr, str) else None
                tmp = None
                if src is None:
                    tmp = src = self._temp(True)
                    self._emit(st.expr, src)
                # a reduction whose result is this value reduces straight into out
                dest = _OUT if result == st.name else self._take(False, dying)
                ufunc = getattr(xp, _COMBINE_UFUNC[ops.REDUCTION_TABLE[st.combine].combine])
                self.calls.append(_Call(ufunc.reduce, ((True, src),), dest, reduce=True))
                if tmp is not None:
                    self._release(tmp)
            elif st.kind in ("let", "map"):
                if st.name not in self.last:
                    continue  # a value no later step reads
                full = self._full(st.expr)
                if st.kind == "let" and full:
                    raise BackendError(f"row program {name}: let {st.name} reads the row")
                if full and self.out_free and self.last["x"] <= i:
                    dest = _OUT
                    self.out_free = False
                else:
                    dest = self._take(full, dying)
                self._emit(st.expr, dest)
            elif st.kind in ("write", "result"):
                if not (isinstance(st.expr, str) and self.loc.get(st.expr) == _OUT):
                    self._emit(st.expr, _OUT)
            else:
                raise BackendError(f"row program {name}: unknown step kind {st.kind!r}")
            if st.kind in ("reduce", "let", "map") and st.name in self.last:
                self.loc[st.name] = dest
            for n in _leaves(st.expr):
                if self.last.get(n) == i and n in self.loc:
                    slot = self.loc.pop(n)
                    if slot == _OUT:
                        self.out_free = True
                    elif slot >= _FIRST_BUF and slot not in self.loc.values():
                        self._release(slot)

    # buffers -----------------------------------------------------------------------------

    def _new(self, full: bool) -> int:
        # slots are numbered in creation order; ``RowKernel`` maps them to buffers
        slot = _FIRST_BUF + self.n_full + self.n_row
        if full:
            self.n_full += 1
            self.full_slot.add(slot)
        else:
            self.n_row += 1
        return slot

    def _temp(self, full: bool) -> int:
        pool = self.free[full]
        return pool.pop() if pool else self._new(full)

    def _take(self, full: bool, dying: list[int]) -> int:
        """A destination: a buffer whose value dies at this step (the evaluator keeps reads of
        it before the write), a free one, or a new one."""
        for s in dying:
            if s >= _FIRST_BUF and (s in self.full_slot) == full:
                return s
        return self._temp(full)

    def _release(self, slot: int) -> None:
        pool = self.free[slot in self.full_slot]
        if slot not in pool:
            pool.append(slot)

    # expressions -------------------------------------------------------------------------

    def _full(self, e) -> bool:
        """Whether an expression varies along the row (reads ``x`` or a map)."""
        return any(self.loc.get(n) in self.full_slot for n in _leaves(e))

    def _reads(self, e, slot: int) -> bool:
        """Whether an expression reads a value that lives in ``slot`` (x and out may alias)."""
        for n in _leaves(e):
            s = self.loc.get(n)
            if s == slot or {s, slot} == {_X, _OUT}:
                return True
        return False

    def _arg(self, e) -> tuple[bool, Any]:
        if isinstance(e, str):
            if e == "inv_n":
                return True, _INV_N
            if e == "eps":
                return True, _EPS
            return True, self.loc[e]
        return False, self.dtype.type(e)

    def _emit(self, e, dest: int) -> None:
        """Calls computing expression ``e`` (an op of the table) into ``dest``."""
        if not isinstance(e, tuple):
            self.calls.append(_Call(_copy, (self._arg(e),), dest))
            return
        op, *args = e
        row = ops.ELEMENTWISE[op]
        full_dest = dest in self.full_slot
        compound = [j for j, a in enumerate(args) if isinstance(a, tuple)]
        # one operand is computed in dest itself: a full one into a full dest, and only when
        # no other operand reads what dest holds now
        into = next(
            (
                j
                for j in compound
                if self._full(args[j]) == full_dest
                and not any(self._reads(a, dest) for k, a in enumerate(args) if k != j)
            ),
            None,
        )
        refs: list[tuple[bool, Any]] = [None] * len(args)  # type: ignore[list-item]
        temps = []
        for j in compound:
            if j != into:
                t = self._temp(self._full(args[j]))
                temps.append(t)
                self._emit(args[j], t)
                refs[j] = (True, t)
        if into is not None:
            self._emit(args[into], dest)
            refs[into] = (True, dest)
        for j, a in enumerate(args):
            if refs[j] is None:
                refs[j] = self._arg(a)
        aliased = any(is_slot and (s == dest or {s, dest} == {_X, _OUT}) for is_slot, s in refs)
        if aliased and not row.alias_safe:
            t = self._temp(full_dest)
            self.calls.append(_Call(row.numpy, tuple(refs), t))
            self.calls.append(_Call(_copy, ((True, t),), dest))
            temps.append(t)
        else:
            self.calls.append(_Call(row.numpy, tuple(refs), dest))
        for t in temps:
            self._release(t)


_WHERE = ops.ELEMENTWISE[ops.WHERE].numpy


def _same_slot(a: int, b: int) -> bool:
    """Whether two slots may hold the same memory (``x`` and ``out`` may alias)."""
    return a == b or {a, b} == {_X, _OUT}


# comparisons and their negations (exact with NaN: NaN == y is False, NaN != y is True)
_NEGATED = {np.equal: np.not_equal, np.not_equal: np.equal}
_COMPARES = (np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal)


def _dead_after(calls, k: int, slot: int) -> bool:
    """Whether no call after k reads ``slot`` before writing it."""
    if slot < _FIRST_BUF:
        return False
    for c in calls[k + 1 :]:
        if any(is_slot and v == slot for is_slot, v in c.args):
            return False
        if c.dest == slot:
            return True
    return True


def _render_where(k: int, c: _Call, args: list[str], mask: str, negated: str | None) -> list[str]:
    """A select as copies under a mask (the table's function tests, per call, whether out
    aliases an operand); ``mask`` is the source of the condition as a bool array, ``negated``
    of its negation (None: not at hand). The mask comes first: the condition may live in dest.
    """
    (_, _), a, b = c.args
    _, va, vb = args
    if b == (True, c.dest):  # dest holds b already: a where the condition holds
        return [f"    _copyto(s{c.dest}, {va}, where={mask})"]
    if a == (True, c.dest) and negated is not None:  # dest holds a: b where it does not
        return [f"    _copyto(s{c.dest}, {vb}, where={negated})"]
    if not any(is_slot and _same_slot(v, c.dest) for is_slot, v in c.args):
        return [
            f"    _m{k} = {mask}",
            f"    _copyto(s{c.dest}, {vb})",
            f"    _copyto(s{c.dest}, {va}, where=_m{k})",
        ]
    return []  # dest may or may not be an operand (x and out): the table's function decides


def _args(c: _Call, k: int, env: dict) -> list[str]:
    """Call k's operands as source (slots ``s{j}``, constants bound in ``env``)."""
    args = []
    for j, (is_slot, v) in enumerate(c.args):
        if is_slot:
            args.append(f"s{v}")
        else:
            env[f"_c{k}_{j}"] = v
            args.append(f"_c{k}_{j}")
    return args


def _straight_line(
    calls, n_slots: int, axes: tuple, xp=np, step_args: dict | None = None
) -> Callable[..., None]:
    """The calls as one Python function of the slots (``s0`` the input, ``s1`` the output,
    then 1 / the row length, the epsilon and the buffers), with the functions and constants
    bound as globals: a call costs its numpy calls and nothing more.

    ``step_args`` (``inv_n`` and ``eps`` values) makes it a plan step's function instead,
    ``run(a, s1)``: ``a`` the step's operands (x, then the buffers), those two bound."""
    env: dict[str, Any] = {
        "_axes": axes,
        "_copyto": xp.copyto,
        "_ne": xp.not_equal,
        "_eq": xp.equal,
    }
    if step_args is None:
        lines = [f"def run({', '.join(f's{j}' for j in range(n_slots))}):"]
    else:
        env.update(s2=step_args["inv_n"], s3=step_args["eps"])
        bufs = [f"s{j}" for j in range(_FIRST_BUF, n_slots)]
        lines = ["def run(a, s1):", f"    {', '.join(['s0', *bufs])}, = a"]
    rendered = [_args(c, k, env) for k, c in enumerate(calls)]
    skip = set()
    for k, c in enumerate(calls):
        if k in skip:
            continue
        env[f"_f{k}"] = c.fn
        args = rendered[k]
        if c.reduce:
            lines.append(f"    _f{k}({args[0]}, axis=_axes, keepdims=True, out=s{c.dest})")
            continue
        nxt = calls[k + 1] if k + 1 < len(calls) else None
        if (
            c.fn in _COMPARES
            and nxt is not None
            and nxt.fn is _WHERE
            and nxt.args[0] == (True, c.dest)
            and _dead_after(calls, k + 1, c.dest)
        ):
            # a comparison that only the next select reads: its bool result is the mask
            env[f"_g{k}"] = _NEGATED.get(c.fn)
            mask = f"_f{k}({', '.join(args)})"
            neg = f"_g{k}({', '.join(args)})" if c.fn in _NEGATED else None
            where = _render_where(k + 1, nxt, rendered[k + 1], mask, neg)
            if where:
                lines += where
                skip.add(k + 1)
                continue
        if c.fn is _WHERE:
            cond = args[0]
            where = _render_where(k, c, args, f"_ne({cond}, 0)", f"_eq({cond}, 0)")
            if where:
                lines += where
                continue
        lines.append(f"    _f{k}({', '.join(args)}, out=s{c.dest})")
    exec(compile("\n".join(lines), "<row program>", "exec"), env)  # noqa: S102
    return env["run"]


def _copy(src, out):
    out[...] = src
    return out


def _leaves(e) -> list[str]:
    if isinstance(e, str):
        return [e]
    if isinstance(e, tuple):
        return [n for a in e[1:] for n in _leaves(a)]
    return []


class RowKernel:
    """The host kernel of a row op or reduction over ``axes`` (which may count from the end,
    so one kernel serves blocks of any leading shape): ``kernel(x, out, bufs=None)``.

    ``out`` has x's shape (a row op) or x's shape with ``axes`` removed or kept as 1 (a
    reduction); it may be ``x`` itself. ``bufs`` are ``scratch(x_shape)``'s buffers (or longer
    flat ones).
    """

    def __init__(self, name: str, dtype, axes: tuple[int, ...], eps: float = 0.0, xp=np):
        self.name, self.dtype, self.axes, self.xp = name, np.dtype(dtype), tuple(axes), xp
        self.eps = self.dtype.type(eps)
        sched = _Schedule(name, xp, self.dtype)
        self.calls = tuple(sched.calls)
        self.n_full, self.n_row = sched.n_full, sched.n_row
        # buffer slots in creation order, full or per-row
        self._full_slots = sorted(sched.full_slot - {_X, _OUT})
        self.row_op = name in ops.ROW_OPS
        self._shapes: dict[tuple, tuple] = {}  # x's shape -> (kept shape, 1 / row length, scratch)
        self._run = _straight_line(self.calls, _FIRST_BUF + self.n_full + self.n_row, self.axes, xp)

    def kept_shape(self, shape: tuple) -> tuple:
        """``shape`` with the row axes kept as 1 (the shape of a per-row value)."""
        red = {a % len(shape) for a in self.axes}
        return tuple(1 if k in red else d for k, d in enumerate(shape))

    def scratch(self, x_shape: tuple) -> tuple:
        """(shape, dtype) of each buffer, in the order ``bufs`` takes them."""
        kd = self.kept_shape(tuple(x_shape))
        return tuple(
            (tuple(x_shape) if s in self._full_slots else kd, self.dtype.name)
            for s in range(_FIRST_BUF, _FIRST_BUF + self.n_full + self.n_row)
        )

    def _shape(self, shape: tuple) -> tuple:
        got = self._shapes.get(shape)
        if got is None:
            kd = self.kept_shape(shape)
            n = max(math.prod(shape) // max(math.prod(kd), 1), 1)
            got = self._shapes[shape] = (kd, self.dtype.type(1.0 / n), self.scratch(shape))
        return got

    def step_function(self, x_shape: tuple) -> Callable[[list, Any], None] | None:
        """``run(a, out)`` for a plan step over ``x_shape``: ``a`` holds x (of this dtype) and
        the ``scratch(x_shape)`` buffers, ``out`` x's shape (a row op) or the kept-axes shape
        (a reduction); the per-call checks and slot list of ``__call__`` are done here, once.
        None for an empty x (``__call__`` handles it)."""
        x_shape = tuple(x_shape)
        if math.prod(x_shape) == 0:
            return None
        _, inv_n, _ = self._shape(x_shape)
        n = _FIRST_BUF + self.n_full + self.n_row
        return _straight_line(self.calls, n, self.axes, self.xp, {"inv_n": inv_n, "eps": self.eps})

    def __call__(self, x, out, bufs=None):
        xp = self.xp
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        if x.size == 0:
            return out
        kd, inv_n, specs = self._shape(x.shape)
        target = out
        if not self.row_op:
            # the result per row, in out's memory when that is a plain view
            if out.flags.c_contiguous:
                target = out.reshape(kd)
            else:
                target = xp.empty(kd, self.dtype)
        slots: list[Any] = [x, target, inv_n, self.eps]
        if bufs is None:
            slots += [xp.empty(want, dt) for want, dt in specs]
        else:
            for b, (want, _) in zip(bufs, specs):
                slots.append(
                    b if b.shape == want else b.reshape(-1)[: math.prod(want)].reshape(want)
                )
        self._run(*slots)
        if target is not out:
            out[...] = target.reshape(out.shape)
        return out
