"""The VJP rule of every node kind: from a node and the cotangent of its result, the cotangents
of its operands, built as ordinary nodes of the same graph.

A rule is ``rule(g, node, ct, need) -> [Tensor | None per operand]``: ``ct`` has the node's
shape and dtype, ``need[k]`` says whether operand k wants a cotangent, and each returned
tensor has operand k's exact shape and dtype (None: no gradient flows there). Elementwise ops
take their derivatives from the op table's VJP column (``ops.VJP``); complex numbers follow
torch's convention (the cotangent times the conjugate derivative).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..errors import GradError
from ..ir import attention as attn_ir
from ..ir import ops
from ..ir import spec as einspec
from ..ir.graph import EinsumGraph, Node, Tensor
from . import formula
from .tools import cast_to, conj, count, expand, is_complex, keepdims, scalar, unbroadcast

Cts = list["Tensor | None"]
Rule = Callable[[EinsumGraph, Node, Tensor, Sequence[bool]], Cts]


def _t(g: EinsumGraph, nid: int) -> Tensor:
    return g.tensor(nid)


def _times_derivative(g: EinsumGraph, ct: Tensor, text: str, names: dict) -> Tensor | None:
    """``ct * conj(d)`` for the derivative formula ``text`` (None when it is 0)."""
    value = formula.constant_value(text)
    if value == 0.0:
        return None
    if value == 1.0:
        return ct
    if value == -1.0:
        return g.unary("neg", ct)
    d = formula.build(g, text, names)
    return g.binary("mul", ct, conj(g, d) if isinstance(d, Tensor) else d)


def elementwise(g: EinsumGraph, node: Node, ct: Tensor, need: Sequence[bool]) -> Cts:
    """Unary and binary ops: the cotangent times each partial derivative of the op table,
    summed back over the axes the operand was broadcast along."""
    xs = [_t(g, i) for i in node.inputs]
    names = {"y": _t(g, node.id)}
    names.update({"x": xs[0]} if node.kind == ops.UNARY else {"a": xs[0], "b": xs[1]})
    texts = list(ops.VJP[node.op])
    if node.op == "abs" and is_complex(xs[0].dtype):
        texts = ["where(eq(y, 0), 0, x / y)"]  # sgn(z) = z / |z|, 0 at 0 (torch)
    if node.op == "pow" and is_complex(node.dtype):
        texts[1] = "y * log(a)"  # no order on complex exponents
    out: Cts = []
    for k, x in enumerate(xs):
        if not need[k]:
            out.append(None)
            continue
        text = texts[k]
        if node.op == "abs" and is_complex(x.dtype):
            r = g.binary("mul", ct, formula.build(g, text, names))  # sgn is not conjugated
        else:
            r = _times_derivative(g, ct, text, names)
        out.append(None if r is None else cast_to(g, unbroadcast(g, r, x.shape), x.dtype))
    return out


def where(g: EinsumGraph, node: Node, ct: Tensor, need: Sequence[bool]) -> Cts:
    """``where(c, a, b)``: the cotangent goes to ``a`` where ``c`` holds, else to ``b``;
    none to the condition."""
    c, a, b = (_t(g, i) for i in node.inputs)
    out: Cts = [None, None, None]
    zero = scalar(g, 0.0, ct.dtype)
    for k, x, picked in ((1, a, (ct, zero)), (2, b, (zero, ct))):
        if need[k]:
            r = g.where(c, *picked)
            out[k] = cast_to(g, unbroadcast(g, cast_to(g, r, ct.dtype), x.shape), x.dtype)
    return out


def einsum(g: EinsumGraph, node: Node, ct: Tensor, need: Sequence[bool]) -> Cts:
    """The cotangent of operand k is the einsum of the cotangent and the (conjugated) other
    operands into operand k's letters: letters summed away in the forward einsum are
    broadcast back, broadcast (size-1) letters summed, repeated letters put on a diagonal."""
    xs = [_t(g, i) for i in node.inputs]
    shapes = [tuple(x.shape) for x in xs]
    es = einspec.parse(node.args["spec"], [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    out: Cts = []
    for k, x in enumerate(xs):
        if not need[k]:
            out.append(None)
            continue
        term = es.inputs[k]
        others = [(es.inputs[j], conj(g, xs[j])) for j in range(len(xs)) if j != k]
        others.append((es.output, ct))
        avail = set("".join(t for t, _ in others))
        dim = {c: d for c, d in zip(term, shapes[k])}
        uniq = list(dict.fromkeys(term))
        # a letter of size 1 in this operand but larger elsewhere was broadcast: sum it
        keep = [c for c in uniq if c in avail and not (dim[c] == 1 and sizes[c] != 1)]
        spec = ",".join(t for t, _ in others) + "->" + "".join(keep)
        r = g.einsum(spec, *(t for _, t in others))
        flat = [r.shape[keep.index(c)] if c in keep else 1 for c in uniq]
        if list(r.shape) != flat:
            r = g.reshape(r, flat)
        if len(uniq) < len(term):
            r = _diagonal(g, r, uniq, term, dim, node)
        r = cast_to(g, r, x.dtype)
        out.append(expand(g, r, x))  # letters summed away in the forward op
    return out


def _diagonal(
    g: EinsumGraph, r: Tensor, uniq: list[str], term: str, dim: dict, node: Node
) -> Tensor:
    """``r`` over the distinct letters of ``term`` placed on the diagonals of ``term``."""
    fresh = einspec.symbols(set(term) | set(uniq))
    full, eyes, eye_terms = "", [], []
    seen: set[str] = set()
    for c in term:
        if c not in seen:
            seen.add(c)
            full += c
            continue
        n = dim[c]
        if isinstance(n, str):
            raise GradError(
                f"node {node.name!r} (einsum {node.args['spec']}): the gradient of "
                f"a repeated index {c!r} over the symbolic dimension {n!r} needs "
                "its size; bind the symbol (graph.bind) first"
            )
        d = next(fresh)
        full += d
        eyes.append(g.constant(np.eye(n, dtype=r.dtype)))
        eye_terms.append(c + d)
    spec = ",".join(["".join(uniq), *eye_terms]) + "->" + full
    return g.einsum(spec, r, *eyes)


def reduce(g: EinsumGraph, node: Node, ct: Tensor, need: Sequence[bool]) -> Cts:
    """sum/mean: the cotangent broadcast back; max/min: shared equally by the elements equal
    to the result (torch's amax); prod: the product of the others (zeros handled);
    logsumexp: the softmax of the input."""
    if not need[0]:
        return [None]
    x, y = _t(g, node.inputs[0]), _t(g, node.id)
    axes = tuple(node.args["axes"])
    ck = keepdims(g, ct, x.shape, axes)
    op = node.op
    if op == "sum":
        d = None
    elif op == "mean":
        d = count(g, x, axes)
        d = 1.0 / d if isinstance(d, float) else g.reciprocal(d)
    else:
        yk = keepdims(g, y, x.shape, axes)
        if op in ("max", "min"):
            hit = g.cast(g.binary("eq", x, yk), x.dtype)  # 1/0 where x is the extreme
            d = g.binary("div", hit, g.sum(hit, axis=axes, keepdims=True))
        elif op == "logsumexp":
            d = g.exp(g.binary("sub", x, yk))
        elif op == "prod":
            d = _prod_derivative(g, x, yk, axes)
        else:
            raise GradError(f"node {node.name!r}: no gradient rule for the reduction {op!r}")
    if d is None:
        r = ck
    elif isinstance(d, float) and ck.node.kind == ops.CONSTANT:  # the loss's seed, folded here
        r = g.constant(np.asarray(g.constants[ck.id] * d).astype(ck.dtype))
    else:
        r = g.binary("mul", ck, conj(g, d) if isinstance(d, Tensor) else scalar(g, d, ck.dtype))
    return [cast_to(g, expand(g, r, x), x.dtype)]


def _prod_derivative(g: EinsumGraph, x: Tensor, yk: Tensor, axes) -> Tensor:
    """d prod / d x_i: y / x_i where no factor is 0; with one zero, the product of the others
    at the zero and 0 elsewhere; with two or more zeros, 0."""
    one = scalar(g, 1.0, x.dtype)
    zero = g.binary("eq", x, scalar(g, 0.0, x.dtype))
    zeros = g.sum(zero, axis=axes, keepdims=True)
    safe = g.where(zero, one, x)
    rest = g.prod(safe, axis=axes, keepdims=True)
    at_zero = g.binary("mul", g.binary("eq", zeros, scalar(g, 1.0, zeros.dtype)), rest)
    return g.where(zero, at_zero, g.binary("div", yk, safe))


def rowop(g: EinsumGraph, node: Node, ct: Tensor, need: Sequence[bool]) -> Cts:
    """softmax, log_softmax and layer_norm: one backward row op of the op table
    (``ops.ROW_GRAD_PROGRAMS``): softmax and log_softmax read their result, layer_norm its input
    (its mean and rstd are recomputed in the row pass rather than kept)."""
    if not need[0]:
        return [None]
    x, y = _t(g, node.inputs[0]), _t(g, node.id)
    if node.op not in ops.ROW_GRAD_PROGRAMS:
        raise GradError(f"node {node.name!r}: no gradient rule for the row op {node.op!r}")
    first = x if ops.ROW_GRAD_OPERANDS[node.op][0] == "x" else y
    first = cast_to(g, first, ct.dtype)
    r = g.row_grad(node.op, [first, ct], int(node.args["axis"]), node.args.get("eps"))
    return [cast_to(g, r, x.dtype)]


def rowgrad(g: EinsumGraph, node: Node, ct: Tensor, need: Sequence[bool]) -> Cts:
    """A backward row op (a gradient of a gradient): its program written out as ordinary
    reduction and elementwise nodes, then differentiated node by node."""
    xs = [_t(g, i) for i in node.inputs]
    env = dict(zip(ops.ROW_GRAD_OPERANDS[node.op], xs))
    ax = int(node.args["axis"])
    n = count(g, xs[0], (ax,))
    env["inv_n"] = scalar(g, 1.0 / n, node.dtype) if isinstance(n, float) else g.reciprocal(n)
    if "eps" in node.args:
        env["eps"] = scalar(g, float(node.args["eps"]), node.dtype)
    before = {n.id for n in g.nodes}
    result = _written_out(g, ops.ROW_GRAD_PROGRAMS[node.op], env, ax, node.dtype)
    # reverse sweep over the nodes just built, from the result back to the operands
    built = [n.id for n in g.nodes if n.id not in before]
    cts: dict[int, Tensor] = {result.id: ct}
    for nid in reversed(built):
        if nid not in cts:
            continue
        sub = g.node(nid)
        c = cts.pop(nid)
        sub_need = [True] * len(sub.inputs)
        for i, r in zip(sub.inputs, RULES[sub.kind](g, sub, c, sub_need)):
            if r is not None:
                cts[i] = r if i not in cts else g.binary("add", cts[i], r)
    return [cts.get(x.id) if need[k] else None for k, x in enumerate(xs)]


def _written_out(g: EinsumGraph, program, env: dict, ax: int, dtype: str) -> Tensor:
    """A row program as graph nodes (maps and lets are plain values; a reduce keeps its axis)."""

    def value(e):
        if isinstance(e, str):
            return env[e]
        if isinstance(e, (int, float)):
            return scalar(g, float(e), dtype)
        name, *args = e
        vals = [value(a) for a in args]
        return g.unary(name, vals[0]) if len(vals) == 1 else g.binary(name, *vals)

    for st in program:
        if st.kind == "reduce":
            env[st.name] = g.reduce(st.combine, value(st.expr), axis=ax, keepdims=True)
        elif st.kind in ("let", "map"):
            env[st.name] = value(st.expr)
        else:
            return value(st.expr)
    raise GradError("a backward row program without a write step")


def transpose(g: EinsumGraph, node: Node, ct: Tensor, need: Sequence[bool]) -> Cts:
    """The cotangent transposed back."""
    if not need[0]:
        return [None]
    inverse = [0] * len(node.args["perm"])
    for k, p in enumerate(node.args["perm"]):
        inverse[p] = k
    return [g.transpose(ct, inverse)]


def reshape(g: EinsumGraph, node: Node, ct: Tensor, need: Sequence[bool]) -> Cts:
    """The cotangent reshaped back."""
    if not need[0]:
        return [None]
    return [g.reshape(ct, list(g.node(node.inputs[0]).shape))]


def cast(g: EinsumGraph, node: Node, ct: Tensor, need: Sequence[bool]) -> Cts:
    """The cotangent cast back (complex to real keeps the real part)."""
    if not need[0]:
        return [None]
    return [cast_to(g, ct, g.node(node.inputs[0]).dtype)]


def attention(g: EinsumGraph, node: Node, ct: Tensor, need: Sequence[bool]) -> Cts:
    """Flash attention's backward as einsums: the probabilities are recomputed from q and k
    (the forward kernel keeps no S x S matrix), in float32 at least as the forward computes."""
    q, k, v = (_t(g, i) for i in node.inputs[:3])
    mask = _t(g, node.inputs[3]) if len(node.inputs) == 4 else None
    scale, causal = float(node.args["scale"]), bool(node.args["causal"])
    rank = len(node.shape)
    perms = [attn_ir.to_canonical_perm(rank, j) for j in attn_ir.layout_of(node.args, rank)]
    if any(p != list(range(rank)) for p in perms):
        # another memory layout: the canonical rule over transposed q, k, v and cotangent
        q, k, v = (g.transpose(t, p) for t, p in zip((q, k, v), perms))
        ct = g.transpose(ct, perms[3])
    cts = _attention_canonical(g, node, q, k, v, mask, ct, scale, causal, need)
    back = [[int(a) for a in np.argsort(p)] for p in perms[:3]]
    cts[:3] = [
        c if c is None or p == list(range(rank)) else g.transpose(c, p)
        for c, p in zip(cts[:3], back)
    ]
    xs = [_t(g, i) for i in node.inputs]
    return [None if r is None else cast_to(g, r, x.dtype) for r, x in zip(cts, xs)]


def _attention_canonical(g, node, q, k, v, mask, ct, scale, causal, need) -> Cts:
    """The cotangents of attention over canonical ``(*batch, S, D)`` operands (work dtype)."""
    work = "float32" if q.dtype in ("float16", "bfloat16") else q.dtype
    q, k, v, ctw = (cast_to(g, t, work) for t in (q, k, v, ct))
    scale_t = scalar(g, scale, work)
    s = g.binary("mul", g.einsum("...qd,...kd->...qk", q, k), scale_t)
    if mask is not None:
        s = g.binary("add", s, cast_to(g, mask, work))
    if causal:
        sq, sk = s.shape[-2:]
        if isinstance(sq, str) or isinstance(sk, str):
            raise GradError(
                f"node {node.name!r}: the gradient of causal attention over a "
                f"symbolic sequence length ({sq}, {sk}) needs its size; bind the "
                "symbol (graph.bind) first"
            )
        hide = np.where(np.arange(sk)[None, :] > np.arange(sq)[:, None], -np.inf, 0.0)
        s = g.binary("add", s, g.constant(hide.astype(work)))
    p = g.softmax(s, -1)
    out: Cts = [None] * len(node.inputs)
    if need[2]:
        out[2] = g.einsum("...qk,...qv->...kv", p, ctw)
    if need[0] or need[1] or (mask is not None and need[3]):
        dp = g.einsum("...qv,...kv->...qk", ctw, v)
        ds = g.binary(
            "mul", p, g.binary("sub", dp, g.sum(g.binary("mul", dp, p), axis=-1, keepdims=True))
        )
        if need[0]:
            out[0] = g.binary("mul", g.einsum("...qk,...kd->...qd", ds, k), scale_t)
        if need[1]:
            out[1] = g.binary("mul", g.einsum("...qk,...qd->...kd", ds, q), scale_t)
        if mask is not None and need[3]:
            out[3] = unbroadcast(g, ds, mask.shape)
    return out


def fused(g: EinsumGraph, node: Node, ct: Tensor, need: Sequence[bool]) -> Cts:
    """Fused nodes exist only in optimized graphs: differentiate the graph before compiling."""
    raise GradError(
        f"node {node.name!r} is a fused node, made by the optimizer; take the "
        "gradient of the graph as built (tl.grad before tl.compile optimizes it)"
    )


# node kind -> its rule; inputs and constants are leaves (no rule). A node kind added to
# ops.NODE_KINDS needs a line here (tests/autodiff/test_rules_cover.py checks it).
RULES: dict[str, Rule] = {
    ops.EINSUM: einsum,
    ops.UNARY: elementwise,
    ops.BINARY: elementwise,
    ops.WHERE: where,
    ops.REDUCE: reduce,
    ops.ROWOP: rowop,
    ops.ROWGRAD: rowgrad,
    ops.TRANSPOSE: transpose,
    ops.RESHAPE: reshape,
    ops.CAST: cast,
    ops.ATTENTION: attention,
    ops.FUSED: fused,
}
