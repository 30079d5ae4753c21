"""Which contractions take their consumer as a GEMM epilogue (no device needed: tested on CI).

A GEMM with a fused epilogue computes ``D = act(A @ B + bias [+ C])`` with the bias a vector
along D's columns (our row-major view) and ``act`` one of nothing, ReLU or the tanh GELU. The
cupy backend runs such a pair as one cuBLASLt call (``CUBLASLT_EPILOGUE_BIAS`` / ``RELU_BIAS`` /
``GELU_BIAS``; the residual ``C`` enters with ``beta = 1``), the numba backend as GEMM blocks
that each finish their own tile while it is in cache (``gemm_numba``), instead of a GEMM that
writes its result to memory and an elementwise kernel that reads it back.

A pair qualifies when, in the optimized graph:

- the producer is a two-operand einsum of one matrix product: a 2-D weight ``W`` over
  ``(k, n)`` or ``(n, k)``, the other operand over ``(m..., k)`` or ``(k, m...)`` with the
  output ``(m..., n)`` (the ``m`` axes flatten into the GEMM's rows), every dtype the same
  one of the backend's epilogue dtypes (``find``'s ``dtypes``);
- its only consumer is an elementwise step (a binary add or a fused group without a tail)
  computing ``gemm + bias``, optionally wrapped in ``gelu`` or ``relu``, or without activation
  ``gemm + bias + residual``, where ``bias`` is a vector along the output's last axis (shape
  ``(n,)`` or ``(1, ..., n)``) and ``residual`` has the output's shape, all in the GEMM's dtype;
- the product is not a plan output, and no operand is a strided view.

Everything else keeps the two steps it had.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import ops
from ..ir.fused import FusedBody

# the cupy backend's epilogue dtypes (cuBLASLt's); host backends pass their own
DTYPES = ("bfloat16", "float16", "float32")
# cublasLtEpilogue_t values (cublasLt.h)
EPILOGUES = {None: ("BIAS", 4), "relu": ("RELU_BIAS", 6), "gelu": ("GELU_BIAS", 36)}


@dataclass(frozen=True)
class Epilogue:
    """One GEMM + epilogue step: what it reads and the GEMM it runs."""

    gemm: int  # node id of the contraction folded into the consumer's step
    consumer: int  # node id of the elementwise consumer (the step's node)
    inputs: tuple[int, ...]  # node ids the fused step reads: x, w, bias[, residual]
    activation: str | None  # None, "relu" or "gelu"
    residual: bool  # inputs[3] enters as C with beta = 1
    m: int  # rows of the row-major result (the flattened m axes)
    n: int  # columns (the bias's length)
    k: int  # contracted length
    x_transposed: bool  # x stored as (k, m...) instead of (m..., k)
    w_transposed: bool  # w stored as (n, k) instead of (k, n)

    @property
    def gemm_flops(self) -> int:
        """FLOPs of the folded product (its consumer's step counts only its own)."""
        return 2 * self.m * self.n * self.k

    @property
    def name(self) -> str:
        """The epilogue's name, cuBLASLt's (``GELU_BIAS`` ...)."""
        return EPILOGUES[self.activation][0]

    @property
    def code(self) -> int:
        """The ``cublasLtEpilogue_t`` value."""
        return EPILOGUES[self.activation][1]

    def describe(self, gemm_name: str, runner: str = "cuBLASLt") -> str:
        """What ``print(plan)`` shows for the step (``runner``: what runs it)."""
        extra = " + residual" if self.residual else ""
        return f"{runner} epilogue {self.name}{extra} of {gemm_name!r} ({self.m}x{self.n}x{self.k})"


def find(graph, order, views=frozenset(), dtypes=DTYPES) -> dict[int, Epilogue]:
    """Consumer node id -> its epilogue pair, for every qualifying pair among ``order``.

    Args:
        graph: the optimized graph.
        order: the scheduled node ids.
        views: node ids whose buffers are views (strided layouts a GEMM can't take as is).
        dtypes: the dtypes the backend's epilogue GEMMs compute in.
    """
    uses: dict[int, int] = {}
    for nid in order:
        for i in graph.node(nid).inputs:
            uses[i] = uses.get(i, 0) + 1
    outputs = set(graph.outputs.values())
    found: dict[int, Epilogue] = {}
    for nid in order:
        node = graph.node(nid)
        if node.kind not in (ops.BINARY, ops.FUSED) or node.dtype not in dtypes:
            continue
        for pos, src in enumerate(node.inputs):
            gemm = graph.node(src)
            if gemm.kind != ops.EINSUM or uses.get(src) != 1 or src in outputs:
                continue
            epi = _pair(graph, node, pos, gemm, views, dtypes)
            if epi is not None:
                found[nid] = epi
            break  # the one einsum operand this consumer can fold (it is used only here)
    return found


def _pair(graph, node, pos: int, gemm, views, dtypes) -> Epilogue | None:
    layout = gemm_layout(gemm, [graph.node(i) for i in gemm.inputs], dtypes)
    if layout is None or node.dtype != gemm.dtype or tuple(node.shape) != tuple(gemm.shape):
        return None
    expr = _consumer_expr(node)
    if expr is None:
        return None
    act, terms = expr
    if ("in", pos) not in terms or len(terms) not in (2, 3) or len(set(terms)) != len(terms):
        return None
    others = [t[1] for t in terms if t != ("in", pos)]
    if any(t[0] != "in" for t in terms):
        return None
    n = int(gemm.shape[-1])
    shape = tuple(int(d) for d in gemm.shape)
    bias = res = None
    for k in others:
        o = graph.node(node.inputs[k])
        if o.dtype != node.dtype:
            return None
        oshape = tuple(int(d) for d in o.shape)
        if bias is None and _is_row_vector(oshape, shape, n):
            bias = node.inputs[k]
        elif res is None and oshape == shape:
            res = node.inputs[k]
        else:
            return None
    if bias is None or (res is not None and act is not None):
        return None  # cuBLASLt adds C before its activation: a residual only without one
    reads = (*gemm.inputs, bias) + ((res,) if res is not None else ())
    if any(i in views for i in reads):
        return None
    x_pos, x_t, w_t, m, k = layout
    x_id, w_id = gemm.inputs[x_pos], gemm.inputs[1 - x_pos]
    return Epilogue(
        gemm.id,
        node.id,
        (x_id, w_id, bias) + ((res,) if res is not None else ()),
        act,
        res is not None,
        m,
        n,
        k,
        x_t,
        w_t,
    )


def _is_row_vector(oshape, shape, n: int) -> bool:
    """A bias broadcast along the output's last axis: (n,) or (1, ..., 1, n)."""
    return 1 <= len(oshape) <= len(shape) and oshape[-1] == n and all(d == 1 for d in oshape[:-1])


def gemm_layout(gemm, in_nodes, dtypes=DTYPES) -> tuple[int, bool, bool, int, int] | None:
    """(position of x, x transposed, w transposed, m, k) of an einsum that is one matrix
    product of a 2-D weight, else None."""
    spec = gemm.args["spec"]
    if len(in_nodes) != 2 or "." in spec or "->" not in spec:
        return None
    if gemm.dtype not in dtypes or any(i.dtype != gemm.dtype for i in in_nodes):
        return None
    lhs, out = spec.split("->")
    terms = lhs.split(",")
    if len(terms) != 2 or not out or any(len(set(t)) != len(t) for t in (*terms, out)):
        return None
    n_ax, ms = out[-1], out[:-1]
    for w_pos in (1, 0):
        w, x = terms[w_pos], terms[1 - w_pos]
        if len(w) != 2 or n_ax not in w:
            continue
        k_ax = w.replace(n_ax, "")
        if k_ax in out or x not in (ms + k_ax, k_ax + ms):
            continue
        xs = tuple(int(d) for d in in_nodes[1 - w_pos].shape)
        k = xs[-1] if x.endswith(k_ax) else xs[0]
        m = 1
        for d in gemm.shape[:-1]:
            m *= int(d)
        if min(m, k, int(gemm.shape[-1])) <= 0 or max(m, k, int(gemm.shape[-1])) >= 2**31:
            return None
        # a 1-D x reads the same either way: call it untransposed
        return 1 - w_pos, bool(ms) and x.startswith(k_ax), w == n_ax + k_ax, m, k
    return None


def _consumer_expr(node) -> tuple[str | None, list] | None:
    """(activation, the refs summed under it) of an add chain, optionally under gelu/relu;
    None for any other program."""
    if node.kind == ops.BINARY:
        if node.op != "add":
            return None
        return None, [("in", 0), ("in", 1)]
    body = FusedBody.from_args(node.args["body"])
    if body.tail is not None or body.epilogue or not body.instrs:
        return None
    instrs = list(body.instrs)
    act = None
    if instrs[-1].op in ("gelu", "relu"):
        last = instrs.pop()
        if last.args != (("tmp", len(instrs) - 1),) or not instrs:
            return None
        act = last.op
    # every remaining instruction an add, each result used once, by the next one
    terms: list = []
    for j, ins in enumerate(instrs):
        if ins.op != "add" or len(ins.args) != 2:
            return None
        chained = [r for r in ins.args if r[0] == "tmp"]
        if chained != ([("tmp", j - 1)] if j else []):
            return None
        terms.extend(r for r in ins.args if r[0] != "tmp")
    return act, terms
