"""The cupy backend on a GPU, against the numpy reference (run with ``pytest -m gpu``)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.ir.fused import FusedBody, FusedOp

pytestmark = pytest.mark.gpu

POSITIVE = {"log", "sqrt", "reciprocal", "pow", "div"}
TOL = {
    "float32": dict(rtol=2e-5, atol=2e-5),
    "float64": dict(rtol=1e-12, atol=1e-12),
    "float16": dict(rtol=2e-3, atol=2e-3),
}


def _data(rng, shape, dtype, positive=False):
    x = rng.uniform(0.5, 2.0, shape) if positive else rng.standard_normal(shape) * 2
    return x.astype(dtype)


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _both(g, inputs, **opts):
    ref = tl.compile(g, backend="numpy", opt_level=0)(**inputs)
    got = tl.compile(g, backend="cupy", opt_level=0, **opts)(**inputs)
    return ref, got


@pytest.mark.parametrize("codegen", ["ptx", "cuda"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", list(ops.ELEMENTWISE))
def test_every_elementwise_op(op, dtype, codegen, rng):
    arity = ops.ELEMENTWISE[op].arity
    g = tl.EinsumGraph()
    xs = [g.input(f"x{k}", (257, 33), dtype) for k in range(arity)]
    g.output(g.elementwise(op, *xs), "y")
    inputs = {f"x{k}": _data(rng, (257, 33), dtype, op in POSITIVE) for k in range(arity)}
    ref, got = _both(g, inputs, codegen=codegen, cuda_graph=False)
    np.testing.assert_allclose(_host(got["y"]), ref["y"], **TOL[dtype])


@pytest.mark.parametrize("codegen", ["ptx", "cuda"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("tail", ops.REDUCTIONS + ops.ROW_OPS)
@pytest.mark.parametrize(
    "shape,axis",
    [
        ((64, 1000), 1),
        ((300, 5, 7), 1),
        ((17, 300), 0),
        ((6, 10, 20), (0, 2)),
        ((5, 3000), None),
        ((50, 999), 1),
        ((96, 4096), 1),
        ((3, 70001), 1),
        ((1 << 20,), None),
    ],
)
def test_reductions_and_row_ops(tail, dtype, codegen, shape, axis, rng):
    if tail in ops.ROW_OPS and not isinstance(axis, int):
        pytest.skip("row ops take one axis")
    g = tl.EinsumGraph()
    x = g.input("x", shape, dtype)
    y = g.reduce(tail, x, axis) if tail in ops.REDUCTIONS else g._rowop(tail, x, axis, None)
    g.output(y, "y")
    data = rng.uniform(0.9, 1.1, shape) if tail == "prod" else rng.standard_normal(shape)
    ref, got = _both(g, {"x": data.astype(dtype)}, codegen=codegen, cuda_graph=False)
    n = np.prod(shape)
    tol = dict(rtol=TOL[dtype]["rtol"] * 10, atol=TOL[dtype]["atol"] * np.sqrt(n))
    np.testing.assert_allclose(_host(got["y"]), ref["y"], **tol)


def _fused_graph(dtype, space=(96, 513), tail=None, axes=()):
    g = tl.EinsumGraph()
    a = g.input("a", space, dtype)
    b = g.input("b", space[-1:], dtype)
    c = g.input("c", (space[0], 1), dtype)
    body = FusedBody(
        (
            FusedOp("mul", (("in", 0), ("in", 1))),
            FusedOp("add", (("tmp", 0), ("in", 2))),
            FusedOp("relu", (("tmp", 1),)),
            FusedOp("sub", (("tmp", 2), ("const", 0.25))),
            FusedOp("where", (("in", 1), ("tmp", 3), ("in", 2))),
        ),
        space,
        tail,
        axes,
    )
    if tail in ops.REDUCTIONS:
        shape = tuple(d for k, d in enumerate(space) if k not in axes)
    else:
        shape = space
    nid = g.add_node(
        ops.FUSED, None, [a.id, b.id, c.id], {"body": body.to_args()}, shape=shape, dtype=dtype
    )
    g.output(g.tensor(nid), "y")
    return g, body


def _fused_ref(body, inputs):
    vals = []
    for ins in body.instrs:
        args = [inputs[v] if k == "in" else vals[v] if k == "tmp" else v for k, v in ins.args]
        if ins.op == "where":
            vals.append(np.where(args[0] != 0, args[1], args[2]))
        else:
            out = np.empty(np.broadcast_shapes(*(np.shape(a) for a in args)), inputs[0].dtype)
            vals.append(ops.ELEMENTWISE[ins.op].numpy(*args, out=out))
    v = np.broadcast_to(vals[-1], body.space).copy()
    if body.tail is None:
        return v
    axes, kd = tuple(body.axes), body.keepdims
    if body.tail in ("softmax", "log_softmax", "logsumexp"):
        m = v.max(axis=axes, keepdims=True)
        shifted = v - m
        lse = np.log(np.exp(shifted).sum(axis=axes, keepdims=True))
        if body.tail == "softmax":
            return np.exp(shifted - lse)
        if body.tail == "log_softmax":
            return shifted - lse
        return (lse + m) if kd else (lse + m).squeeze(axes)
    return {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[
        body.tail
    ](v, axis=axes, keepdims=kd)


@pytest.mark.parametrize("codegen", ["ptx", "cuda"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "tail,axes",
    [
        (None, ()),
        ("sum", (1,)),
        ("max", (0,)),
        ("softmax", (1,)),
        ("log_softmax", (0,)),
        ("logsumexp", (1,)),
    ],
)
def test_fused_nodes_with_broadcast_operands(dtype, codegen, tail, axes, rng):
    g, body = _fused_graph(dtype, tail=tail, axes=axes)
    inputs = {
        "a": _data(rng, (96, 513), dtype),
        "b": _data(rng, (513,), dtype),
        "c": _data(rng, (96, 1), dtype),
    }
    ref = _fused_ref(body, [inputs["a"], inputs["b"], inputs["c"]])
    got = tl.compile(g, backend="cupy", opt_level=0, codegen=codegen, cuda_graph=False)(**inputs)
    np.testing.assert_allclose(
        _host(got["y"]), ref, rtol=TOL[dtype]["rtol"] * 10, atol=TOL[dtype]["atol"] * 30
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ptx_and_cuda_c_paths_agree(dtype, rng):
    g, _ = _fused_graph(dtype, tail="softmax", axes=(1,))
    inputs = {
        "a": _data(rng, (96, 513), dtype),
        "b": _data(rng, (513,), dtype),
        "c": _data(rng, (96, 1), dtype),
    }
    p = tl.compile(g, backend="cupy", codegen="ptx", cuda_graph=False)(**inputs, to_host=True)
    c = tl.compile(g, backend="cupy", codegen="cuda", cuda_graph=False)(**inputs, to_host=True)
    np.testing.assert_allclose(p["y"], c["y"], rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["atol"])


def test_float16_storage(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (64, 300), "float16")
    g.output(g.softmax(g.gelu(x)), "y")
    data = _data(rng, (64, 300), "float16")
    ref, got = _both(g, {"x": data}, cuda_graph=False)
    np.testing.assert_allclose(
        _host(got["y"]).astype(np.float32), ref["y"].astype(np.float32), rtol=1e-2, atol=1e-3
    )


def test_einsum_through_cublas_and_transposed_views(rng):
    g = tl.EinsumGraph()
    q = g.input("q", (2, 4, 64, 32))
    k = g.input("k", (2, 4, 64, 32))
    v = g.input("v", (2, 4, 64, 32))
    s = g.einsum("bhqd,bhkd->bhqk", q, k) * (1 / np.sqrt(32))
    o = g.einsum("bhqk,bhkd->bhqd", g.softmax(s), v)
    g.output(g.transpose(o, (0, 2, 1, 3)) + 1.0, "o")
    inputs = {n: _data(rng, (2, 4, 64, 32), "float32") for n in "qkv"}
    ref, got = _both(g, inputs)
    np.testing.assert_allclose(_host(got["o"]), ref["o"], rtol=1e-4, atol=1e-4)


def test_inputs_cupy_dlpack_and_outputs(rng):
    import cupy

    g = tl.EinsumGraph()
    x = g.input("x", (100, 7))
    g.output(g.exp(x) * 2.0, "y")
    plan = tl.compile(g, backend="cupy")
    data = _data(rng, (100, 7), "float32")

    class Foreign:  # a non-CuPy array that only speaks DLPack
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    expect = np.exp(data) * 2
    for given in (
        data,
        cupy.asarray(data),
        Foreign(cupy.asarray(data)),
        cupy.asfortranarray(cupy.asarray(data)),
    ):
        out = plan(x=given)["y"]
        assert isinstance(out, cupy.ndarray)
        np.testing.assert_allclose(out.get(), expect, rtol=1e-5)
    host = plan(x=data, to_host=True)["y"]
    assert isinstance(host, np.ndarray)
    with pytest.raises(tl.InputError):
        plan(x=[1, 2, 3])


def test_cuda_graph_replay_with_changing_inputs(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (16, 32))
    w = g.input("w", (1, 32))
    h = x
    for _ in range(10):
        h = g.tanh(h * 0.9 + w)
    g.output(g.softmax(h, 1), "y")
    g.output(g.sum(h, 1), "s")
    g.output(w, "w_out")  # an output that is an input comes back as a copy
    plan = tl.compile(g, backend="cupy", cuda_graph=True)
    ref = tl.compile(g, backend="numpy")
    for _ in range(5):
        inputs = {"x": _data(rng, (16, 32), "float32"), "w": _data(rng, (1, 32), "float32")}
        got, want = plan(**inputs, to_host=True), ref(**inputs)
        for name in ("y", "s", "w_out"):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
    runner = plan.concrete.runner
    # call 1 warms up, call 2 captures and replays, calls 3-5 replay
    assert runner.graph is not None and runner.replays == 4, str(runner)
    assert "cuda graph: on" in str(plan)
    # results of earlier calls are not overwritten by later replays
    ones = {"x": np.ones((16, 32), np.float32), "w": _data(rng, (1, 32), "float32")}
    first = plan(**ones)["y"]
    plan(x=_data(rng, (16, 32), "float32"), w=ones["w"])
    np.testing.assert_allclose(first.get(), ref(**ones)["y"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("codegen", ["ptx", "cuda"])
@pytest.mark.parametrize("tail", ["max", "min", "sum", "logsumexp", "softmax"])
@pytest.mark.parametrize(
    "shape,axis",
    [((64, 1000), 1), ((50, 999), 1), ((17, 300), 0), ((2, 100000), 1), ((3, 70001), 1)],
)
def test_nan_propagates_like_numpy(tail, shape, axis, codegen, rng):
    """A NaN in a reduced row gives NaN (numpy's max/min propagate it; PTX max/min drop it)."""
    data = rng.standard_normal(shape).astype(np.float32)
    nan_at = [tuple(rng.integers(0, d) for d in shape) for _ in range(3)]
    for idx in nan_at:
        data[idx] = np.nan
    g = tl.EinsumGraph()
    x = g.input("x", shape)
    g.output(
        g.reduce(tail, x, axis) if tail in ops.REDUCTIONS else g._rowop(tail, x, axis, None), "y"
    )
    ref = tl.compile(g, backend="numpy", opt_level=0)(x=data)["y"]
    got = _host(
        tl.compile(g, backend="cupy", opt_level=0, codegen=codegen, cuda_graph=False)(x=data)["y"]
    )
    assert np.isnan(ref).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-4, atol=1e-4 * np.sqrt(shape[axis]))


def test_contractions_are_captured_in_cuda_graphs(rng):
    """cuBLAS runs through its own handle on the capture stream: attention replays as a graph,
    and a three-operand chain's intermediate comes from the graph's own pool."""
    g = tl.EinsumGraph()
    q, k, v = (g.input(n, (2, 3, 64, 32)) for n in "qkv")
    s = g.einsum("bhqd,bhkd->bhqk", q, k)
    g.output(g.einsum("bhqk,bhkd->bhqd", g.softmax(s, -1), v), "o")
    a, b, c = g.input("a", (40, 50)), g.input("b", (50, 60)), g.input("c", (60, 30))
    g.output(g.einsum("ij,jk,kl->il", a, b, c), "abc")
    g.output(g.einsum("ji,jk->ik", a, a), "ata")  # a transposed operand: a cuBLAS flag
    g.output(g.einsum("ij,kj->ik", b, b), "bbt")
    plan = tl.compile(g, backend="cupy", opt_level=0, cuda_graph=True)
    ref = tl.compile(g, backend="numpy", opt_level=0)
    shapes = {
        "q": (2, 3, 64, 32),
        "k": (2, 3, 64, 32),
        "v": (2, 3, 64, 32),
        "a": (40, 50),
        "b": (50, 60),
        "c": (60, 30),
    }
    held = []
    for _ in range(4):
        inputs = {n: _data(rng, sh, "float32") for n, sh in shapes.items()}
        got = plan(**inputs)
        held.append((got, ref(**inputs)))
    assert plan.concrete.runner.graph is not None, str(plan.concrete.runner)
    assert "cuda graph: on" in str(plan)
    for got, want in held:  # earlier results are not overwritten by later replays
        for name in ("o", "abc", "ata", "bbt"):
            # float32 sums of terms up to ~1e3 (abc): round-off scales with the result's size
            atol = 1e-4 * max(1.0, float(np.abs(want[name]).max()))
            np.testing.assert_allclose(_host(got[name]), want[name], rtol=1e-4, atol=atol)


def test_threads_share_a_plan(rng):
    """Concurrent calls of one plan (launch parameter blocks are shared per kernel)."""
    from concurrent.futures import ThreadPoolExecutor

    g = tl.EinsumGraph()
    x, w = g.input("x", (64, 256)), g.input("w", (256, 128))
    g.output(g.softmax(g.einsum("ij,jk->ik", g.tanh(x), w)) * 2.0, "y")
    plan = tl.compile(g, backend="cupy", cuda_graph=False)
    ref = tl.compile(g, backend="numpy")
    inputs = [
        {"x": _data(rng, (64, 256), "float32"), "w": _data(rng, (256, 128), "float32")}
        for _ in range(8)
    ]

    def work(i):
        return [plan(**inputs[i], to_host=True)["y"] for _ in range(10)]

    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(work, range(8)))
    for i, results in enumerate(outs):
        want = ref(**inputs[i])["y"]
        for r in results:
            np.testing.assert_allclose(r, want, rtol=1e-4, atol=1e-5)


def test_plan_that_cannot_be_captured_falls_back_and_says_so(rng, monkeypatch):
    """A contraction on CuPy's own cuBLAS wrappers (which refuse stream capture) makes the
    capture fail: the plan runs with stream launches and says why."""
    import cupy

    monkeypatch.setattr(tl.get_backend("cupy"), "blas_xp", cupy)
    g = tl.EinsumGraph()
    x, w = g.input("x", (16, 32)), g.input("w", (32, 8))
    g.output(g.softmax(g.einsum("ij,jk->ik", g.tanh(x), w)), "y")
    plan = tl.compile(g, backend="cupy", cuda_graph=True, cache=False)
    ref = tl.compile(g, backend="numpy")
    for _ in range(3):
        inputs = {"x": _data(rng, (16, 32), "float32"), "w": _data(rng, (32, 8), "float32")}
        np.testing.assert_allclose(
            plan(**inputs, to_host=True)["y"], ref(**inputs)["y"], rtol=1e-4, atol=1e-5
        )
    assert plan.concrete.runner.graph is None
    assert "cuda graph: off (capture failed, stream launches" in str(plan)


def test_cuda_graph_off_and_auto_say_so():
    g = tl.EinsumGraph()
    x = g.input("x", (4096, 4096))
    g.output(g.relu(x), "y")
    assert "cuda graph: off (cuda_graph=False)" in str(
        tl.compile(g, backend="cupy", cuda_graph=False)
    )
    assert "cuda graph: off (auto" in str(tl.compile(g, backend="cupy"))
    with pytest.raises(tl.GraphError, match="codegen"):
        tl.compile(g, backend="cupy", codegen="llvm")


def test_out_of_memory_is_a_memory_budget_error_and_the_pool_stays_usable(rng):
    import cupy

    total = cupy.cuda.runtime.memGetInfo()[1]
    k = int(total // 4 // 8192) + 1024  # the outer product is bigger than the whole card
    g = tl.EinsumGraph()
    x, y = g.input("x", ("N",)), g.input("y", ("K",))
    g.output(g.sum(g.einsum("i,j->ij", x, y), 1), "s")
    plan = tl.compile(g, backend="cupy", cuda_graph=False)
    with pytest.raises(tl.MemoryBudgetError, match="free"):
        plan(x=np.ones(8192, np.float32), y=np.ones(k, np.float32))
    # the same plan still runs a binding that fits
    small = plan(x=np.ones(4, np.float32), y=np.ones(3, np.float32), to_host=True)["s"]
    np.testing.assert_allclose(small, np.full(4, 3.0))
    g2 = tl.EinsumGraph()
    x2 = g2.input("x", (10, 10))
    g2.output(g2.exp(x2), "y")
    data = _data(rng, (10, 10), "float32")
    np.testing.assert_allclose(
        tl.compile(g2, backend="cupy")(x=data, to_host=True)["y"], np.exp(data), rtol=1e-5
    )


def test_kernel_cache_across_processes(tmp_path):
    code = (
        "import numpy as np, tensorlogic as tl\n"
        "from tensorlogic.backends.cupy.cache import KernelCache\n"
        "g = tl.EinsumGraph(); x = g.input('x', (33, 77))\n"
        "g.output(g.log_softmax(g.sigmoid(x) * 3.0), 'y')\n"
        "be = tl.get_backend('cupy')\n"
        "p = tl.compile(g, backend='cupy', opt_level=0)\n"
        "p(x=np.ones((33, 77), np.float32))\n"
        "s = be.cache.stats; print('STATS', s.hits, s.misses)\n"
    )
    env = {**__import__("os").environ, "TL_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    h1, m1 = map(int, first.stdout.split("STATS")[1].split())
    h2, m2 = map(int, second.stdout.split("STATS")[1].split())
    assert m1 > 0 and h1 == 0
    assert m2 == 0 and h2 == m1


def test_profiler_event_hooks():
    be = tl.get_backend("cupy")
    import cupy

    a = be.event()
    cupy.ones(1 << 20).sum()
    b = be.event()
    assert 0 <= be.event_seconds(a, b) < 10


# ------------------------------------------------------------------ row-op epilogues
EPILOGUE_LAYOUTS = [
    ((64, 1000), 1),
    ((50, 999), 1),
    ((4, 50000), 1),
    ((300, 5, 7), 1),
    ((16384, 64), 1),
    ((8, 4096), 1),
    ((6, 16384), 1),
]


def _epilogue_graph(tail, space, axis, dtype, prologue):
    """A FUSED node: tail over tanh(x) (or x), then * gamma + residual - 0.125."""
    from cupy_cases import EPILOGUE, epilogue_shapes

    g = tl.EinsumGraph()
    shapes = epilogue_shapes(space, axis)
    ins = [g.input(n, s, dtype) for n, s in zip(("x", "gamma", "r"), shapes)]
    instrs = (FusedOp("tanh", (("in", 0),)),) if prologue else ()
    body = FusedBody(instrs, tuple(space), tail, (axis,), epilogue=EPILOGUE)
    nid = g.add_node(
        ops.FUSED,
        None,
        [t.id for t in ins],
        {"body": body.to_args()},
        shape=tuple(space),
        dtype=dtype,
    )
    g.output(g.tensor(nid), "y")
    return g, shapes


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("tail", ops.ROW_OPS)
@pytest.mark.parametrize("space,axis", EPILOGUE_LAYOUTS)
@pytest.mark.parametrize("prologue", [True, False])
def test_row_op_epilogues_ptx_cuda_c_and_numpy_agree(tail, space, axis, dtype, prologue, rng):
    from cupy_cases import epilogue_reference

    g, shapes = _epilogue_graph(tail, space, axis, dtype, prologue)
    inputs = {n: _data(rng, s, dtype) for n, s in zip(("x", "gamma", "r"), shapes)}
    ref = tl.compile(g, backend="numpy", opt_level=0)(**inputs)["y"]
    np.testing.assert_allclose(
        ref,
        epilogue_reference(tail, *inputs.values(), axis, prologue),
        rtol=TOL[dtype]["rtol"] * 10,
        atol=TOL[dtype]["atol"] * 30,
    )
    tol = dict(rtol=TOL[dtype]["rtol"] * 10, atol=TOL[dtype]["atol"] * 30)
    outs = {}
    for cg in ("ptx", "cuda"):
        plan = tl.compile(g, backend="cupy", opt_level=0, codegen=cg, cuda_graph=False)
        outs[cg] = plan(**inputs, to_host=True)["y"]
        np.testing.assert_allclose(outs[cg], ref, err_msg=cg, **tol)
    np.testing.assert_allclose(
        outs["ptx"], outs["cuda"], rtol=TOL[dtype]["rtol"] * 10, atol=TOL[dtype]["atol"] * 10
    )


@pytest.mark.parametrize("codegen", ["ptx", "cuda"])
def test_epilogue_operands_off_16_byte_alignment(codegen, rng):
    """Operands at an odd element offset: the scalar variant runs, with the same result."""
    import cupy

    g, shapes = _epilogue_graph("layer_norm", (64, 1024), 1, "float32", False)
    data = {n: _data(rng, s, "float32") for n, s in zip(("x", "gamma", "r"), shapes)}
    ref = tl.compile(g, backend="numpy", opt_level=0)(**data)["y"]
    plan = tl.compile(g, backend="cupy", opt_level=0, codegen=codegen, cuda_graph=False)
    for skew in ("gamma", "r"):
        ins = {n: cupy.asarray(v) for n, v in data.items()}
        raw = cupy.empty(ins[skew].size + 1, cupy.float32)
        raw[1:] = ins[skew].ravel()
        ins[skew] = raw[1:].reshape(ins[skew].shape)
        np.testing.assert_allclose(plan(**ins, to_host=True)["y"], ref, rtol=2e-4, atol=2e-4)


def test_layer_norm_affine_at_o2_is_one_kernel_and_replays(rng):
    import cupy

    g = tl.EinsumGraph()
    x = g.input("x", (512, 768))
    w, b = (rng.standard_normal(768).astype(np.float32) for _ in range(2))
    g.output(g.layer_norm(x, -1) * g.constant(w) + g.constant(b), "y")
    plan = tl.compile(g, backend="cupy", opt_level=2, cuda_graph=True)
    assert len(plan.steps) == 1
    for _ in range(3):  # warm-up, capture, replays with changing inputs
        data = rng.standard_normal((512, 768)).astype(np.float32)
        want = tl.compile(g, backend="numpy", opt_level=0)(x=data)["y"]
        np.testing.assert_allclose(
            plan(x=cupy.asarray(data), to_host=True)["y"], want, rtol=1e-4, atol=1e-4
        )


# ------------------------------------------------------------------ programmatic dependent launch
def _needs_sm90():
    import cupy

    if int(cupy.cuda.Device().compute_capability) < 90:
        pytest.skip("programmatic dependent launch needs compute capability 9.0")


def _mixed_graph():
    """Dependent tiny kernels, a cuBLAS contraction, a row op with an epilogue, reused buffers."""
    g = tl.EinsumGraph()
    x = g.input("x", (64, 64))
    w = g.input("w", (64, 64))
    h = x
    for k in range(12):
        h = g.tanh(h) if k % 3 == 0 else (h * 0.99 if k % 3 == 1 else h + 0.01)
    s = g.einsum("ij,jk->ik", h, w)
    y = g.softmax(s, -1) * x + h
    for k in range(6):
        y = g.sigmoid(y) if k % 2 else y - 0.125
    g.output(y, "y")
    g.output(g.sum(h, 1), "rows")
    return g


@pytest.mark.parametrize("codegen", ["ptx", "cuda"])
@pytest.mark.parametrize("opt_level", [0, 2])
def test_pdl_graph_replay_with_changing_inputs(codegen, opt_level, rng):
    import cupy

    _needs_sm90()
    g = _mixed_graph()
    plan = tl.compile(
        g, backend="cupy", opt_level=opt_level, codegen=codegen, cuda_graph=True, pdl=True
    )
    ref = tl.compile(g, backend="numpy", opt_level=0)
    for call in range(5):  # warm-up, capture, then replays
        data = {"x": _data(rng, (64, 64), "float32"), "w": _data(rng, (64, 64), "float32") / 8}
        want = ref(**data)
        got = plan(**{k: cupy.asarray(v) for k, v in data.items()}, to_host=True)
        for name in want:
            np.testing.assert_allclose(
                got[name], want[name], rtol=2e-4, atol=2e-4, err_msg=f"call {call} {name}"
            )
    runner = plan.concrete.runner
    assert runner.graph is not None and runner.replays >= 3
    assert "programmatic dependent launch" in str(plan)


def test_pdl_needs_hopper_and_a_bool():
    import cupy

    g = _mixed_graph()
    with pytest.raises(tl.TensorLogicError, match="pdl must be True or False"):
        tl.compile(g, backend="cupy", pdl="yes")
    if int(cupy.cuda.Device().compute_capability) < 90:
        with pytest.raises(tl.TensorLogicError, match="compute capability 9.0"):
            tl.compile(g, backend="cupy", pdl=True)


def test_direct_call_of_one_kernel_plans_and_its_fallbacks(rng):
    """Ready inputs of a one-kernel plan take the direct launch; every other input shape of
    call takes the general path with the same results and the same errors."""
    import cupy as cp

    g = tl.EinsumGraph()
    x = g.input("x", (33, 40), "float32")
    w = g.constant(rng.standard_normal(40).astype(np.float32))
    g.output(g.softmax(g.tanh(x) * w, axis=-1), "y")
    plan = tl.compile(g, backend="cupy", opt_level=2, cache=False)
    assert len(plan.steps) == 1 and plan._direct is not None
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    for _ in range(3):  # fresh data each call: nothing stale survives between calls
        xs = rng.standard_normal((33, 40)).astype(np.float32)
        want = ref(x=xs)["y"]
        np.testing.assert_allclose(_host(plan(x=cp.asarray(xs))["y"]), want, **TOL["float32"])
        np.testing.assert_allclose(_host(plan({"x": cp.asarray(xs)})["y"]), want, **TOL["float32"])
        np.testing.assert_allclose(plan(x=xs, to_host=True)["y"], want, **TOL["float32"])
        strided = cp.asarray(np.ascontiguousarray(xs.T)).T  # a transposed view: not contiguous
        np.testing.assert_allclose(_host(plan(x=strided)["y"]), want, **TOL["float32"])
        out = cp.empty((33, 40), cp.float32)
        assert plan(x=cp.asarray(xs), out={"y": out})["y"] is out
        np.testing.assert_allclose(_host(out), want, **TOL["float32"])
    with pytest.raises(tl.InputError):
        plan(x=cp.zeros((33, 40), cp.float64))
    with pytest.raises(tl.InputError):
        plan(x=cp.zeros((33, 40), cp.float32), z=cp.zeros(3, cp.float32))
    with pytest.raises(tl.InputError):
        plan(x=cp.zeros((40, 33), cp.float32))
    with tl.profile() as prof:
        plan(x=cp.asarray(xs))
    assert [e.name for e in prof.steps] == [plan.steps[0].name]

    # a split full reduction has a second kernel: no direct call, same results
    g2 = tl.EinsumGraph()
    g2.output(g2.sum(g2.input("v", (1 << 20,), "float32")), "s")
    p2 = tl.compile(g2, backend="cupy", opt_level=0, cache=False)
    v = rng.standard_normal(1 << 20).astype(np.float32)
    assert p2._direct is None
    np.testing.assert_allclose(
        float(p2(v=cp.asarray(v))["s"]), float(v.astype(np.float64).sum()), rtol=1e-4
    )
