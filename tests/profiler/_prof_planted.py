"""Planted backends and graphs for the profiler tests.

Each backend is a small variation of the numpy backend that reproduces one situation the
analyzer must recognize: fused kernels, contractions run as plain einsum loops, a device that
copies inputs, device-event timing, and a thread-pool stall after BLAS calls.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

import tensorlogic as tl
from tensorlogic.backends import base as backend_base
from tensorlogic.backends import kernels
from tensorlogic.backends.base import Capabilities, PreparedKernel
from tensorlogic.backends.numpy.backend import NumpyBackend
from tensorlogic.errors import BackendError
from tensorlogic.ir import ops
from tensorlogic.ir.fused import FusedBody, FusedOp


def _fused_kernel(node):
    body = FusedBody.from_args(node.args["body"])
    if body.tail is not None:
        raise BackendError("the test backend evaluates fused bodies without tails only")

    def kernel(args, out):
        vals = []
        for ins in body.instrs:
            ops_ = [args[v] if k == "in" else vals[v] if k == "tmp" else v for k, v in ins.args]
            if ins.op == "where":
                vals.append(np.where(ops_[0] != 0, ops_[1], ops_[2]))
            else:
                vals.append(ops.ELEMENTWISE[ins.op].numpy(*ops_, out=None))
        out[...] = vals[-1]
        return out

    return kernel


class FusedNumpy(NumpyBackend):
    """numpy plus fused nodes (evaluated instruction by instruction)."""

    name = "tltest_fused"

    def prepare(self, step, node, in_nodes, graph):
        if node.kind == ops.FUSED:
            return _fused_kernel(node)
        return super().prepare(step, node, in_nodes, graph)


class PlainEinsum(NumpyBackend):
    """Contractions as numpy's plain einsum loop (no BLAS)."""

    name = "tltest_plain_einsum"

    def prepare(self, step, node, in_nodes, graph):
        if node.kind == ops.EINSUM:
            spec = node.args["spec"]

            def plain(a, out):
                return np.einsum(spec, *a, out=out, optimize=False)

            # report the contraction's FLOPs as every backend's einsum kernel does
            return PreparedKernel(plain, flops=kernels.einsum_kernel(np, node, in_nodes).flops)
        return super().prepare(step, node, in_nodes, graph)


class Copying(NumpyBackend):
    """A 'device' whose inputs and outputs are copied in and out."""

    name = "tltest_copying"

    def __init__(self):
        self.syncs = 0

    def to_device(self, x):
        return np.array(x, copy=True)

    def to_host(self, x):
        return np.array(x, copy=True)

    def synchronize(self):
        self.syncs += 1


class _Event:
    __slots__ = ("t",)

    def __init__(self):
        self.t = time.perf_counter_ns()


class Events(NumpyBackend):
    """A 'device' timed with events, counting synchronizations."""

    name = "tltest_events"
    capabilities = Capabilities(events=True)

    def __init__(self):
        self.syncs = 0
        self.events = 0

    def event(self):
        self.events += 1
        return _Event()

    def event_seconds(self, start, end):
        return (end.t - start.t) * 1e-9

    def synchronize(self):
        self.syncs += 1

    def memory_in_use(self):
        return 4096


class Stalling(NumpyBackend):
    """Every non-contraction step that follows a contraction stalls 3 ms (as a numba parallel
    region does when OpenBLAS threads still spin)."""

    name = "tltest_stall"

    def prepare(self, step, node, in_nodes, graph):
        kernel = super().prepare(step, node, in_nodes, graph)
        after_blas = any(n.kind == ops.EINSUM for n in in_nodes)
        if node.kind == ops.EINSUM or not after_blas:
            return kernel

        def stalled(a, out):
            time.sleep(0.003)
            return kernel(a, out)

        return stalled


@contextlib.contextmanager
def registered(cls):
    """Register ``cls`` as a backend for the duration of a test, then remove it."""
    tl.register_backend(cls.name, cls, replace=True)
    try:
        yield backend_base.get_backend(cls.name)
    finally:
        with backend_base._lock:
            backend_base._factories.pop(cls.name, None)
            backend_base._instances.pop(cls.name, None)
        tl.clear_cache()


def chain_graph(n: int, length: int, dtype: str = "float32") -> tl.EinsumGraph:
    """x -> (x*1.5) + 0.25 -> relu -> ... : ``length`` elementwise steps on n elements."""
    g = tl.EinsumGraph()
    x = g.input("x", shape=(n,), dtype=dtype)
    y = x
    cycle = [lambda t: t * 1.5, lambda t: t + 0.25, lambda t: g.relu(t), lambda t: t - 0.125]
    for k in range(length):
        y = cycle[k % len(cycle)](y)
    g.output(y, name="y")
    return g


def fused_chain_graph(n: int, length: int) -> tl.EinsumGraph:
    """The chain of ``chain_graph`` as one FUSED node, the form the fusion pass produces."""
    g = tl.EinsumGraph()
    x = g.input("x", shape=(n,), dtype="float32")
    consts = [("mul", 1.5), ("add", 0.25), ("relu", None), ("sub", 0.125)]
    instrs = []
    prev = ("in", 0)
    for k in range(length):
        op, c = consts[k % len(consts)]
        instrs.append(FusedOp(op, (prev,) if c is None else (prev, ("const", c))))
        prev = ("tmp", k)
    body = FusedBody(tuple(instrs), (n,))
    nid = g.add_node(
        ops.FUSED,
        None,
        [x.id],
        {"body": body.to_args(), "flops": body.flops_per_element() * n},
        name="fused_chain",
        shape=(n,),
        dtype="float32",
    )
    g.output(g.tensor(nid), name="y")
    return g


def chain_reference(x: np.ndarray, length: int) -> np.ndarray:
    """numpy reference of ``chain_graph``."""
    y = x
    for k in range(length):
        y = [
            lambda t: t * np.float32(1.5),
            lambda t: t + np.float32(0.25),
            lambda t: np.maximum(t, 0),
            lambda t: t - np.float32(0.125),
        ][k % 4](y)
    return y
