"""Memory planning: liveness, slot sharing, in-place steps, and aliasing on random graphs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorlogic as tl
from tensorlogic.runtime import hooks
from tensorlogic.compiler.memory import ALIGNMENT, lifetimes, plan_memory, roots
from tensorlogic.compiler.schedule import Buffer


def _buf(i, nbytes, role="intermediate", view_of=None, shape=None, dtype="float32"):
    shape = shape or (nbytes // np.dtype(dtype).itemsize,)
    return Buffer(i, i, f"b{i}", shape, dtype, role, view_of)


def _overlap(a0, n0, a1, n1):
    return a0 < a1 + n1 and a1 < a0 + n0


# ---------------------------------------------------------------- planner unit tests
def test_chain_reuses_two_slots():
    # x -> t1 -> t2 -> t3 -> t4 -> y : each intermediate dies at the next step
    bufs = (
        [_buf(0, 4096, "input")] + [_buf(i, 4096) for i in range(1, 5)] + [_buf(5, 4096, "output")]
    )
    io = [((i,), i + 1) for i in range(5)]
    mp = plan_memory(bufs, io)
    assert mp.naive_bytes == 4 * 4096
    assert mp.peak_bytes == 2 * 4096
    assert mp.live_bytes == 2 * 4096
    assert set(mp.offsets) == {1, 2, 3, 4}
    assert all(o % ALIGNMENT == 0 for o in mp.offsets.values())
    assert mp.offsets[1] != mp.offsets[2] and mp.offsets[2] != mp.offsets[3]


def test_naive_layout_without_reuse():
    bufs = [_buf(0, 100, "input")] + [_buf(i, 100) for i in range(1, 4)] + [_buf(4, 100, "output")]
    io = [((i,), i + 1) for i in range(4)]
    mp = plan_memory(bufs, io, reuse=False)
    sizes = [128] * 3  # aligned to 64
    assert mp.peak_bytes == mp.naive_bytes == sum(sizes)
    assert sorted(mp.offsets.values()) == [0, 128, 256]
    assert not mp.inplace


def test_view_extends_life_of_its_base():
    # t1 = f(x); v = view(t1); t2 = g(x); t3 = h(t2); y = k(v, t3): t1 must outlive t2 and t3
    bufs = [
        _buf(0, 256, "input"),
        _buf(1, 256),
        _buf(2, 256, view_of=1),
        _buf(3, 256),
        _buf(4, 256),
        _buf(5, 256, "output"),
    ]
    io = [((0,), 1), ((1,), 2), ((0,), 3), ((3,), 4), ((2, 4), 5)]
    life = lifetimes(bufs, io)
    assert life[1] == (0, 4)
    assert roots(bufs)[2] == 1
    mp = plan_memory(bufs, io)
    for other in (3, 4):
        assert not _overlap(mp.offsets[1], 256, mp.offsets[other], 256)
    assert 2 not in mp.offsets  # a view owns no memory


def test_best_fit_places_small_buffer_in_hole():
    # a (1 KiB) lives 0..1, b (4 KiB) lives 1..3, c (1 KiB) lives 2..3: c reuses a's hole
    bufs = [
        _buf(0, 64, "input"),
        _buf(1, 1024),
        _buf(2, 4096),
        _buf(3, 1024),
        _buf(4, 64, "output"),
    ]
    io = [((0,), 1), ((1,), 2), ((2,), 3), ((2, 3), 4)]
    mp = plan_memory(bufs, io)
    assert mp.peak_bytes == 4096 + 1024
    assert mp.offsets[3] == mp.offsets[1]


def test_inplace_only_where_allowed():
    bufs = [
        _buf(0, 64, "input", shape=(16,)),
        _buf(1, 64, shape=(16,)),
        _buf(2, 64, shape=(16,)),
        _buf(3, 64, shape=(16,)),
        _buf(4, 64, "output", shape=(16,)),
    ]
    io = [((0,), 1), ((1,), 2), ((2, 1), 3), ((3,), 4)]
    ok = {0: (0,), 1: (0,), 2: (0, 1), 3: (0,)}
    mp = plan_memory(bufs, io, ok)
    assert 0 not in mp.inplace  # never over a graph input
    assert 1 not in mp.inplace  # buffer 1 is still read at step 2
    assert mp.inplace[2] in (1, 2)  # both die at step 2
    assert 3 not in mp.inplace  # outputs get their own arrays
    assert mp.offsets[3] == mp.offsets[mp.inplace[2]]
    # without the kernel's consent there is no in-place step
    assert not plan_memory(bufs, io, {}).inplace


def test_inplace_rejects_broadcast_dtype_and_views():
    bufs = [
        _buf(0, 64, "input", shape=(16,)),
        _buf(1, 16, shape=(4,)),  # smaller: broadcasts into the output
        _buf(2, 64, shape=(16,), dtype="float32"),
        _buf(3, 64, shape=(4, 4)),  # same bytes, other shape
        _buf(4, 128, shape=(16,), dtype="float64"),
        _buf(5, 64, shape=(16,)),
        _buf(6, 64, shape=(16,), view_of=5),
        _buf(7, 64, shape=(16,)),
        _buf(8, 64, "output", shape=(16,)),
    ]
    io = [
        ((0,), 1),
        ((0,), 2),
        ((0,), 3),
        ((0,), 4),  # producers
        ((0,), 5),
        ((5,), 6),
        ((1, 3, 4, 5, 6, 2), 7),  # 7 = f(broadcast, other shape, other dtype, base + its view, ok)
        ((7,), 8),
    ]
    mp = plan_memory(bufs, io, {6: (0, 1, 2, 3, 4, 5)})
    assert mp.inplace == {6: 2}


def test_print_shows_peak_and_naive(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (8, 16))
    h = x
    for _ in range(4):
        h = g.tanh(g.einsum("ij,jk->ik", h, g.constant(rng.standard_normal((16, 16)))) + 1.0)
    g.output(h, name="y")
    plan = tl.compile(g, backend="numpy", cache=False)
    text = str(plan)
    assert "planned peak" in text and "naive" in text
    assert plan.memory.peak_bytes < plan.memory.naive_bytes
    assert plan.memory.peak_bytes <= plan.memory.naive_bytes / 2


# ---------------------------------------------------------------- random graphs
class AliasChecker:
    """After every step, checks that buffers live at that step never share memory and that
    the step's value equals the one an unplanned run recorded."""

    def __init__(self, reference: list | None):
        self.reference = reference
        self.values: list = []
        self.checked_pairs = 0

    def step_hook(self, plan, env):
        self.plan, self.env = plan, env
        return self

    def done(self):
        pass

    def after_step(self, k):
        plan, env = self.plan, self.env
        mem = plan.memory
        root = roots(plan.buffers)
        life = mem.lifetimes
        o = plan.steps[k].output
        self.values.append(np.array(env[o], copy=True))
        if self.reference is not None:
            np.testing.assert_allclose(
                env[o], self.reference[k], rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=f"step {k}"
            )
        live = sorted(r for r, (a, z) in life.items() if a <= k <= z and env[r] is not None)
        allowed = {(mem.inplace[k], root[o])} if k in mem.inplace else set()
        for x in range(len(live)):
            for y in range(x + 1, len(live)):
                a, b = live[x], live[y]
                if (a, b) in allowed or (b, a) in allowed:
                    continue
                self.checked_pairs += 1
                assert not np.shares_memory(env[a], env[b]), (
                    f"step {k}: live buffers {plan.buffers[a].name} and "
                    f"{plan.buffers[b].name} share memory"
                )

    def compile_event(self, *a, **k):
        pass

    def counter(self, *a, **k):
        pass


@st.composite
def random_graphs(draw):
    """Small rank-2 graphs mixing every node kind the planner treats differently."""
    g = tl.EinsumGraph()
    dims = st.sampled_from([2, 3, 4])
    a, b = draw(dims), draw(dims)
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    xs = [g.input("x0", (a, b))]
    if draw(st.booleans()):
        xs.append(g.input("x1", (b, a)))
    nodes = list(xs)
    n_ops = draw(st.integers(2, 14))
    for _ in range(n_ops):
        kind = draw(
            st.sampled_from(
                [
                    "unary",
                    "binary",
                    "bias",
                    "scalar",
                    "einsum",
                    "einsum3",
                    "transpose",
                    "reshape",
                    "reduce",
                    "rowop",
                    "where",
                    "cast",
                ]
            )
        )
        t = draw(st.sampled_from(nodes))
        m, n = t.shape
        if kind == "unary":
            op = draw(st.sampled_from(["relu", "tanh", "sigmoid", "gelu", "neg", "square", "abs"]))
            new = g.unary(op, t)
        elif kind == "binary":
            same = [u for u in nodes if u.shape == t.shape or u.shape in ((1, n), (m, 1))]
            u = draw(st.sampled_from(same))
            op = draw(st.sampled_from(["add", "sub", "mul", "maximum"]))
            new = g.binary(op, t, u) if draw(st.booleans()) else g.binary(op, u, t)
        elif kind == "bias":
            new = t + g.constant(rng.standard_normal(n).astype(t.dtype))
        elif kind == "scalar":
            new = t * 0.5 if draw(st.booleans()) else 1.0 - t
        elif kind == "einsum":
            w = g.constant(rng.standard_normal((n, draw(dims))).astype(np.float32))
            spec = draw(st.sampled_from(["ij,jk->ik", "ij,jk->ki", "ij,jk->k", "ij,jk->ijk"]))
            new = g.einsum(spec, t, w)
            if len(new.shape) == 1:
                new = g.reshape(new, (1, -1))
            elif len(new.shape) == 3:
                new = g.reshape(new, (new.shape[0], -1))
        elif kind == "einsum3":
            c = draw(dims)
            w1 = g.constant(rng.standard_normal((n, c)).astype(np.float32))
            w2 = g.constant(rng.standard_normal((c, m)).astype(np.float32))
            new = g.einsum("ij,jk,kl->il", t, w1, w2)
        elif kind == "transpose":
            new = g.transpose(t)
        elif kind == "reshape":
            new = g.reshape(t, (n, m))
        elif kind == "reduce":
            op = draw(st.sampled_from(["sum", "max", "mean", "logsumexp"]))
            new = g.reduce(op, t, axis=draw(st.sampled_from([0, 1])), keepdims=True)
        elif kind == "rowop":
            new = (g.softmax if draw(st.booleans()) else g.log_softmax)(
                t, axis=draw(st.sampled_from([0, 1]))
            )
        elif kind == "where":
            new = g.where(g.binary("gt", t, 0.0), t, g.unary("neg", t))
        else:
            new = g.cast(g.cast(t, "float64") * 2.0, "float32")
        nodes.append(new)
    g.output(nodes[-1], name="out")
    extra = draw(st.lists(st.sampled_from(nodes[len(xs) :]), max_size=2))
    for k, t in enumerate(extra):
        g.output(t, name=f"extra{k}")
    inputs = {f"x{k}": rng.standard_normal(x.shape).astype(np.float32) for k, x in enumerate(xs)}
    return g, inputs


def _run_observed(plan, inputs, reference=None):
    obs = AliasChecker(reference)
    hooks.push(obs)
    try:
        out = plan(inputs)
    finally:
        hooks.pop(obs)
    return out, obs


@pytest.mark.parametrize("opt_level", [0, 2])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=random_graphs())
def test_random_graphs_never_alias_live_buffers(case, opt_level):
    g, inputs = case
    unplanned = tl.compile(
        g, backend="numpy", opt_level=opt_level, reuse_memory=False, pool=False, cache=False
    )
    planned = tl.compile(g, backend="numpy", opt_level=opt_level, cache=False)
    want, ref_obs = _run_observed(unplanned, inputs)
    assert planned.memory.peak_bytes <= unplanned.memory.peak_bytes
    for _ in range(2):  # the second call runs on a reused arena holding the first call's values
        got, obs = _run_observed(planned, inputs, ref_obs.values)
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, equal_nan=True)
    assert planned.concrete.pool.arenas_created == 1
