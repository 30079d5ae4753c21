"""Recognize attention written with einsums and rewrite it to the one ``attention`` node.

The pattern, read backwards from the value contraction ``o``:

    s = einsum(q, k [, scalar constants...])    scores: one contracted letter (the head dim),
                                                one query and one key letter, the rest batch
    x = chain of s: * c, / c (scalar constants; the scale), + mask / - mask (one additive
        tensor), + causal constant (0 on and below the diagonal, -inf above),
        where(tril, ., -inf) / where(triu, -inf, .) (a causal condition), in any order
    p = softmax(x, axis of the key letter)
    o = einsum(p, v)                            contracts the key letter; v brings one new
                                                letter (the value dim); batch letters kept

Letters may be named and ordered in any way (head axes anywhere, operands in either order); the
rewrite inserts transposes (views on host backends) that bring q, k, v and the mask to the op's
``(*batch, S, D)`` layout and the result back to ``o``'s. It applies only when every
intermediate (s, the chain, p) is used by the pattern alone and is not a graph output, and all
share one dtype. A causal pattern becomes ``causal=True``: the S x S constant is dropped. A
causal fill must be -inf, or a finite value at most half the dtype's lowest (``finfo.min``
idiom), which gives the same softmax because every causal row keeps its first key; anything
else (e.g. -1e9) stays an additive mask tensor, which is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import GraphError
from ..ir import ops
from ..ir.graph import EinsumGraph, Node
from .base import PassResult, function_pass
from .util import constant_array, output_ids, parse_spec, remove_if_unused

# Causal constants are scanned in full; larger ones are left as additive masks.
_CAUSAL_SCAN_LIMIT = 1 << 28
# fuse_attention="auto" fuses an attention whose written-out scores hold at least this many
# bytes. Below it the scores stay in the caches between the score GEMM, the softmax and the
# value GEMM, and the written-out form runs each as one step over all cores (batched BLAS, a
# row-parallel softmax), where the fused host kernel drives many small block products from
# Python: measured on a 16-core host, a B=4 S=256 H=4 block's fused attention took 4.9 ms,
# the written-out steps about 0.5 ms. Above it the S x S scores cost memory and bandwidth that
# the blocked kernel never spends (S=4096: 1.2-2x faster, 1/15-1/30 of the planned peak).
AUTO_MIN_SCORE_BYTES = 64 << 20


class _Match:
    """What the matcher found: the nodes to read, the layout letters and the chain's effect."""

    def __init__(self) -> None:
        self.scale = 1.0
        self.mask: int | None = None
        self.mask_coef = 1.0
        self.causal = False
        self.chain: list[int] = []
        # additive terms ("add", (node, coefficient)) and where nodes ("where", (cond, fill,
        # keeps the scores where cond is true)) met on the chain, resolved by _finish_chain
        self.terms: list[tuple[str, tuple]] = []


def _scalar_constant(g: EinsumGraph, nid: int, like: Node) -> float | None:
    """The value of a one-element constant of ``like``'s dtype that broadcasts into it."""
    c = g.node(nid)
    if (
        c.kind != ops.CONSTANT
        or c.dtype != like.dtype
        or math.prod(c.shape) != 1
        or len(c.shape) > len(like.shape)
    ):
        return None
    v = float(np.asarray(g.constants[nid]).reshape(()))
    return v if math.isfinite(v) else None


def _private(g: EinsumGraph, nid: int, user: int, outputs: set[int]) -> bool:
    """``nid`` is no output and ``user`` is its only consumer (reading it once)."""
    return nid not in outputs and g.users(nid) == [user] and g.node(user).inputs.count(nid) == 1


def _aligned(arr: np.ndarray, rank: int) -> np.ndarray:
    return arr.reshape((1,) * (rank - arr.ndim) + arr.shape)


def _causal_2d(g: EinsumGraph, nid: int, scores: Node, qa: int, ka: int) -> np.ndarray | None:
    """The constant ``nid`` as a (Sq, Sk) matrix when it varies along the query and key axes
    only (every other axis of size 1), else None."""
    arr = constant_array(g, nid)
    rank = len(scores.shape)
    if arr is None or arr.ndim > rank or arr.size > _CAUSAL_SCAN_LIMIT:
        return None
    a = _aligned(arr, rank)
    sq, sk = scores.shape[qa], scores.shape[ka]
    if a.shape[qa] != sq or a.shape[ka] != sk:
        return None
    if any(d != 1 for i, d in enumerate(a.shape) if i not in (qa, ka)):
        return None
    m = a.reshape(a.shape[min(qa, ka)], a.shape[max(qa, ka)])
    return m if qa < ka else m.T


def _above(sq: int, sk: int) -> np.ndarray:
    """True where key j > query i."""
    return np.arange(sk)[None, :] > np.arange(sq)[:, None]


def _is_hidden(values: np.ndarray, dtype: str) -> np.ndarray:
    """Entries that hide a key for sure: -inf, or at most half the dtype's lowest value."""
    # ml_dtypes.finfo also knows bfloat16, which np.finfo refuses
    return values <= float(ml_dtypes.finfo(dtype).min) / 2


def _causal_additive(g, nid, scores, qa, ka) -> bool:
    m = _causal_2d(g, nid, scores, qa, ka)
    if m is None:
        return False
    above = _above(*m.shape)
    return bool(np.all(m[~above] == 0) and np.all(_is_hidden(m[above], scores.dtype)))


def _causal_where(g, cond, fill, scores, qa, ka, keep_where_true: bool) -> bool:
    """where(cond, scores, fill) (``keep_where_true``) or where(cond, fill, scores) is causal."""
    f = g.node(fill)
    if f.kind != ops.CONSTANT or math.prod(f.shape) != 1 or len(f.shape) > len(scores.shape):
        return False
    if not _is_hidden(np.asarray(g.constants[fill]).reshape(()), scores.dtype):
        return False
    m = _causal_2d(g, cond, scores, qa, ka)
    if m is None:
        return False
    keep = (m != 0) if keep_where_true else (m == 0)
    return bool(np.array_equal(keep, ~_above(*m.shape)))


def _chain(g: EinsumGraph, x: int, outputs: set[int], user: int) -> tuple[_Match, int] | None:
    """Walk the elementwise chain back from the softmax input to the scores einsum."""
    mt = _Match()
    factor = 1.0  # product of the scalar factors between the current node and the softmax
    while True:
        if not _private(g, x, user, outputs):
            return None
        n = g.node(x)
        if n.kind == ops.EINSUM:
            mt.scale = factor
            return mt, x
        mt.chain.append(x)
        if n.kind == ops.BINARY and n.op in ("mul", "div"):
            a, b = n.inputs
            pairs = ((a, b), (b, a)) if n.op == "mul" else ((a, b),)
            for y, c in pairs:
                val = _scalar_constant(g, c, n)
                if val is not None and val != 0 and tuple(g.node(y).shape) == tuple(n.shape):
                    factor = factor * val if n.op == "mul" else factor / val
                    break
            else:
                return None
        elif n.kind == ops.BINARY and n.op in ("add", "sub"):
            a, b = n.inputs
            pairs = ((a, b), (b, a)) if n.op == "add" else ((a, b),)
            for y, c in pairs:
                if (
                    tuple(g.node(y).shape) == tuple(n.shape)
                    and g.node(c).dtype == n.dtype
                    and c != y
                ):
                    break
            else:
                return None
            sign = 1.0 if n.op == "add" else -1.0
            mt.terms.append(("add", (c, factor * sign)))
        elif n.kind == ops.WHERE:
            cond, a, b = n.inputs
            if tuple(g.node(a).shape) == tuple(n.shape) and a != b:
                y, fill, keep_true = a, b, True
            elif tuple(g.node(b).shape) == tuple(n.shape):
                y, fill, keep_true = b, a, False
            else:
                return None
            if g.node(fill).dtype != n.dtype or factor <= 0:
                return None
            mt.terms.append(("where", (cond, fill, keep_true)))
        else:
            return None
        user, x = x, y


def _roles(g: EinsumGraph, s: Node, key_axis: int):
    """(q, k, q's letters, k's letters, the scores' letters, the product of scalar constant
    operands, the head-dim letter, the query letter) of a scores einsum, or None."""
    scal = 1.0
    tensors = []
    es = parse_spec(s.args["spec"], tuple(len(g.node(i).shape) for i in s.inputs))
    for term, i in zip(es.inputs, s.inputs):
        if term == "" and math.prod(g.node(i).shape) == 1:
            val = _scalar_constant(g, i, s)
            if val is None:
                return None
            scal *= val
        else:
            tensors.append((term, i))
    if len(tensors) != 2:
        return None
    out = es.output
    kl = out[key_axis]
    (ta, a), (tb, b) = tensors
    if kl in ta and kl not in tb:
        (ta, a), (tb, b) = (tb, b), (ta, a)
    tq, q, tk, k = ta, a, tb, b
    for t in (tq, tk, out):
        if len(set(t)) != len(t):
            return None
    contracted = (set(tq) & set(tk)) - set(out)
    batch = set(tq) & set(tk) & set(out)
    qonly = (set(tq) & set(out)) - set(tk)
    konly = (set(tk) & set(out)) - set(tq)
    if len(contracted) != 1 or len(qonly) != 1 or konly != {kl}:
        return None
    if (
        set(tq) != batch | qonly | contracted
        or set(tk) != batch | konly | contracted
        or set(out) != batch | qonly | konly
    ):
        return None
    return q, k, tq, tk, out, scal, contracted.pop(), qonly.pop()


def match(g: EinsumGraph, o: Node, outputs: set[int]):
    """The rewrite plan for a value contraction ``o``, or None."""
    if o.kind != ops.EINSUM or len(o.inputs) != 2 or o.inputs[0] == o.inputs[1]:
        return None
    es = parse_spec(o.args["spec"], tuple(len(g.node(i).shape) for i in o.inputs))
    for pi in (0, 1):
        p, v = o.inputs[pi], o.inputs[1 - pi]
        tp, tv, to = es.inputs[pi], es.inputs[1 - pi], es.output
        sm = g.node(p)
        if sm.kind != ops.ROWOP or sm.op != "softmax" or not _private(g, p, o.id, outputs):
            continue
        found = _chain(g, sm.inputs[0], outputs, p)
        if found is None:
            continue
        mt, sid = found
        s = g.node(sid)
        key_axis = int(sm.args["axis"])
        roles = _roles(g, s, key_axis)
        if roles is None:
            continue
        q, k, tq, tk, sout, scal, d, ql = roles
        plan = _layout(tp, tv, to, sout, ql, key_axis)
        if plan is None:
            continue
        nodes = [o, s, sm, *(g.node(c) for c in mt.chain), g.node(q), g.node(k), g.node(v)]
        if len({n.dtype for n in nodes}) != 1:
            continue
        if not _finish_chain(g, mt, s, sout.index(ql), key_axis):
            continue
        mt.scale *= scal
        return mt, q, k, v, tq, tk, tv, tp, sout, ql, d, plan
    return None


def _layout(tp: str, tv: str, to: str, sout: str, ql: str, key_axis: int):
    """Letters of the value contraction by role: (batch letters of o in o's order, the key and
    query letters of p, the value letter), or None when o is not the value contraction."""
    if (
        len(tp) != len(sout)
        or len(set(tp)) != len(tp)
        or len(set(tv)) != len(tv)
        or len(set(to)) != len(to)
    ):
        return None
    kp, qp = tp[key_axis], tp[sout.index(ql)]
    batch_p = [c for i, c in enumerate(tp) if i not in (key_axis, sout.index(ql))]
    if kp not in tv or kp in to or qp in tv or qp not in to:
        return None
    if any(c not in tv or c not in to for c in batch_p):
        return None
    extra = set(tv) - set(tp)
    if len(extra) != 1:
        return None
    e = extra.pop()
    if e not in to or set(to) != set(batch_p) | {qp, e} or set(tv) != set(batch_p) | {kp, e}:
        return None
    batch_o = [c for c in to if c in batch_p]
    return batch_o, kp, qp, e


def _finish_chain(g: EinsumGraph, mt: _Match, s: Node, qa: int, ka: int) -> bool:
    """Turn the chain's additive terms and where-nodes into a causal flag or one mask."""
    for kind, data in mt.terms:
        if kind == "where":
            cond, fill, keep_true = data
            if not _causal_where(g, cond, fill, s, qa, ka, keep_true) or mt.causal:
                return False
            mt.causal = True
        else:
            c, coef = data
            if coef > 0 and not mt.causal and _causal_additive(g, c, s, qa, ka):
                mt.causal = True
            elif mt.mask is None:
                mt.mask, mt.mask_coef = c, coef
            else:
                return False
    return True


def _perm(term: str, letters: list[str]) -> list[int]:
    return [term.index(c) for c in letters]


def _rewrite(g: EinsumGraph, o: Node, found) -> None:
    mt, q, k, v, tq, tk, tv, tp, sout, ql, d, (batch_o, kp, qp, e) = found
    tp_of = dict(zip(sout, range(len(sout))))  # scores letter -> axis
    # p's axes are the scores' axes: the value contraction's letters as scores letters
    batch_s = [sout[tp.index(c)] for c in batch_o]
    kl = sout[tp.index(kp)]
    out_term = parse_spec(o.args["spec"], tuple(len(g.node(i).shape) for i in o.inputs)).output

    def layout(nid: int, perm: list[int]) -> int:
        if perm == list(range(len(perm))):
            return nid
        return g.add_node(ops.TRANSPOSE, None, [nid], {"perm": perm})

    qn = layout(q, _perm(tq, batch_s + [ql, d]))
    kn = layout(k, _perm(tk, batch_s + [kl, d]))
    vn = layout(v, _perm(tv, batch_o + [kp, e]))
    inputs = [qn, kn, vn]
    if mt.mask is not None:
        m = mt.mask
        mshape = g.node(m).shape
        rank = len(sout)
        if len(mshape) < rank:
            m = g.add_node(
                ops.RESHAPE, None, [m], {"shape": [1] * (rank - len(mshape)) + list(mshape)}
            )
        if mt.mask_coef != 1.0:
            c = g.constant(np.array(mt.mask_coef), dtype=o.dtype).id
            m = g.add_node(ops.BINARY, "mul", [m, c])
        m = layout(m, [tp_of[c] for c in batch_s + [ql, kl]])
        inputs.append(m)
    args = {"scale": float(mt.scale), "causal": bool(mt.causal)}
    att_letters = batch_o + [qp, e]
    if list(out_term) == att_letters:
        new = Node(
            o.id,
            ops.ATTENTION,
            None,
            tuple(inputs),
            tuple(o.shape),
            o.dtype,
            o.name,
            MappingProxyType(args),
        )
    else:
        # the result's axis order as a one-operand einsum, not a transpose view: a consuming
        # einsum (an output projection) absorbs it when merged and plans the layout itself,
        # and anywhere else it is one copy into planned memory, where a strided view would make
        # a later contraction copy (and allocate) on every call
        a = g.add_node(ops.ATTENTION, None, inputs, args, name=f"{o.name}_attention")
        new = replace(
            o, inputs=(a,), args=MappingProxyType({"spec": f"{''.join(att_letters)}->{out_term}"})
        )
    old_inputs = o.inputs
    g.replace_node(o.id, new)
    for i in old_inputs:
        remove_if_unused(g, i)


def _score_bytes(g: EinsumGraph, o: Node) -> int:
    """Bytes of the written-out scores (the softmax that value contraction ``o`` reads)."""
    sizes = [
        math.prod(int(d) for d in g.node(i).shape) * np.dtype(g.node(i).dtype).itemsize
        for i in o.inputs
        if g.node(i).kind == ops.ROWOP
    ]
    return max(sizes, default=0)


def _attention(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Replace every written-out attention by one ``attention`` node.

    The compile option ``fuse_attention=False`` keeps the written-out form (to compare, or for
    an autotuner to try both); ``"auto"`` rewrites only attentions whose scores hold at least
    ``AUTO_MIN_SCORE_BYTES``; a tuple of dtype names fuses only attentions of those dtypes.
    """
    enabled = options.get("fuse_attention", True)
    if not isinstance(enabled, (bool, tuple)) and enabled != "auto":
        raise GraphError(
            f"fuse_attention must be True, False, 'auto' or a tuple of dtype names, got {enabled!r}"
        )
    if enabled is False or enabled == ():
        return PassResult(graph, False, {})
    only = frozenset(enabled) if isinstance(enabled, tuple) else None
    g: EinsumGraph | None = None
    found_n = 0
    for node in graph.nodes:
        cur = g if g is not None else graph
        if node.id not in cur:
            continue
        node = cur.node(node.id)
        if node.kind != ops.EINSUM or (only is not None and node.dtype not in only):
            continue
        found = match(cur, node, output_ids(cur))
        if found is None:
            continue
        if enabled == "auto" and _score_bytes(cur, node) < AUTO_MIN_SCORE_BYTES:
            continue
        if g is None:
            g = cur = graph.copy()
        _rewrite(g, node, found)
        found_n += 1
    if g is None:
        return PassResult(graph, False, {})
    g.reorder()
    return PassResult(g, True, {"attentions": found_n})


attention = function_pass("attention", _attention)
