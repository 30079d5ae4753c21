"""Host plans hand out outputs in memory that earlier outputs let go of, never in memory a live
array still views (``runtime.outputs``)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.runtime import outputs
from tensorlogic.runtime.outputs import OutputBuffers


def _plan(backend: str, n: int = 256):
    g = tl.EinsumGraph()
    x = g.input("x", (n, n), "float32")
    w = g.constant(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32), name="w")
    g.output(g.einsum("ij,jk->ik", x, w), name="y")
    return tl.compile(g, backend=backend, opt_level=2, cache=False), np.asarray(g.constants[w.id])


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_loop_alternates_between_two_buffers_and_stays_correct(backend, rng):
    plan, w = _plan(backend)
    held, seen = None, []
    for _ in range(6):
        x = rng.standard_normal((256, 256)).astype(np.float32)
        y = plan(x=x)["y"]
        if held is not None:
            assert not np.shares_memory(y, held)  # the previous output is still held
        np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-3)
        seen.append(y.__array_interface__["data"][0])
        held = y
    assert len(set(seen)) == 2  # y = plan(x) in a loop reuses the two buffers


def test_memory_a_view_still_holds_is_never_handed_out(rng):
    plan, w = _plan("numba")
    x0 = rng.standard_normal((256, 256)).astype(np.float32)
    keep = plan(x=x0)["y"][3:7, ::2]  # a slice of the first output outlives the output itself
    want = (x0 @ w)[3:7, ::2]
    outs = []
    for _ in range(5):
        x = rng.standard_normal((256, 256)).astype(np.float32)
        y = plan(x=x)["y"]
        assert not np.shares_memory(y, keep)
        outs.append(y)  # every output kept too: each call new memory
    np.testing.assert_allclose(keep, want, rtol=1e-4, atol=1e-3)
    for i, a in enumerate(outs):
        for b in outs[i + 1 :]:
            assert not np.shares_memory(a, b)


def test_recycler_rules():
    buf = OutputBuffers(keep=2)
    small = buf.empty((4, 4), "float32")  # below MIN_BYTES: numpy's own allocation
    assert small.base is None or small.base.nbytes < outputs.MIN_BYTES
    shape = (outputs.MIN_BYTES // 4,)
    a = buf.empty(shape, "float32")
    b = buf.empty(shape, "float32")
    c = buf.empty(shape, "float32")  # both kept buffers are out: a third, not kept
    assert not any(np.shares_memory(p, q) for p, q in ((a, b), (a, c), (b, c)))
    address = a.__array_interface__["data"][0]
    del a
    d = buf.empty((shape[0] // 2, 2), "float32")  # same bytes, other shape: a's memory again
    assert d.__array_interface__["data"][0] == address and d.flags.c_contiguous
    view = d.T
    del d
    e = buf.empty(shape, "int32")  # d's memory is still viewed, b's is out: new memory
    assert not np.shares_memory(e, view) and not np.shares_memory(e, b)
    buf.clear()


def test_threads_calling_one_plan_get_their_own_outputs(rng):
    plan, w = _plan("numba")
    xs = [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(4)]
    results: dict[int, list] = {k: [] for k in range(4)}

    def work(k: int) -> None:
        for _ in range(5):
            results[k].append(plan(x=xs[k])["y"])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, ys in results.items():
        for y in ys:
            np.testing.assert_allclose(y, xs[k] @ w, rtol=1e-4, atol=1e-3)
    flat = [y for ys in results.values() for y in ys]
    for i, a in enumerate(flat):
        for b in flat[i + 1 :]:
            assert not np.shares_memory(a, b)
