"""The graph-building API: leaves (inputs, constants, outputs) and one method per op kind.

``GraphBuilder`` is the builder half of ``EinsumGraph``: every method turns its operands into
handles of the graph and adds one node through ``add_node``, which checks and infers it; a method
that raises leaves the graph as it was.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import ml_dtypes
import numpy as np

from .. import dtypes
from ..errors import DTypeError, GraphError, ShapeError, SpecError
from . import infer, node_check, ops
from . import spec as einspec
from .node import Dim, check_dim
from .tensor import Tensor


def _atomic(method):
    """A builder method that leaves the graph as it was when it raises."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._transaction():
            return method(self, *args, **kwargs)

    return wrapper


def _check_kinds(src: np.ndarray, dt: str, label: str) -> None:
    """Refuse data the requested dtype cannot hold at all (checked before any cast)."""
    sk, dk = _kind(src.dtype), dtypes.kind(dt)
    if sk not in "biufc":  # strings, objects, dates, records
        raise DTypeError(f"{label}: cannot store {src.dtype} data as {dt}; expected numbers")
    if sk == "c" and dk != "c":
        raise DTypeError(
            f"{label}: complex data cannot be stored as {dt} (the imaginary part "
            "would be dropped); take .real explicitly"
        )


def _check_values(src: np.ndarray, dst: np.ndarray, label: str) -> None:
    """Refuse a cast that changed values: no silent truncation, wraparound or overflow."""
    sk, dk = _kind(src.dtype), _kind(dst.dtype)
    if dk in "biu" and not np.array_equal(src, dst):
        raise DTypeError(
            f"{label}: values are not exactly representable as {dst.dtype} "
            "(fractions, NaN or out of range)"
        )
    if sk in "fc" and dk in "fc" and not np.array_equal(np.isfinite(src), np.isfinite(dst)):
        raise DTypeError(
            f"{label}: values overflow {dst.dtype} (largest finite "
            f"{float(ml_dtypes.finfo(dst.dtype).max):.4g}); give a wider dtype"
        )


def _kind(dt: np.dtype) -> str:
    """numpy's kind letter, with bfloat16 (kind 'V' in ml_dtypes) counted as a float."""
    return "f" if dt == dtypes.bfloat16 else dt.kind


class GraphBuilder:
    """Builder methods of ``EinsumGraph`` (which provides ``add_node``, ``_insert`` and the
    node tables they use)."""

    # ------------------------------------------------------------------ leaves
    def input(self, name: str, shape: Sequence[Dim | None], dtype: object = "float32") -> "Tensor":
        """Declare a graph input. A dimension may be None or a symbol name like "B"."""
        if not isinstance(name, str) or not name.isidentifier():
            raise GraphError(f"input name must be an identifier, got {name!r}")
        where = f"input {name!r}"
        if not isinstance(shape, (tuple, list)):
            raise ShapeError(f"{where}: shape must be a tuple or list, got {type(shape).__name__}")
        dims = tuple(
            f"{name}_{k}" if d is None else check_dim(d, where) for k, d in enumerate(shape)
        )
        dt = dtypes.normalize(dtype, f"{where}: ")
        nid = self._insert(ops.INPUT, None, (), {}, self._unique_name(name, name), dims, dt)
        self.inputs[name] = nid
        return Tensor(self, nid)

    def constant(self, value: Any, name: str | None = None, dtype: object = None) -> "Tensor":
        """Add a constant tensor (a numpy array or a Python scalar) of its own dtype (numpy's
        default for Python scalars: int64, float64, complex128, bool) unless ``dtype`` is given."""
        where = f"constant {name or ''}: "
        try:
            arr = np.asarray(value)
        except Exception as exc:  # noqa: BLE001 - any conversion failure is a user error
            raise DTypeError(f"{where}cannot convert {type(value).__name__}") from exc
        if dtype is None:
            dt = dtypes.normalize(arr.dtype, where)
            arr = np.array(arr, dtype=dt, order="C")  # ascontiguousarray would make 0-d 1-d
        else:
            dt = dtypes.normalize(dtype, where)
            label = f"constant {name!r}" if name else "a constant operand"
            _check_kinds(arr, dt, label)
            scalar = arr.ndim == 0 and not isinstance(value, (np.ndarray, np.generic))
            with np.errstate(over="ignore", invalid="ignore"):
                cast = (
                    dtypes.scalar_array(value, dt, where)
                    if scalar
                    else np.array(arr, dt, order="C")
                )
            _check_values(arr, cast, label)
            arr = cast
        arr.setflags(write=False)
        nid = self._insert(
            ops.CONSTANT, None, (), {}, self._unique_name(name, "constant"), arr.shape, dt
        )
        self.constants[nid] = arr
        return Tensor(self, nid)

    def parameter(self, name: str, value: Any, dtype: object = None) -> "Tensor":
        """Add a learned parameter: a floating-point tensor with an initial ``value``.

        Unlike a constant, a parameter is never folded, merged or specialized on by the
        optimizer; a compiled plan keeps its own copy (``plan.parameters``, updated in place by
        ``tl.optim`` optimizers or ``plan.set_parameters``), so new values need no recompiling.
        ``tl.grad(..., wrt=[name])`` differentiates with respect to it.
        """
        if not isinstance(name, str) or not name.isidentifier():
            raise GraphError(f"parameter name must be an identifier, got {name!r}")
        where = f"parameter {name!r}: "
        try:
            arr = np.asarray(value)
        except Exception as exc:  # noqa: BLE001 - any conversion failure is a user error
            raise DTypeError(f"{where}cannot convert {type(value).__name__}") from exc
        dt = dtypes.normalize(arr.dtype if dtype is None else dtype, where)
        if not (dtypes.is_float(dt) or dtypes.kind(dt) == "c"):
            raise DTypeError(
                f"{where}dtype {dt} cannot be learned by gradients; expected a "
                "floating-point dtype (float16, bfloat16, float32, float64) or "
                "complex"
            )
        _check_kinds(arr, dt, f"parameter {name!r}")
        with np.errstate(over="ignore", invalid="ignore"):
            cast = np.array(arr, dt, order="C")
        _check_values(arr, cast, f"parameter {name!r}")
        cast.setflags(write=False)
        nid = self._insert(
            ops.PARAMETER, None, (), {}, self._unique_name(name, name), cast.shape, dt
        )
        self.parameters[name] = nid
        self.parameter_values[nid] = cast
        return Tensor(self, nid)

    def parameter_value(self, name: str) -> np.ndarray:
        """The value a parameter was declared with (read-only)."""
        if name not in self.parameters:
            raise GraphError(
                f"no parameter named {name!r}; the graph's parameters are {list(self.parameters)}"
            )
        return self.parameter_values[self.parameters[name]]

    @_atomic
    def output(self, t: "Tensor", name: str | None = None) -> "Tensor":
        """Mark ``t`` as a graph output under ``name`` (its node name by default)."""
        t = self._own(t)
        if name is not None and (not isinstance(name, str) or not name):
            raise GraphError(f"output name must be a non-empty string, got {name!r}")
        nm = name or self._nodes[t.id].name
        if nm in self.outputs and self.outputs[nm] != t.id:
            raise GraphError(f"an output named {nm!r} already exists")
        self.outputs[nm] = t.id
        return t

    # ------------------------------------------------------------------ ops
    def _own(self, t: Any, like: "str | None" = None) -> "Tensor":
        """A handle for ``t``: a Tensor of this graph, or a new constant for a number or array.

        ``like`` is the dtype a Python scalar is weak against (NEP 50: ``int8 + 2`` is int8);
        without it a Python scalar takes numpy's default dtype, as ``np.asarray`` gives it.
        """
        if isinstance(t, Tensor):
            if t.graph is not self:
                raise GraphError(f"tensor {t.name!r} belongs to another graph")
            return t
        if isinstance(t, (bool, int, float, complex)):
            dt = dtypes.scalar_dtype(t, like, "scalar operand: ")
            return self.constant(dtypes.scalar_array(t, dt, "scalar operand: "))
        if isinstance(t, (np.generic, np.ndarray, list, tuple)):
            return self.constant(t)  # numpy arrays, and lists as np.asarray reads them (strong)
        raise GraphError(f"expected a Tensor or a number, got {type(t).__name__}")

    @_atomic
    def einsum(self, spec: Any, *operands: Any, name: str | None = None) -> "Tensor":
        """An einsum over the operands (any spec numpy accepts, opt_einsum's extended symbols,
        or numpy's interleaved form ``g.einsum(a, [0, 1], b, [1, 2], [0, 2])``).

        Operands that are Python scalars or arrays become constants of numpy's dtype for them
        (``np.einsum`` converts them with ``np.asarray``, so ``2`` is int64 here).
        """
        if not isinstance(spec, str):
            if not operands or not isinstance(operands[0], (list, tuple, np.ndarray)):
                raise SpecError(
                    f"einsum spec must be a string, or numpy's interleaved form (operand, "
                    f"sublist, ..., [output sublist]); got {type(spec).__name__} then "
                    f"{type(operands[0]).__name__ if operands else 'nothing'}"
                )
            spec, operands = einspec.interleaved((spec, *operands))
        if not operands:
            raise GraphError(f"einsum {spec!r} needs at least one operand")
        ts = [self._own(o) for o in operands]
        return Tensor(
            self, self.add_node(ops.EINSUM, None, [t.id for t in ts], {"spec": spec}, name=name)
        )

    @_atomic
    def unary(self, op: str, x: "Tensor", name: str | None = None) -> "Tensor":
        """An elementwise unary op from the op table."""
        if op not in ops.UNARY_OPS:
            raise GraphError(f"unknown unary op {op!r}; expected one of {ops.UNARY_OPS}")
        return self.elementwise(op, x, name=name)

    @_atomic
    def binary(self, op: str, a: Any, b: Any, name: str | None = None) -> "Tensor":
        """An elementwise binary op with numpy broadcasting; Python scalars are weak (NEP 50)."""
        if op not in ops.BINARY_OPS:
            raise GraphError(f"unknown binary op {op!r}; expected one of {ops.BINARY_OPS}")
        return self.elementwise(op, a, b, name=name)

    @_atomic
    def elementwise(self, op: str, *operands: Any, name: str | None = None) -> "Tensor":
        """Any elementwise op of the op table over as many operands as its arity (unary,
        binary, ``where``'s three), with numpy broadcasting; Python scalars are weak (NEP 50)
        against the first tensor operand whose dtype the result follows."""
        row = ops.ELEMENTWISE.get(op) if isinstance(op, str) else None
        if row is None:
            raise GraphError(
                f"unknown elementwise op {op!r}; expected one of {tuple(ops.ELEMENTWISE)}"
            )
        if len(operands) != row.arity:
            raise GraphError(f"{op} takes {row.arity} operand(s), got {len(operands)}")
        order = [k for k in range(row.arity) if k not in row.own_dtype] + list(row.own_dtype)
        like = _dtype_of(
            next((operands[k] for k in order if isinstance(operands[k], Tensor)), None)
        )
        ts = [self._own(t, like) for t in operands]
        return Tensor(
            self, self.add_node(ops.KIND_OF_ARITY[row.arity], op, [t.id for t in ts], name=name)
        )

    @_atomic
    def where(self, cond: Any, a: Any, b: Any, name: str | None = None) -> "Tensor":
        """``a`` where ``cond`` is nonzero, else ``b``."""
        return self.elementwise("where", cond, a, b, name=name)

    @_atomic
    def reduce(
        self, op: str, x: "Tensor", axis=None, keepdims: bool = False, name=None
    ) -> "Tensor":
        """A reduction (sum, mean, max, min, prod, logsumexp) over ``axis`` (None: all axes)."""
        if op not in ops.REDUCTIONS:
            raise GraphError(f"unknown reduction {op!r}; expected one of {ops.REDUCTIONS}")
        x = self._own(x)
        axes = infer.normalize_axes(axis, len(x.shape), f"{op} of {x.name!r}")
        if not isinstance(keepdims, (bool, np.bool_)):
            raise GraphError(
                f"{op} of {x.name!r}: keepdims must be True or False, got {keepdims!r}"
            )
        args = {"axes": list(axes), "keepdims": bool(keepdims)}
        return Tensor(self, self.add_node(ops.REDUCE, op, [x.id], args, name=name))

    @_atomic
    def _rowop(
        self,
        op: str,
        x: "Tensor",
        axis: int,
        name: str | None,
        extra: Mapping[str, Any] | None = None,
    ) -> "Tensor":
        x = self._own(x)
        (ax,) = infer.normalize_axes(axis, len(x.shape), f"{op} of {x.name!r}") or (None,)
        if ax is None:
            raise ShapeError(f"{op} of {x.name!r}: needs a tensor of rank >= 1")
        args = {"axis": ax, **(extra or {})}
        if ops.takes_eps(op):
            args["eps"] = infer.check_eps(args.get("eps", ops.LAYER_NORM_EPS), op)
        return Tensor(self, self.add_node(ops.ROWOP, op, [x.id], args, name=name))

    def rowop(
        self,
        op: str,
        x: "Tensor",
        axis: int = -1,
        eps: float | None = None,
        name: str | None = None,
    ) -> "Tensor":
        """Any row op of the op table (``ops.ROW_OPS``) over one axis; ``eps`` for those whose
        row program reads one (default ``ops.LAYER_NORM_EPS``)."""
        if op not in ops.ROW_OPS:
            raise GraphError(f"unknown row op {op!r}; expected one of {ops.ROW_OPS}")
        if eps is not None and not ops.takes_eps(op):
            raise GraphError(f"{op} takes no eps (got eps={eps!r})")
        return self._rowop(op, x, axis, name, None if eps is None else {"eps": eps})

    def softmax(self, x: "Tensor", axis: int = -1, name: str | None = None) -> "Tensor":
        """Softmax over one axis."""
        return self._rowop("softmax", x, axis, name)

    def log_softmax(self, x: "Tensor", axis: int = -1, name: str | None = None) -> "Tensor":
        """Log-softmax over one axis."""
        return self._rowop("log_softmax", x, axis, name)

    def layer_norm(
        self, x: "Tensor", axis: int = -1, eps: float = ops.LAYER_NORM_EPS, name: str | None = None
    ) -> "Tensor":
        """Layer normalization over one axis: ``(x - mean) / sqrt(var + eps)``.

        The variance is the biased one (divided by the axis length), as in PyTorch's LayerNorm;
        an affine scale and shift are ordinary elementwise ops on the result.
        """
        return self._rowop("layer_norm", x, axis, name, {"eps": infer.check_eps(eps, "layer_norm")})

    @_atomic
    def row_grad(
        self,
        op: str,
        operands: Sequence["Tensor"],
        axis: int,
        eps: float | None = None,
        name: str | None = None,
    ) -> "Tensor":
        """The backward of row op ``op`` as one node (``ops.ROW_GRAD_PROGRAMS``): ``operands``
        are named by ``ops.ROW_GRAD_OPERANDS[op]`` (softmax: its result and the cotangent;
        layer_norm: its input and the cotangent); the result is the cotangent of the row op's
        input. tl.grad builds these; ``eps`` is layer_norm's."""
        if op not in ops.ROW_GRAD_PROGRAMS:
            raise GraphError(
                f"row_grad: unknown row op {op!r}; expected one of {tuple(ops.ROW_GRAD_PROGRAMS)}"
            )
        xs = [self._own(t) for t in operands]
        if not xs:
            raise GraphError(f"row_grad of {op}: needs its operands, got none")
        where = f"{op} backward of {xs[0].name!r}"
        (ax,) = infer.normalize_axes(axis, len(xs[0].shape), where) or (None,)
        if ax is None:
            raise ShapeError(f"{where}: needs tensors of rank >= 1")
        args: dict[str, Any] = {"axis": ax}
        if ops.row_grad_takes_eps(op):
            args["eps"] = infer.check_eps(ops.LAYER_NORM_EPS if eps is None else eps, op)
        return Tensor(self, self.add_node(ops.ROWGRAD, op, [t.id for t in xs], args, name=name))

    @_atomic
    def transpose(self, x: "Tensor", perm: Sequence[int] | None = None, name=None) -> "Tensor":
        """Permute axes (reverse them by default)."""
        x = self._own(x)
        where = f"transpose of {x.name!r}"
        perm = (
            list(range(len(x.shape)))[::-1]
            if perm is None
            else node_check.int_list(perm, "perm", where)
        )
        return Tensor(self, self.add_node(ops.TRANSPOSE, None, [x.id], {"perm": perm}, name=name))

    @_atomic
    def reshape(self, x: "Tensor", shape: Sequence[Dim], name: str | None = None) -> "Tensor":
        """Reshape (C order); one -1 allowed; symbol names allowed."""
        x = self._own(x)
        if isinstance(shape, np.ndarray) and shape.ndim == 1:
            shape = shape.tolist()
        if not isinstance(shape, (tuple, list)):
            shape = (shape,)
        bad = [d for d in shape if not (isinstance(d, str) or node_check.is_int(d))]
        if bad:
            raise ShapeError(
                f"reshape of {x.name!r}: invalid reshape dimension {bad[0]!r} in "
                f"{tuple(shape)}; expected integers or symbol names"
            )
        target = [d if isinstance(d, str) else int(d) for d in shape]
        return Tensor(self, self.add_node(ops.RESHAPE, None, [x.id], {"shape": target}, name=name))

    @_atomic
    def cast(self, x: "Tensor", dtype: object, name: str | None = None) -> "Tensor":
        """Convert to another dtype (numpy's ``astype``: floats to ints truncate toward zero,
        complex to real keeps the real part, anything to bool tests for nonzero)."""
        x = self._own(x)
        dt = dtypes.normalize(dtype, f"cast of {x.name!r}: ")
        return Tensor(self, self.add_node(ops.CAST, None, [x.id], {"dtype": dt}, name=name))

    def attention(
        self,
        q: "Tensor",
        k: "Tensor",
        v: "Tensor",
        scale: float | None = None,
        causal: bool = False,
        mask: "Tensor | None" = None,
        name: str | None = None,
    ) -> "Tensor":
        """``softmax(scale * q @ k^T + mask) @ v`` over the last two axes, as one node.

        q: ``(*batch, Sq, D)``, k: ``(*batch, Sk, D)``, v: ``(*batch, Sk, Dv)`` -> ``(*batch, Sq,
        Dv)``. ``scale`` defaults to ``1/sqrt(D)``; ``causal=True`` hides keys ``j > i`` from
        query ``i`` without any mask tensor; ``mask`` is an additive tensor that broadcasts
        against the scores ``(*batch, Sq, Sk)`` (``-inf`` hides a key). See ``ir/attention.py``.
        """
        from .attention import default_scale

        ts = [self._own(t) for t in (q, k, v)]
        if mask is not None:
            ts.append(self._own(mask, ts[0]))
        if scale is None:
            if len(ts[0].shape) < 1:
                raise ShapeError(
                    f"attention: q {ts[0].name!r} is a scalar; expected (*batch, S, D)"
                )
            scale = default_scale(ts[0].shape[-1])
        args = {
            "scale": float(scale)
            if isinstance(scale, (int, float, np.number)) and not isinstance(scale, bool)
            else scale,
            "causal": causal,
        }
        return Tensor(self, self.add_node(ops.ATTENTION, None, [t.id for t in ts], args, name=name))

    # reduction and unary shorthands, generated from the op table
    def sum(self, x, axis=None, keepdims=False, name=None):  # noqa: D102
        return self.reduce("sum", x, axis, keepdims, name)

    def mean(self, x, axis=None, keepdims=False, name=None):  # noqa: D102
        return self.reduce("mean", x, axis, keepdims, name)

    def max(self, x, axis=None, keepdims=False, name=None):  # noqa: D102
        return self.reduce("max", x, axis, keepdims, name)

    def min(self, x, axis=None, keepdims=False, name=None):  # noqa: D102
        return self.reduce("min", x, axis, keepdims, name)

    def prod(self, x, axis=None, keepdims=False, name=None):  # noqa: D102
        return self.reduce("prod", x, axis, keepdims, name)

    def logsumexp(self, x, axis=None, keepdims=False, name=None):  # noqa: D102
        return self.reduce("logsumexp", x, axis, keepdims, name)


def _dtype_of(t: "Tensor | None") -> str | None:
    return None if t is None else t.dtype


def install_op_methods(cls: type) -> None:
    """One builder method per unary and binary op of the table (``g.exp(x)``, ``g.add(a, b)``)."""
    for op in ops.UNARY_OPS:

        def method(self, x, name=None, _op=op):
            return self.unary(_op, x, name)

        method.__name__ = op
        method.__doc__ = f"Elementwise {op}."
        setattr(cls, op, method)
    for op in ops.BINARY_OPS:
        if op in ("maximum", "minimum") or not hasattr(cls, op):

            def bmethod(self, a, b, name=None, _op=op):
                return self.binary(_op, a, b, name)

            bmethod.__name__ = op
            bmethod.__doc__ = f"Elementwise {op} with broadcasting."
            setattr(cls, op, bmethod)
