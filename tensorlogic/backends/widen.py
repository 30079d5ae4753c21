"""16-bit floats on backends that compute in float32: widen, compute, round once.

float16 and bfloat16 tensors are stored in 16 bits, but every op on them computes (and every sum
accumulates) in float32, and each result is rounded once to its 16-bit dtype (round to nearest
even, as numpy and ml_dtypes convert). A host backend gets there by running the float32 kernel
of the node: its 16-bit operands are copied into float32 scratch buffers, the kernel writes a
float32 result, and that is converted into the 16-bit output. A fused node is one kernel, so
it too rounds once, as the GPU's generated kernels do (they load 16 bits, compute in float32
registers and round at the store).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .. import dtypes
from ..ir import ops
from .base import PreparedKernel, as_prepared

# kinds that move or convert values without arithmetic: they run on 16-bit arrays as they are
_EXACT_KINDS = (ops.TRANSPOSE, ops.RESHAPE, ops.CAST, ops.INPUT, ops.CONSTANT)


def needs_widening(node, in_nodes) -> bool:
    """Whether a node computes on (or into) a 16-bit float and so runs through ``widened``."""
    if node.kind in _EXACT_KINDS:
        return False
    return node.dtype in dtypes.HALF or any(n.dtype in dtypes.HALF for n in in_nodes)


def _f32(node):
    return replace(node, dtype="float32") if node.dtype in dtypes.HALF else node


def widened(xp, make: Callable[[Any, list], Any], node, in_nodes) -> PreparedKernel:
    """The kernel of a node with 16-bit operands or result.

    ``make(node, in_nodes)`` builds the backend's kernel for the float32 twin of the node (every
    16-bit dtype replaced by float32). Scratch: the inner kernel's, then one float32 buffer per
    16-bit input, then the float32 result when the result is 16-bit.
    """
    inner = as_prepared(make(_f32(node), [_f32(n) for n in in_nodes]), f"node {node.name!r}")
    run = inner.fn
    n = len(in_nodes)
    k_inner = len(inner.scratch)
    wide = [j for j, nd in enumerate(in_nodes) if nd.dtype in dtypes.HALF]
    shapes = [tuple(nd.shape) for nd in in_nodes]
    narrow_out = node.dtype in dtypes.HALF
    oshape = tuple(node.shape)

    def kernel(args, out):
        given = len(args) > n
        extra = args[n:]
        ins = list(args[:n])
        for w, j in enumerate(wide):
            if given:
                buf = extra[k_inner + w]
                xp.copyto(buf, ins[j])
            else:
                buf = ins[j].astype("float32")
            ins[j] = buf
        if narrow_out:
            res = extra[k_inner + len(wide)] if given else xp.empty(oshape, "float32")
        else:
            res = out
        run(ins + (list(extra[:k_inner]) if given else []), res)
        if narrow_out:
            xp.copyto(out, res, casting="unsafe")  # the one rounding of this result
        return out

    scratch = (
        tuple(inner.scratch)
        + tuple((shapes[j], "float32") for j in wide)
        + (((oshape, "float32"),) if narrow_out else ())
    )
    # a 16-bit out is written only after the inner kernel has read every input; a float32 out
    # is the inner kernel's own, with its rules
    inplace = tuple(range(n)) if narrow_out else tuple(inner.inplace)
    return PreparedKernel(
        kernel,
        flops=inner.flops,
        scratch=scratch,
        inplace=inplace,
        info=inner.info,
        source=inner.source,
        impl=inner,
    )
