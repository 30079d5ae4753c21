"""The cupy backend's attention step: the generated flash-attention kernel, compiled once.

Inputs that are not C-contiguous (a transposed view from the attention pass) are copied to a
contiguous layout first, O(S * D); the mask is read in place through one offset per batch index
and two strides (zero for broadcast axes), so a ``(Sq, Sk)`` mask shared by every head is never
expanded.
"""

from __future__ import annotations

import math

import cupy
import numpy as np

from ...errors import BackendError
from ...ir import attention as attn_ir
from . import attention_c

_MAX_GRID_Y = 65535
_SMEM_OPTIN_ATTR = 97  # cudaDevAttrMaxSharedMemoryPerBlockOptin
_FUNC_MAX_DYN_SMEM = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


def _set_dynamic_smem(fn, nbytes: int) -> None:
    try:
        fn.max_dynamic_shared_size_bytes = nbytes
    except AttributeError:  # an older CuPy: set it through the driver
        from cupy.cuda import driver

        driver.funcSetAttribute(fn.ptr, _FUNC_MAX_DYN_SMEM, nbytes)


def _mask_layout(mask_shape, batch, sq, sk):
    """(offset per flattened batch index, row stride, key stride) of a C-contiguous mask
    broadcast to ``(*batch, sq, sk)``."""
    full = (*batch, sq, sk)
    shape = (1,) * (len(full) - len(mask_shape)) + tuple(mask_shape)
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(0 if dim == 1 else acc)
        acc *= dim
    strides = strides[::-1]
    nb = math.prod(batch)
    offsets = np.zeros(max(nb, 1), np.int64)
    for flat, idx in enumerate(np.ndindex(*batch) if batch else [()]):
        offsets[flat] = sum(i * s for i, s in zip(idx, strides))
    return offsets, strides[-2], strides[-1]


class AttentionKernel:
    """``kernel(inputs, out)`` for an attention node on CuPy arrays."""

    def __init__(self, backend, node, in_nodes) -> None:
        shapes = [tuple(int(x) for x in n.shape) for n in in_nodes]
        q, k, v = shapes[:3]
        self.batch, self.sq, self.d = q[:-2], q[-2], q[-1]
        self.sk, self.dv = k[-2], v[-1]
        self.nb = math.prod(self.batch)
        self.dtype = node.dtype
        scale, causal = attn_ir.check_args(node.args, f"node {node.name!r}")
        self.has_mask = len(in_nodes) == 4
        if node.dtype not in attention_c.CTYPE:
            raise BackendError(f"node {node.name!r}: the GPU attention kernel takes "
                               f"{sorted(attention_c.CTYPE)}, not {node.dtype}")
        self.smem = attention_c.shared_bytes(self.d, self.dv, node.dtype)
        limit = cupy.cuda.runtime.deviceGetAttribute(_SMEM_OPTIN_ATTR, backend.device_id)
        if self.smem > limit:
            raise BackendError(
                f"node {node.name!r}: attention with head dims {self.d}/{self.dv} in "
                f"{node.dtype} needs {self.smem} bytes of shared memory per block; this GPU "
                f"allows {limit}")
        name = (f"tl_attention_{node.dtype}_d{self.d}_v{self.dv}"
                f"{'_causal' if causal else ''}{'_mask' if self.has_mask else ''}")
        src = attention_c.render(name, self.d, self.dv, node.dtype, causal, self.has_mask)
        self.source = src
        self.fn = backend.compiler.function(src, name, "cuda")
        _set_dynamic_smem(self.fn, self.smem)
        tm, _ = attention_c.tiles(node.dtype)
        self.grid_x = -(-self.sq // (16 * tm))
        self.scale = np.float64(scale) if node.dtype == "float64" else np.float32(scale)
        if self.has_mask:
            offs, self.msq, self.msk = _mask_layout(shapes[3], self.batch, self.sq, self.sk)
            self.moff = cupy.asarray(offs)
        else:
            self.moff, self.msq, self.msk = None, 0, 0
        macs = self.nb * self.sq * self.sk * (self.d + self.dv)
        self.flops = 2 * macs // (2 if causal else 1)
        self.info = (f"flash attention (FFMA, {16 * tm}-row tiles, {self.smem // 1024} KiB shared)"
                     f"{' causal' if causal else ''}{' +mask' if self.has_mask else ''}")

    def __call__(self, args, out):
        if self.sq == 0 or self.dv == 0 or self.nb == 0:
            return out
        q, k, v = (cupy.ascontiguousarray(a) for a in args[:3])
        mask = cupy.ascontiguousarray(args[3]) if self.has_mask else None
        target = out if out.flags.c_contiguous else cupy.empty(out.shape, out.dtype)
        null = np.uint64(0)
        for b0 in range(0, self.nb, _MAX_GRID_Y):
            nb = min(_MAX_GRID_Y, self.nb - b0)
            self.fn((self.grid_x, nb, 1), (attention_c.THREADS, 1, 1),
                    (target, q, k, v, mask if mask is not None else null,
                     self.moff if self.moff is not None else null, np.int32(self.sq),
                     np.int32(self.sk), np.int64(self.msq), np.int64(self.msk), self.scale,
                     np.int32(b0)),
                    shared_mem=self.smem)
        if target is not out:
            out[...] = target
        return out
