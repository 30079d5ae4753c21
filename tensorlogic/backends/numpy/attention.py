"""The host kernel of the attention op: blocked, online softmax, never the full S x S scores.

For each batch index (batch, heads, ...) and each block of ``bq`` queries, the keys are visited
in blocks of ``bk``: ``s = (scale * q_blk) @ k_blk^T`` (BLAS) plus the mask block, then the
running row maximum ``m`` and row sum ``l`` are updated, the accumulator is rescaled by
``exp(m_old - m_new)`` and ``exp(s - m_new) @ v_blk`` (BLAS) is added to it; the block's rows are
divided by ``l`` at the end. A causal kernel skips key blocks wholly right of the diagonal and
masks the one it crosses. The scratch (a ``bq x bk`` score block, a ``bq x Dv`` accumulator, a
few rows) is declared per participating thread, so the plan's memory plan counts it.

The (batch index, query block) items are independent: they run on the calling thread and the
helper pool (``host_pool``), each with single-threaded BLAS (a multi-threaded BLAS call per
small block would only add synchronization), costliest items first so causal work balances.

float16 and bfloat16 compute in float32 (blocks are widened into scratch); float32 and float64
compute in their own dtype.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ...ir import attention as attn_ir
from . import host_pool
from ..base import PreparedKernel

# Query and key block sizes. A 256 x 512 float32 score block (512 KB) and its 256 x Dv
# accumulator stay in L2; larger key blocks mean fewer rescales. On the 2-vCPU machine (S=4096,
# D=64, numba backend, loaded) 128-512 rows by 256-1024 keys measured within noise of this.
BQ = 256
BK = 512
# Work below this many multiply-adds runs on the calling thread (a helper's wake-up costs more).
PARALLEL_MIN_MACS = 1 << 22

_controller = None
_controller_lock = threading.Lock()


def _blas_one_thread():
    """A context that limits BLAS to one thread (threadpoolctl; the controller is built once)."""
    global _controller
    if _controller is None:
        with _controller_lock:
            if _controller is None:
                from threadpoolctl import ThreadpoolController

                _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


def compute_dtype(dtype: str) -> str:
    """The dtype the kernel computes in: float32 for 16-bit floats, else the input's own."""
    return "float64" if dtype == "float64" else "float32"


class _Geometry:
    """Sizes of one attention node and the blocks the kernel uses."""

    def __init__(self, node, in_nodes) -> None:
        rank = len(in_nodes[0].shape)
        self.args = node.args
        self.canonical = attn_ir.is_canonical(node.args, rank)
        lay = attn_ir.layout_of(node.args, rank, f"node {node.name!r}")
        q, k, v = (
            attn_ir.canonical_shape(tuple(int(d) for d in n.shape), j)
            for n, j in zip(in_nodes[:3], lay)
        )
        self.batch = q[:-2]
        self.sq, self.d = q[-2], q[-1]
        self.sk, self.dv = k[-2], v[-1]
        self.scale, self.causal = attn_ir.check_args(node.args, f"node {node.name!r}")
        self.has_mask = len(in_nodes) == 4
        self.mask_shape = tuple(int(d) for d in in_nodes[3].shape) if self.has_mask else ()
        self.dtype = node.dtype
        self.cdt = compute_dtype(node.dtype)
        self.widen = self.cdt != node.dtype
        self.bq = max(1, min(BQ, self.sq))
        self.bk = max(1, min(BK, self.sk))
        self.n_batch = math.prod(self.batch)
        self.n_qblocks = -(-self.sq // self.bq) if self.sq else 0
        self.items = self.n_batch * self.n_qblocks
        macs = self.n_batch * self.sq * self.sk * (self.d + self.dv)
        if self.causal:
            macs //= 2
        self.macs = macs
        self.participants = 1
        if macs >= PARALLEL_MIN_MACS and self.items > 1:
            self.participants = max(1, min(host_pool.helper_count() + 1, self.items))

    def scratch(self) -> list[tuple[tuple[int, ...], str]]:
        """Per-participant temporaries, in the order the kernel reads them."""
        p, bq, bk, c = self.participants, self.bq, self.bk, self.cdt
        specs = [
            ((p, bq, bk), c),  # score block
            ((p, bq, self.dv), c),  # accumulator
            ((p, bq, self.dv), c),  # p @ v of one key block
            ((p, bq, self.d), c),  # scaled query block
            ((p, 5, bq), c),
        ]  # m, l, shift, alpha, row sum
        if self.causal:
            specs.append(((p, bq, bk), "bool"))
        if self.widen:
            specs += [((p, bk, self.d), c), ((p, bk, self.dv), c)]
        return specs


def attention_kernel(node, in_nodes, exp_rows=None) -> PreparedKernel:
    """The prepared kernel of an attention node on host (numpy) arrays.

    ``exp_rows(s, shift, rsum, nq, nk)``, when given (the numba backend's generated loop),
    replaces the subtract, exp and row-sum ufunc passes over each score block by one pass.
    """
    geo = _Geometry(node, in_nodes)
    specs = geo.scratch()
    n_in = len(in_nodes)
    # c - r for the causal test ``key > query`` inside a block: key k0 + c, query q0 + r
    diff = (np.arange(geo.bk)[None, :] - np.arange(geo.bq)[:, None]) if geo.causal else None
    lowest = np.finfo(geo.cdt).min

    def kernel(args, out):
        q, k, v = args[0], args[1], args[2]
        result = out
        if not geo.canonical:  # another memory layout: the same blocks through strided views
            q, k, v = attn_ir.canonical_views((q, k, v), geo.args)
            out = attn_ir.out_view(out, geo.args)
        mask = np.broadcast_to(args[3], (*geo.batch, geo.sq, geo.sk)) if geo.has_mask else None
        given = len(args) > n_in
        bufs = (
            list(args[n_in : n_in + len(specs)]) if given else [np.empty(s, dt) for s, dt in specs]
        )
        if geo.sq == 0 or geo.dv == 0 or geo.n_batch == 0:
            return result
        idx = list(np.ndindex(*geo.batch)) if geo.batch else [()]

        def work(item: int, part: int) -> None:
            # costliest first: the last query blocks see the most keys under a causal mask
            item = geo.items - 1 - item
            b, blk = divmod(item, geo.n_qblocks)
            if geo.causal:
                b, blk = item % geo.n_batch, item // geo.n_batch
            _block(
                geo,
                diff,
                lowest,
                idx[b],
                blk,
                q,
                k,
                v,
                mask,
                out,
                [buf[part] for buf in bufs],
                exp_rows,
            )

        if geo.participants > 1:
            with _blas_one_thread():
                host_pool.run_blocks(work, geo.items, geo.participants - 1)
        else:
            for item in range(geo.items):
                work(item, 0)
        return result

    info = (
        f"{'numba exp, ' if exp_rows is not None else ''}blocks {geo.bq}x{geo.bk}"
        f"{' causal' if geo.causal else ''}{' +mask' if geo.has_mask else ''}, "
        f"{geo.participants} thread(s)"
    )
    flops = 2 * geo.macs + 4 * geo.n_batch * geo.sq * geo.sk // (2 if geo.causal else 1)
    return PreparedKernel(kernel, flops=flops, scratch=tuple(specs), info=info, impl=exp_rows)


def _block(geo: _Geometry, diff, lowest, bidx, blk, q, k, v, mask, out, scr, exp_rows) -> None:
    """One query block of one batch index: the online-softmax loop over its key blocks."""
    s_buf, acc_buf, pv_buf, q_buf, rows = scr[:5]
    rest = scr[5:]
    cmp_buf = rest.pop(0) if geo.causal else None
    q0 = blk * geo.bq
    q1 = min(q0 + geo.bq, geo.sq)
    nq = q1 - q0
    qb = q_buf[:nq]
    np.copyto(qb, q[bidx][q0:q1], casting="unsafe")
    np.multiply(qb, geo.scale, out=qb)  # scale once per query block, in the compute dtype
    acc, pv = acc_buf[:nq], pv_buf[:nq]
    m, lsum, shift, alpha, rsum = (r[:nq] for r in rows)
    kk, vv = k[bidx], v[bidx]
    mm = mask[bidx] if mask is not None else None
    kend = min(geo.sk, q1) if geo.causal else geo.sk
    first = True
    for k0 in range(0, kend, geo.bk):
        k1 = min(k0 + geo.bk, kend)
        nk = k1 - k0
        kb, vb = kk[k0:k1], vv[k0:k1]
        if geo.widen:
            kb = _widened(rest[0][:nk], kb)
            vb = _widened(rest[1][:nk], vb)
        s = s_buf[:nq, :nk]
        np.matmul(qb, kb.T, out=s)
        if mm is not None:
            np.add(s, mm[q0:q1, k0:k1], out=s)
        if geo.causal and k1 - 1 > q0:  # the block crosses the diagonal: hide keys j > i
            hide = cmp_buf[:nq, :nk]
            np.greater(diff[:nq, :nk], q0 - k0, out=hide)
            np.copyto(s, -np.inf, where=hide)
        s.max(axis=1, out=shift)
        if not first:
            np.maximum(shift, m, out=shift)
        # a row that is all -inf so far shifts by the lowest finite value: exp gives 0, not NaN
        np.maximum(shift, lowest, out=shift)
        if exp_rows is not None:  # one pass: exponentials in place and their row sums
            exp_rows(s_buf, rows[2], rows[4], nq, nk)
        else:
            np.subtract(s, shift[:, None], out=s)
            np.exp(s, out=s)
            s.sum(axis=1, out=rsum)
        if first:
            lsum[...] = rsum
            np.matmul(s, vb, out=acc)
            first = False
        else:
            np.subtract(m, shift, out=alpha)
            np.exp(alpha, out=alpha)
            np.multiply(lsum, alpha, out=lsum)
            np.add(lsum, rsum, out=lsum)
            np.matmul(s, vb, out=pv)
            np.multiply(acc, alpha[:, None], out=acc)
            np.add(acc, pv, out=acc)
        m[...] = shift
    # lsum == 0 (every key hidden) gives 0/0 = NaN, as the softmax of an all -inf row
    with np.errstate(invalid="ignore", divide="ignore"):
        np.divide(acc, lsum[:, None], out=out[bidx][q0:q1], casting="unsafe")


def _widened(buf, x):
    np.copyto(buf, x, casting="unsafe")
    return buf
