"""The cupy backend's attention step: the generated flash-attention kernel, compiled once.

bfloat16 and float16 with head dims that are multiples of 16 up to 128 run the tensor-core
kernel of ``attention_mma`` on sm_80 and later; float32 with head dims that are multiples of 8
up to 128 runs the TF32 tensor-core kernel of ``attention_tf32`` there (three MMAs per product,
float32-level error; one under ``matmul_precision="tf32"``); everything else runs the exact
FFMA kernel of ``attention_c``. Each reads q, k, v and writes the result in the node's layout
(``layout_strides``: a ``(B, S, H, D)`` projection output is read in place). Inputs that are
not C-contiguous (a transposed view from the attention pass) are copied to a contiguous layout
first, O(S * D); the mask is read in place
through one offset per batch index and two strides (zero for broadcast axes), so a ``(Sq, Sk)``
mask shared by every head is never expanded.
"""

from __future__ import annotations

import math

import cupy
import numpy as np

from ...errors import BackendError
from ...ir import attention as attn_ir
from . import attention_c, attention_mma, attention_tf32

# 16-bit attention runs on tensor cores (attention_mma) where the head dims allow; False keeps
# every dtype on the exact FFMA kernel (tests compare the two)
USE_MMA = True
# the tensor-core kernel's block shape (attention_mma.Config); None: chosen per shape by
# mma_config, from the measurements in benchmarks/RESULTS.md
MMA_CONFIG: attention_mma.Config | None = None
# a positive scale without a mask tensor: the 16-bit kernel takes the raw-score maxima and
# scales and shifts in one FMA (H100, bf16, S=4096, head dim 64: 0.143 ms against 0.154 for
# the first kernel; head dim 128 since its addresses are constants, 0.219 ms against 0.222;
# False: the generic kernel everywhere, to compare)
RAW_SCORES = True
# the float32 kernel's block shape (attention_tf32.Config); None: chosen by tf32_config
TF32_CONFIG: attention_tf32.Config | None = None

_MAX_GRID_Y = 65535
_SM_COUNT_ATTR = 16  # cudaDevAttrMultiProcessorCount
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


def layout_strides(shape, j: int) -> tuple[int, int, int]:
    """(inner batch count, row stride, outer batch stride) in elements of a C-contiguous tensor
    of ``shape`` with its sequence axis at ``j`` (``ir/attention.py``): batch index ``b`` of
    the canonical ``(*batch, S, D)`` view is ``(b // inner, b % inner)`` over the axes before
    and after the sequence axis, its row ``r`` at ``(b // inner) * outer + (b % inner) * D +
    r * row`` (an empty batch counts as 1: nothing is launched for it)."""
    shape = tuple(int(x) for x in shape)
    inner = max(1, math.prod(shape[j + 1 : -1]))
    row = inner * shape[-1]
    return inner, row, shape[j] * row


def mma_config(sq: int, nb: int, d: int, dv: int, causal: bool, sms: int) -> attention_mma.Config:
    """The tensor-core kernel's block shape for ``nb`` batch indices of ``sq`` query rows on a
    GPU of ``sms`` multiprocessors.

    Where blocks of 128 rows would leave multiprocessors idle (a short sequence, few heads):
    64-row blocks of 4 warps. Otherwise FlashAttention-2's shape, 4 warps of 32 rows (each key
    and value fragment feeds two MMAs), the query fragments in registers up to head dim 64;
    under a causal mask, paired blocks (every block walks about as many key tiles), and for
    wider heads 8 warps of 16 rows there (the 32-row variant runs out of registers).
    """
    if -(-sq // 128) * nb < sms:
        return attention_mma.Config(warps=4)
    if max(d, dv) <= 64:
        return attention_mma.Config(warps=4, mt=2, q_in_regs=True, pair=causal)
    if causal:
        return attention_mma.Config(warps=8, mt=1, q_in_regs=True, pair=True)
    return attention_mma.Config(warps=4, mt=2, q_in_regs=False)


def tf32_config(sq: int, nb: int, d: int, dv: int, causal: bool, sms: int) -> attention_tf32.Config:
    """The float32 tensor-core kernel's block shape, measured on an H100 (benchmarks/RESULTS.md)
    among 4/8 warps, 16/32 rows a warp, 32/64 keys a tile, query in registers or shared memory.

    Head dims up to 64 without a causal mask, where 128-row blocks fill the multiprocessors: 4
    warps of 32 rows, the query read from shared memory (each key and value fragment and its
    split feed two m-tiles: 1.1x at B=1..8, S=1024..4096). Otherwise 4 warps of 16 rows with
    the split query fragments in registers; paired blocks under a causal mask. 32-key tiles.
    """
    if not causal and max(d, dv) <= 64 and -(-sq // 128) * nb >= sms:
        return attention_tf32.Config(warps=4, mt=2, q_in_regs=False, bn=32)
    return attention_tf32.Config(warps=4, mt=1, q_in_regs=True, bn=32, pair=causal)


class AttentionKernel:
    """``kernel(inputs, out)`` for an attention node on CuPy arrays."""

    def __init__(self, backend, node, in_nodes) -> None:
        shapes = [tuple(int(x) for x in n.shape) for n in in_nodes]
        lay = attn_ir.layout_of(node.args, len(shapes[0]), f"node {node.name!r}")
        strides = [
            layout_strides(s, j)
            for s, j in zip((*shapes[:3], tuple(int(x) for x in node.shape)), lay)
        ]
        # compiled into the kernel (the strides follow from them, the head dims and S)
        self.inner = tuple(int(s[0]) for s in strides)
        q, k, v = (attn_ir.canonical_shape(s, j) for s, j in zip(shapes[:3], lay))
        self.batch, self.sq, self.d = q[:-2], q[-2], q[-1]
        self.sk, self.dv = k[-2], v[-1]
        self.nb = math.prod(self.batch)
        self.dtype = node.dtype
        scale, causal = attn_ir.check_args(node.args, f"node {node.name!r}")
        self.has_mask = len(in_nodes) == 4
        if node.dtype not in attention_c.CTYPE:
            raise BackendError(
                f"node {node.name!r}: the GPU attention kernel takes "
                f"{sorted(attention_c.CTYPE)}, not {node.dtype}"
            )
        self.backend, self.node_name = backend, node.name
        self.causal = causal
        # float32 on TF32 tensor cores: split into three MMAs unless the plan allows TF32
        self.tf32 = node.dtype == "float32" and attention_tf32.supports(self.d, self.dv, "float32")
        self.split = not getattr(backend, "tf32", False)
        self.mma = (
            USE_MMA
            and int(backend.arch) >= 80
            and (self.tf32 or attention_mma.supports(self.d, self.dv, node.dtype))
        )
        self._ffma = None
        self.scale = np.float64(scale) if node.dtype == "float64" else np.float32(scale)
        if self.mma:
            self.launch = self._compile(True)
        else:
            self.launch = self._ffma = self._compile(False)
        if self.has_mask:
            offs, self.msq, self.msk = _mask_layout(shapes[3], self.batch, self.sq, self.sk)
            self.moff = cupy.asarray(offs)
        else:
            self.moff, self.msq, self.msk = None, 0, 0
        macs = self.nb * self.sq * self.sk * (self.d + self.dv)
        self.flops = 2 * macs // (2 if causal else 1)
        self.info = (
            f"flash attention ({self._path()}, "
            f"{self.launch[4]}, {self.launch[1] // 1024} KiB shared)"
            f"{' causal' if causal else ''}{' +mask' if self.has_mask else ''}"
        )

    def _path(self) -> str:
        if not self.mma:
            return "FFMA"
        if self.tf32:
            return "tensor-core mma, " + ("3xTF32" if self.split else "TF32")
        return "tensor-core mma"

    def _mma_config(self):
        if self.tf32 and TF32_CONFIG is not None:
            return TF32_CONFIG
        if not self.tf32 and MMA_CONFIG is not None:
            return MMA_CONFIG
        sms = cupy.cuda.runtime.deviceGetAttribute(_SM_COUNT_ATTR, self.backend.device_id)
        pick = tf32_config if self.tf32 else mma_config
        return pick(self.sq, self.nb, self.d, self.dv, self.causal, sms)

    def _compile(self, mma: bool):
        """(function, shared bytes, grid x, threads, block shape in words) of one of the two
        kernels."""
        dt, d, dv = self.dtype, self.d, self.dv
        if mma:
            cfg = self._mma_config()
            mod = attention_tf32 if self.tf32 else attention_mma
            smem = mod.shared_bytes(d, dv, cfg)
            grid_x = mod.grid_x(self.sq, self.causal, cfg)
            threads = cfg.threads
            rows = (
                f"{cfg.rows}-row tiles: {cfg.warps} warps x {16 * cfg.mt} rows"
                f"{'' if cfg.q_in_regs else ', query from shared memory'}"
                f", {cfg.bn}-key tiles"
                f"{', paired blocks' if cfg.pair and self.causal else ''}"
            )
        else:
            smem = attention_c.shared_bytes(d, dv, dt)
            threads = 16 * attention_c.tiles(dt)[0]
            grid_x = -(-self.sq // threads)
            rows, threads = f"{threads}-row tiles", attention_c.THREADS
        limit = cupy.cuda.runtime.deviceGetAttribute(_SMEM_OPTIN_ATTR, self.backend.device_id)
        if smem > limit:
            raise BackendError(
                f"node {self.node_name!r}: attention with head dims {d}/{dv} in {dt} needs "
                f"{smem} bytes of shared memory per block; this GPU allows {limit}"
            )
        name = (
            f"tl_attention{'_mma' if mma else ''}_{dt}_d{d}_v{dv}"
            f"{'_causal' if self.causal else ''}{'_mask' if self.has_mask else ''}"
        )
        if self.inner != (1, 1, 1, 1):
            name += "_l" + "_".join(map(str, self.inner))
        if mma:
            name += f"_w{cfg.warps}m{cfg.mt}{'q' if cfg.q_in_regs else ''}{'p' if cfg.pair else ''}"
            name += f"_n{cfg.bn}"
            if self.tf32:
                name += "_x3" if self.split else "_tf32"
                src = attention_tf32.render(
                    name, d, dv, self.causal, self.has_mask, cfg, self.split, inner=self.inner
                )
            else:
                positive = RAW_SCORES and float(self.scale) > 0
                name += "_ps" if positive else ""
                src = attention_mma.render(
                    name,
                    d,
                    dv,
                    dt,
                    self.causal,
                    self.has_mask,
                    cfg,
                    inner=self.inner,
                    positive_scale=positive,
                )
        else:
            src = attention_c.render(name, d, dv, dt, self.causal, self.has_mask, self.inner)
        self.source = src
        fn = self.backend.compiler.function(src, name, "cuda")
        _set_dynamic_smem(fn, smem)
        return fn, smem, grid_x, threads, rows

    def __call__(self, args, out):
        if self.sq == 0 or self.dv == 0 or self.nb == 0:
            return out
        q, k, v = (cupy.ascontiguousarray(a) for a in args[:3])
        mask = cupy.ascontiguousarray(args[3]) if self.has_mask else None
        target = out if out.flags.c_contiguous else cupy.empty(out.shape, out.dtype)
        launch = self.launch
        if self.mma and any(a.data.ptr % 16 for a in (q, k, v, target)):
            # the tensor-core kernel moves rows 16 bytes at a time; an unaligned view takes
            # the FFMA kernel (compiled on first need)
            if self._ffma is None:
                self._ffma = self._compile(False)
            launch = self._ffma
        fn, smem, grid_x, threads, _ = launch
        null = np.uint64(0)
        for b0 in range(0, self.nb, _MAX_GRID_Y):
            nb = min(_MAX_GRID_Y, self.nb - b0)
            fn(
                (grid_x, nb, 1),
                (threads, 1, 1),
                (
                    target,
                    q,
                    k,
                    v,
                    mask if mask is not None else null,
                    self.moff if self.moff is not None else null,
                    np.int32(self.sq),
                    np.int32(self.sk),
                    np.int64(self.msq),
                    np.int64(self.msk),
                    self.scale,
                    np.int32(b0),
                ),
                shared_mem=smem,
            )
        if target is not out:
            out[...] = target
        return out
