"""Which code path runs a generated-kind node on the cupy backend (no CuPy needed: tested on CI).

Float kernels (float16, bfloat16, float32, float64 storage and arithmetic) render as PTX or CUDA C,
as the plan's ``codegen`` option says. The PTX emitter renders no integer, bool or complex
kernel, so those render as CUDA C. What CUDA C does not compute as numpy does (integer pow and
reciprocal, complex sqrt/tanh/abs and the ops built on them: ``cuda_c.generates``) and casts
between dtype kinds run on CuPy's own loops, which follow numpy's semantics and result dtypes.
"""

from __future__ import annotations

import math

from ... import dtypes
from ...ir import ops
from . import cuda_c
from .spec import PTX_DTYPES, contiguous_strides, make_spec, program_of


def compute_dtype(node, in_nodes) -> str:
    """The dtype a node's generated kernel computes in, where it is not the node's own: a
    comparison (bool result) compares its operands in their promoted dtype."""
    if node.kind == ops.BINARY and node.op in ops.COMPARISONS and in_nodes:
        return dtypes.promote(*(n.dtype for n in in_nodes))
    return ""


def ptx_renders(node, in_nodes, compute: str) -> bool:
    """Whether the PTX emitter renders this node (float storage and float arithmetic)."""
    return (compute or node.dtype) in PTX_DTYPES and all(
        d in PTX_DTYPES for d in (node.dtype, *(n.dtype for n in in_nodes))
    )


def kernel_path(node, in_nodes, codegen: str) -> str | None:
    """How a generated-kind node runs: "ptx" or "cuda" (the plan's ``codegen`` for float
    kernels; CUDA C for integer, bool and complex ones, which the PTX emitter does not render),
    or None: CuPy's own loops, for what CUDA C does not compute as numpy does
    (``cuda_c.generates``) and for casts between dtype kinds."""
    compute = compute_dtype(node, in_nodes)
    if ptx_renders(node, in_nodes, compute):
        return codegen
    if node.kind == ops.CAST:
        return None
    if math.prod(int(d) for d in node.shape) == 0:
        return "cuda"
    shapes = [tuple(int(d) for d in n.shape) for n in in_nodes]
    spec = make_spec(
        program_of(node, in_nodes),
        node.dtype,
        shapes,
        [n.dtype for n in in_nodes],
        [contiguous_strides(s) for s in shapes],
        compute,
    )
    return "cuda" if cuda_c.generates(spec) else None
