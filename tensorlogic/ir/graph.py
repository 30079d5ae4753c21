"""EinsumGraph: a DAG of tensor operations over a networkx.DiGraph, and Tensor handles.

Nodes are immutable ``Node`` records kept in insertion order (a topological order, since a node
can only use nodes that already exist). Shapes and dtypes are inferred and checked when a node is
added, so a bad graph fails at the line that built it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Sequence

import ml_dtypes
import networkx as nx
import numpy as np

from .. import dtypes
from ..errors import DTypeError, GraphError, ShapeError, SpecError
from . import infer, node_check, ops
from . import spec as einspec

Dim = int | str


@dataclass(frozen=True)
class Node:
    """One operation: kind, op name, ordered inputs, result shape and dtype, name, op arguments."""

    id: int
    kind: str
    op: str | None
    inputs: tuple[int, ...]
    shape: tuple[Dim, ...]
    dtype: str
    name: str
    args: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def label(self) -> str:
        """Short human-readable description, e.g. ``einsum[ij,jk->ik]``."""
        if self.kind == ops.EINSUM:
            return f"einsum[{self.args['spec']}]"
        return f"{self.kind}:{self.op}" if self.op else self.kind


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    return value


def _check_dim(d: Any, where: str) -> Dim:
    if isinstance(d, (bool, np.bool_)):
        raise ShapeError(f"{where}: invalid dimension {d!r}")
    if isinstance(d, (int, np.integer)):
        if d < 0:
            raise ShapeError(f"{where}: negative dimension {int(d)}")
        return int(d)
    if isinstance(d, str) and d.isidentifier():
        return d
    raise ShapeError(f"{where}: dimension {d!r} must be a non-negative int, None or a symbol name")


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
        raise DTypeError(f"{label}: complex data cannot be stored as {dt} (the imaginary part "
                         "would be dropped); take .real explicitly")


def _check_values(src: np.ndarray, dst: np.ndarray, label: str) -> None:
    """Refuse a cast that changed values: no silent truncation, wraparound or overflow."""
    sk, dk = _kind(src.dtype), _kind(dst.dtype)
    if dk in "biu" and not np.array_equal(src, dst):
        raise DTypeError(f"{label}: values are not exactly representable as {dst.dtype} "
                         "(fractions, NaN or out of range)")
    if sk in "fc" and dk in "fc" and not np.array_equal(np.isfinite(src), np.isfinite(dst)):
        raise DTypeError(f"{label}: values overflow {dst.dtype} (largest finite "
                         f"{float(ml_dtypes.finfo(dst.dtype).max):.4g}); give a wider dtype")


def _kind(dt: np.dtype) -> str:
    """numpy's kind letter, with bfloat16 (kind 'V' in ml_dtypes) counted as a float."""
    return "f" if dt == dtypes.bfloat16 else dt.kind


class EinsumGraph:
    """A graph of einsum, elementwise, reduction and layout operations."""

    def __init__(self) -> None:
        self._g = nx.DiGraph()
        self._nodes: dict[int, Node] = {}
        self._names: dict[str, int] = {}
        self.inputs: dict[str, int] = {}
        self.outputs: dict[str, int] = {}
        self.constants: dict[int, np.ndarray] = {}
        # learned leaves: name -> node id, and each one's initial value (read-only) by node id;
        # a compiled plan holds its own mutable copies (``CompiledPlan.parameters``)
        self.parameters: dict[str, int] = {}
        self.parameter_values: dict[int, np.ndarray] = {}
        self._next = 0
        self._in_transaction = False

    # ------------------------------------------------------------------ structure
    @property
    def nx_graph(self) -> nx.DiGraph:
        """The underlying networkx graph (edges input -> consumer); do not mutate it."""
        return self._g

    def node(self, ref: int | str | "Tensor") -> Node:
        """The node for an id, a name or a Tensor handle."""
        if isinstance(ref, Tensor):
            ref = ref.id
        if isinstance(ref, str):
            if ref not in self._names:
                raise GraphError(f"no node named {ref!r} in the graph")
            ref = self._names[ref]
        if ref not in self._nodes:
            raise GraphError(f"no node with id {ref!r} in the graph")
        return self._nodes[ref]

    @property
    def nodes(self) -> list[Node]:
        """Nodes in a topological order."""
        return list(self._nodes.values())

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(list(self._nodes.values()))

    def __contains__(self, node_id: int) -> bool:
        return node_id in self._nodes

    def users(self, node_id: int) -> list[int]:
        """Ids of the nodes that consume ``node_id``."""
        return [u for u in self._g.successors(node_id)]

    def live_nodes(self) -> set[int]:
        """Ids of every node some output depends on (the outputs included)."""
        live: set[int] = set()
        stack = list(self.outputs.values())
        while stack:
            n = stack.pop()
            if n in live:
                continue
            live.add(n)
            stack.extend(self._nodes[n].inputs)
        return live

    def tensor(self, ref: int | str) -> "Tensor":
        """A handle on an existing node."""
        return Tensor(self, self.node(ref).id)

    @property
    def symbols(self) -> tuple[str, ...]:
        """Symbolic dimension names used by the graph's inputs, in order of appearance."""
        seen: dict[str, None] = {}
        for nid in self.inputs.values():
            for d in self._nodes[nid].shape:
                if isinstance(d, str):
                    seen.setdefault(d)
        return tuple(seen)

    def copy(self) -> "EinsumGraph":
        """An independent copy (constants are shared read-only arrays)."""
        g = EinsumGraph()
        g._g = self._g.copy()
        g._nodes = dict(self._nodes)
        g._names = dict(self._names)
        g.inputs = dict(self.inputs)
        g.outputs = dict(self.outputs)
        g.constants = dict(self.constants)
        g.parameters = dict(self.parameters)
        g.parameter_values = dict(self.parameter_values)
        g._next = self._next
        return g

    def with_parameters_as_inputs(self) -> "EinsumGraph":
        """A copy in which every parameter is a graph input of the same name, shape and dtype.

        The compiler works on this form: to the optimizer a parameter is as opaque as an input
        (never folded, merged or specialized on its value), and a plan binds it from its own
        parameter store at every call, so new values need no recompiling.
        """
        g = self.copy()
        for name, nid in self.parameters.items():
            g._nodes[nid] = replace(self._nodes[nid], kind=ops.INPUT)
            g.inputs[name] = nid
        g.parameters = {}
        g.parameter_values = {}
        return g

    # ------------------------------------------------------------------ low level
    def _unique_name(self, name: str | None, base: str) -> str:
        if name is not None:
            if not isinstance(name, str) or not name:
                raise GraphError(f"node name must be a non-empty string, got {name!r}")
            if name in self._names:
                raise GraphError(f"a node named {name!r} already exists in the graph")
            return name
        k = self._next
        while f"{base}_{k}" in self._names:
            k += 1
        return f"{base}_{k}"

    def add_node(
        self,
        kind: str,
        op: str | None,
        inputs: Sequence[int],
        args: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        shape: Sequence[Dim] | None = None,
        dtype: str | None = None,
    ) -> int:
        """Add a node, inferring its shape and dtype (given explicitly only for fused nodes).

        The record is checked first (arity, op, every argument's type), so nothing is coerced or
        dropped silently; nothing is changed if a check or inference fails.
        """
        if args is not None and not isinstance(args, Mapping):
            raise GraphError(f"add_node: args must be a mapping, got {type(args).__name__}")
        args = dict(args or {})
        if not isinstance(kind, str) or kind not in ops.NODE_KINDS:
            raise GraphError(f"unknown node kind {kind!r}; expected one of {ops.NODE_KINDS}")
        if kind in (ops.INPUT, ops.CONSTANT, ops.PARAMETER):
            raise GraphError(f"add_node cannot make a {kind} node; use g.{kind}(...)")
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise GraphError(f"{kind} node: inputs must be a sequence of node ids, got {inputs!r}")
        inputs = [int(i) if node_check.is_int(i) else i for i in inputs]
        for i in inputs:
            if isinstance(i, bool) or not isinstance(i, int) or i not in self._nodes:
                raise GraphError(f"{kind} node refers to unknown input node id {i!r}")
        nm = self._unique_name(name, op if isinstance(op, str) else kind)
        where = f"node {nm!r} ({kind}{':' + op if isinstance(op, str) else ''})"
        node_check.check(kind, op, inputs, args, where)
        if kind == ops.FUSED:
            shape, dtype = self._fused_result(inputs, args, shape, dtype, where)
        else:
            inferred = infer.infer(kind, op, [self._nodes[i] for i in inputs], args, where)
            if (shape is not None and tuple(shape) != tuple(inferred[0])) or (
                    dtype is not None and dtype != inferred[1]):
                raise GraphError(f"{where}: given shape/dtype {shape}/{dtype} but the inputs give "
                                 f"{inferred[0]}/{inferred[1]}")
            shape, dtype = inferred
        return self._insert(kind, op, inputs, args, nm, shape, dtype)

    def _fused_result(self, inputs, args, shape, dtype, where):
        from .fused import FusedBody

        try:
            body = FusedBody.from_args(args["body"])
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise GraphError(
                f"{where}: malformed fused body ({type(exc).__name__}: {exc})") from exc
        body.validate(len(inputs), where)
        if shape is None or dtype is None:
            raise GraphError(f"{where}: a fused node needs its shape and dtype given")
        dims = tuple(_check_dim(d, where) for d in shape)
        return dims, dtypes.normalize(dtype, f"{where}: ")

    def _insert(self, kind, op, inputs, args, name, shape, dtype) -> int:
        nid = self._next
        self._next += 1
        node = Node(nid, kind, op, tuple(inputs), tuple(shape), dtype, name, _freeze(args))
        self._nodes[nid] = node
        self._names[name] = nid
        self._g.add_node(nid)
        for i in inputs:
            self._g.add_edge(i, nid)
        return nid

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """Undo every node added inside the block if it raises (constants made for operands too)."""
        if self._in_transaction:
            yield
            return
        mark = self._next
        self._in_transaction = True
        try:
            yield
        except BaseException:
            for nid in [i for i in self._nodes if i >= mark]:
                node = self._nodes.pop(nid)
                self._names.pop(node.name, None)
                self._g.remove_node(nid)
                self.constants.pop(nid, None)
                self.parameter_values.pop(nid, None)
                if self.inputs.get(node.name) == nid:
                    del self.inputs[node.name]
                if self.parameters.get(node.name) == nid:
                    del self.parameters[node.name]
            self._next = mark
            raise
        finally:
            self._in_transaction = False

    def replace_node(self, node_id: int, new: Node) -> None:
        """Swap the record of ``node_id`` (same id), rewiring its input edges."""
        old = self._nodes[node_id]
        for i in old.inputs:
            if self._g.has_edge(i, node_id) and i not in new.inputs:
                self._g.remove_edge(i, node_id)
        for i in new.inputs:
            self._g.add_edge(i, node_id)
        del self._names[old.name]
        self._names[new.name] = node_id
        self._nodes[node_id] = new

    def redirect(self, old: int, new: int) -> None:
        """Make every user of ``old`` (and any output naming it) use ``new`` instead."""
        for u in list(self._g.successors(old)):
            node = self._nodes[u]
            self.replace_node(
                u, replace(node, inputs=tuple(new if i == old else i for i in node.inputs))
            )
        for k, v in self.outputs.items():
            if v == old:
                self.outputs[k] = new

    def remove_node(self, node_id: int) -> None:
        """Remove a node that nothing uses any more."""
        if list(self._g.successors(node_id)) or node_id in self.outputs.values():
            raise GraphError(f"cannot remove node {self._nodes[node_id].name!r}: it is still used")
        node = self._nodes.pop(node_id)
        del self._names[node.name]
        self._g.remove_node(node_id)
        self.constants.pop(node_id, None)
        self.parameter_values.pop(node_id, None)
        if self.inputs.get(node.name) == node_id:
            del self.inputs[node.name]
        if self.parameters.get(node.name) == node_id:
            del self.parameters[node.name]

    def reorder(self) -> None:
        """Restore a topological insertion order after rewiring."""
        order = list(nx.lexicographical_topological_sort(self._g))
        self._nodes = {i: self._nodes[i] for i in order}

    # ------------------------------------------------------------------ leaves
    def input(self, name: str, shape: Sequence[Dim | None], dtype: object = "float32") -> "Tensor":
        """Declare a graph input. A dimension may be None or a symbol name like "B"."""
        if not isinstance(name, str) or not name.isidentifier():
            raise GraphError(f"input name must be an identifier, got {name!r}")
        where = f"input {name!r}"
        if not isinstance(shape, (tuple, list)):
            raise ShapeError(f"{where}: shape must be a tuple or list, got {type(shape).__name__}")
        dims = tuple(
            f"{name}_{k}" if d is None else _check_dim(d, where) for k, d in enumerate(shape)
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
                cast = (dtypes.scalar_array(value, dt, where) if scalar
                        else np.array(arr, dt, order="C"))
            _check_values(arr, cast, label)
            arr = cast
        arr.setflags(write=False)
        nid = self._insert(ops.CONSTANT, None, (), {}, self._unique_name(name, "constant"),
                           arr.shape, dt)
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
            raise DTypeError(f"{where}dtype {dt} cannot be learned by gradients; expected a "
                             "floating-point dtype (float16, bfloat16, float32, float64) or "
                             "complex")
        _check_kinds(arr, dt, f"parameter {name!r}")
        with np.errstate(over="ignore", invalid="ignore"):
            cast = np.array(arr, dt, order="C")
        _check_values(arr, cast, f"parameter {name!r}")
        cast.setflags(write=False)
        nid = self._insert(ops.PARAMETER, None, (), {}, self._unique_name(name, name),
                           cast.shape, dt)
        self.parameters[name] = nid
        self.parameter_values[nid] = cast
        return Tensor(self, nid)

    def constants_as_parameters(self, names: Sequence[str]) -> "EinsumGraph":
        """A copy in which the named float constants are parameters (same names and values):
        to train a model whose builder made its weights constants."""
        g = self.copy()
        for name in [names] if isinstance(names, str) else list(names):
            node = self.node(name) if isinstance(name, str) else None
            if node is None or node.kind != ops.CONSTANT:
                raise GraphError(f"constants_as_parameters: {name!r} is not a constant of the "
                                 f"graph" + (f" (it is a {node.kind} node)" if node else ""))
            if not name.isidentifier():
                raise GraphError(f"constants_as_parameters: {name!r} is not an identifier; "
                                 "parameters are named like inputs")
            if not (dtypes.is_float(node.dtype) or dtypes.kind(node.dtype) == "c"):
                raise DTypeError(f"constants_as_parameters: {name!r} has dtype {node.dtype}; "
                                 "expected a floating-point or complex constant")
            g._nodes[node.id] = replace(node, kind=ops.PARAMETER)
            g.parameters[name] = node.id
            g.parameter_values[node.id] = g.constants.pop(node.id)
        return g

    def parameter_value(self, name: str) -> np.ndarray:
        """The value a parameter was declared with (read-only)."""
        if name not in self.parameters:
            raise GraphError(f"no parameter named {name!r}; the graph's parameters are "
                             f"{list(self.parameters)}")
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
                    f"{type(operands[0]).__name__ if operands else 'nothing'}")
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
        x = self._own(x)
        return Tensor(self, self.add_node(ops.UNARY, op, [x.id], name=name))

    @_atomic
    def binary(self, op: str, a: Any, b: Any, name: str | None = None) -> "Tensor":
        """An elementwise binary op with numpy broadcasting; Python scalars are weak (NEP 50)."""
        if op not in ops.BINARY_OPS:
            raise GraphError(f"unknown binary op {op!r}; expected one of {ops.BINARY_OPS}")
        like = _dtype_of(a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None)
        ta, tb = self._own(a, like), self._own(b, like)
        return Tensor(self, self.add_node(ops.BINARY, op, [ta.id, tb.id], name=name))

    @_atomic
    def where(self, cond: Any, a: Any, b: Any, name: str | None = None) -> "Tensor":
        """``a`` where ``cond`` is nonzero, else ``b``."""
        like = _dtype_of(next((t for t in (a, b, cond) if isinstance(t, Tensor)), None))
        ts = [self._own(t, like) for t in (cond, a, b)]
        return Tensor(self, self.add_node(ops.WHERE, None, [t.id for t in ts], name=name))

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
                f"{op} of {x.name!r}: keepdims must be True or False, got {keepdims!r}")
        args = {"axes": list(axes), "keepdims": bool(keepdims)}
        return Tensor(self, self.add_node(ops.REDUCE, op, [x.id], args, name=name))

    @_atomic
    def _rowop(self, op: str, x: "Tensor", axis: int, name: str | None,
               extra: Mapping[str, Any] | None = None) -> "Tensor":
        x = self._own(x)
        (ax,) = infer.normalize_axes(axis, len(x.shape), f"{op} of {x.name!r}") or (None,)
        if ax is None:
            raise ShapeError(f"{op} of {x.name!r}: needs a tensor of rank >= 1")
        args = {"axis": ax, **(extra or {})}
        if op == "layer_norm":
            args.setdefault("eps", ops.LAYER_NORM_EPS)
        return Tensor(self, self.add_node(ops.ROWOP, op, [x.id], args, name=name))

    def softmax(self, x: "Tensor", axis: int = -1, name: str | None = None) -> "Tensor":
        """Softmax over one axis."""
        return self._rowop("softmax", x, axis, name)

    def log_softmax(self, x: "Tensor", axis: int = -1, name: str | None = None) -> "Tensor":
        """Log-softmax over one axis."""
        return self._rowop("log_softmax", x, axis, name)

    def layer_norm(self, x: "Tensor", axis: int = -1, eps: float = ops.LAYER_NORM_EPS,
                   name: str | None = None) -> "Tensor":
        """Layer normalization over one axis: ``(x - mean) / sqrt(var + eps)``.

        The variance is the biased one (divided by the axis length), as in PyTorch's LayerNorm;
        an affine scale and shift are ordinary elementwise ops on the result.
        """
        return self._rowop("layer_norm", x, axis, name, {"eps": infer.check_eps(eps, "layer_norm")})

    @_atomic
    def transpose(self, x: "Tensor", perm: Sequence[int] | None = None, name=None) -> "Tensor":
        """Permute axes (reverse them by default)."""
        x = self._own(x)
        where = f"transpose of {x.name!r}"
        perm = (list(range(len(x.shape)))[::-1] if perm is None
                else node_check.int_list(perm, "perm", where))
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
            raise ShapeError(f"reshape of {x.name!r}: invalid reshape dimension {bad[0]!r} in "
                             f"{tuple(shape)}; expected integers or symbol names")
        target = [d if isinstance(d, str) else int(d) for d in shape]
        return Tensor(self, self.add_node(ops.RESHAPE, None, [x.id], {"shape": target}, name=name))

    @_atomic
    def cast(self, x: "Tensor", dtype: object, name: str | None = None) -> "Tensor":
        """Convert to another dtype (numpy's ``astype``: floats to ints truncate toward zero,
        complex to real keeps the real part, anything to bool tests for nonzero)."""
        x = self._own(x)
        dt = dtypes.normalize(dtype, f"cast of {x.name!r}: ")
        return Tensor(self, self.add_node(ops.CAST, None, [x.id], {"dtype": dt}, name=name))

    def attention(self, q: "Tensor", k: "Tensor", v: "Tensor", scale: float | None = None,
                  causal: bool = False, mask: "Tensor | None" = None,
                  name: str | None = None) -> "Tensor":
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
                raise ShapeError(f"attention: q {ts[0].name!r} is a scalar; expected "
                                 "(*batch, S, D)")
            scale = default_scale(ts[0].shape[-1])
        args = {"scale": float(scale) if isinstance(scale, (int, float, np.number))
                and not isinstance(scale, bool) else scale, "causal": causal}
        return Tensor(self, self.add_node(ops.ATTENTION, None, [t.id for t in ts], args,
                                          name=name))

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

    # ------------------------------------------------------------------ whole-graph
    def validate(self) -> None:
        """Check structure and re-infer every node; raise GraphError naming the first bad node."""
        if not nx.is_directed_acyclic_graph(self._g):
            cycle = nx.find_cycle(self._g)
            names = [self._nodes[a].name for a, _ in cycle]
            raise GraphError(f"graph has a cycle through nodes {names}")
        if not self.outputs:
            raise GraphError("graph has no outputs; mark at least one with g.output(t)")
        for node in self._nodes.values():
            for i in node.inputs:
                if i not in self._nodes:
                    raise GraphError(f"node {node.name!r} refers to missing input id {i}")
            if node.kind in (ops.INPUT, ops.CONSTANT, ops.PARAMETER, ops.FUSED):
                continue
            where = f"node {node.name!r} ({node.label})"
            shape, dtype = infer.infer(node.kind, node.op, [self._nodes[i] for i in node.inputs],
                                       node.args, where)
            if tuple(shape) != tuple(node.shape) or dtype != node.dtype:
                raise GraphError(
                    f"{where}: recorded shape/dtype {node.shape}/{node.dtype} but inputs give "
                    f"{shape}/{dtype}"
                )
        for name, nid in self.outputs.items():
            if nid not in self._nodes:
                raise GraphError(f"output {name!r} refers to a missing node")

    def bind(self, sizes: Mapping[str, int]) -> "EinsumGraph":
        """A copy with every symbolic dimension replaced by its size, re-inferred."""
        g = EinsumGraph()
        g._next = self._next
        for node in self._nodes.values():
            if node.kind == ops.INPUT:
                shape = tuple(sizes[d] if isinstance(d, str) else d for d in node.shape)
                new = replace(node, shape=shape)
            elif node.kind in (ops.CONSTANT, ops.PARAMETER, ops.FUSED):
                new = replace(node, shape=tuple(sizes.get(d, d) if isinstance(d, str) else d
                                                  for d in node.shape))
            else:
                args = node.args
                if node.kind == ops.RESHAPE:
                    args = _freeze({**args, "shape": [sizes.get(d, d) if isinstance(d, str) else d
                                                      for d in args["shape"]]})
                where = f"node {node.name!r} ({node.label})"
                shape, dtype = infer.infer(node.kind, node.op, [g._nodes[i] for i in node.inputs],
                                           args, where)
                new = replace(node, shape=shape, dtype=dtype, args=args)
            g._nodes[node.id] = new
            g._names[node.name] = node.id
            g._g.add_node(node.id)
            for i in node.inputs:
                g._g.add_edge(i, node.id)
        g.inputs = dict(self.inputs)
        g.outputs = dict(self.outputs)
        g.constants = dict(self.constants)
        g.parameters = dict(self.parameters)
        g.parameter_values = dict(self.parameter_values)
        return g

    def fingerprint(self) -> str:
        """A content hash of the graph: structure, arguments and constant values (not the
        values of parameters: a plan takes those as data, so it serves any values)."""
        h = hashlib.sha256()
        for node in self._nodes.values():
            rec = [node.id, node.kind, node.op, list(node.inputs), list(node.shape), node.dtype,
                   node.name, _jsonable(node.args)]
            h.update(json.dumps(rec, sort_keys=True, default=str).encode())
            if node.id in self.constants:
                h.update(self.constants[node.id].tobytes())
        h.update(json.dumps(sorted(self.outputs.items())).encode())
        return h.hexdigest()

    def to_dot(self) -> str:
        """Graphviz DOT text of the graph."""
        lines = [
            "digraph tensorlogic {",
            "  rankdir=TB;",
            '  node [shape=box, fontname="monospace"];',
        ]
        outs = {v: k for k, v in self.outputs.items()}
        for node in self._nodes.values():
            shape = "x".join(map(str, node.shape)) or "scalar"
            label = f"{node.name}\\n{node.label}\\n{shape} {node.dtype}"
            style = ""
            if node.kind == ops.INPUT:
                style = ", style=filled, fillcolor=lightblue"
            elif node.kind == ops.CONSTANT:
                style = ", style=filled, fillcolor=lightgrey"
            elif node.kind == ops.PARAMETER:
                style = ", style=filled, fillcolor=khaki"
            elif node.id in outs:
                style = ", style=filled, fillcolor=palegreen"
            label = label.replace('"', '\\"')
            lines.append(f'  n{node.id} [label="{label}"{style}];')
        for node in self._nodes.values():
            for pos, i in enumerate(node.inputs):
                lines.append(f'  n{i} -> n{node.id} [label="{pos}"];')
        lines.append("}")
        return "\n".join(lines) + "\n"

    def save(self, path) -> None:
        """Write the graph as JSON (constants in an .npz beside it)."""
        from .serialize import save

        save(self, path)

    @staticmethod
    def load(path) -> "EinsumGraph":
        """Read a graph written by ``save``; never executes code."""
        from .serialize import load

        return load(path)

    def __repr__(self) -> str:
        params = f", parameters={list(self.parameters)}" if self.parameters else ""
        return (f"EinsumGraph({len(self._nodes)} nodes, inputs={list(self.inputs)}{params}, "
                f"outputs={list(self.outputs)})")


def _dtype_of(t: "Tensor | None") -> str | None:
    return None if t is None else t.dtype


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


def _install_unary_methods() -> None:
    for op in ops.UNARY_OPS:
        def method(self, x, name=None, _op=op):
            return self.unary(_op, x, name)

        method.__name__ = op
        method.__doc__ = f"Elementwise {op}."
        setattr(EinsumGraph, op, method)
    for op in ops.BINARY_OPS:
        if op in ("maximum", "minimum") or not hasattr(EinsumGraph, op):
            def bmethod(self, a, b, name=None, _op=op):
                return self.binary(_op, a, b, name)

            bmethod.__name__ = op
            bmethod.__doc__ = f"Elementwise {op} with broadcasting."
            setattr(EinsumGraph, op, bmethod)


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

    def __add__(self, o): return self._bin("add", o)  # noqa: E704
    def __radd__(self, o): return self._bin("add", o, True)  # noqa: E704
    def __sub__(self, o): return self._bin("sub", o)  # noqa: E704
    def __rsub__(self, o): return self._bin("sub", o, True)  # noqa: E704
    def __mul__(self, o): return self._bin("mul", o)  # noqa: E704
    def __rmul__(self, o): return self._bin("mul", o, True)  # noqa: E704
    def __truediv__(self, o): return self._bin("div", o)  # noqa: E704
    def __rtruediv__(self, o): return self._bin("div", o, True)  # noqa: E704
    def __pow__(self, o): return self._bin("pow", o)  # noqa: E704
    def __rpow__(self, o): return self._bin("pow", o, True)  # noqa: E704
    def __gt__(self, o): return self._bin("gt", o)  # noqa: E704
    def __ge__(self, o): return self._bin("ge", o)  # noqa: E704
    def __lt__(self, o): return self._bin("lt", o)  # noqa: E704
    def __le__(self, o): return self._bin("le", o)  # noqa: E704
    def __eq__(self, o): return self._bin("eq", o)  # type: ignore[override]  # noqa: E704
    def __ne__(self, o): return self._bin("ne", o)  # type: ignore[override]  # noqa: E704
    def __neg__(self): return self.graph.unary("neg", self)  # noqa: E704
    def __abs__(self): return self.graph.unary("abs", self)  # noqa: E704

    def __matmul__(self, o):
        return self.graph.einsum("...ij,...jk->...ik", self, o)

    @property
    def T(self) -> "Tensor":
        """Axes reversed."""
        return self.graph.transpose(self)

    def sum(self, axis=None, keepdims=False): return self.graph.sum(self, axis, keepdims)  # noqa: D102,E704
    def mean(self, axis=None, keepdims=False): return self.graph.mean(self, axis, keepdims)  # noqa: D102,E704
    def max(self, axis=None, keepdims=False): return self.graph.max(self, axis, keepdims)  # noqa: D102,E704
    def min(self, axis=None, keepdims=False): return self.graph.min(self, axis, keepdims)  # noqa: D102,E704
    def reshape(self, *shape): return self.graph.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)  # noqa: D102,E501,E704
    def transpose(self, *perm): return self.graph.transpose(self, perm or None)  # noqa: D102,E704
    def astype(self, dtype): return self.graph.cast(self, dtype)  # noqa: D102,E704


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
        if op == "layer_norm":
            def rmethod(self, axis=-1, eps=ops.LAYER_NORM_EPS):
                return self.graph.layer_norm(self, axis, eps)
            rmethod.__doc__ = "Layer normalization over one axis (see EinsumGraph.layer_norm)."
        else:
            def rmethod(self, axis=-1, _op=op):
                return self.graph._rowop(_op, self, axis, None)
            rmethod.__doc__ = f"{op} over one axis."

        rmethod.__name__ = op
        setattr(Tensor, op, rmethod)


_install_unary_methods()
_install_tensor_unary()
