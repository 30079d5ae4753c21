"""Parameters: their own node kind, held by the plan, updated in place without recompiling,
saved with the graph, and shipped to Dask workers with their current values."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import to_numpy

import tensorlogic as tl
from tensorlogic.ir import ops, serialize
from tensorlogic.testing.reference import evaluate


def _linear(rng, dtype=np.float32):
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 4), dtype)
    w = g.parameter("W", rng.standard_normal((4, 3)).astype(dtype))
    b = g.parameter("b", rng.standard_normal(3).astype(dtype))
    g.output(g.tanh(g.einsum("bi,ij->bj", x, w) + b), name="y")
    return g


def _ref(x, w, b):
    return np.tanh(x.astype(np.float64) @ w + b)


@pytest.mark.parametrize("opt_level", [0, 2])
def test_plan_reads_parameters_and_in_place_updates_need_no_recompile(backend, opt_level, rng):
    g = _linear(rng)
    plan = tl.compile(g, backend=backend, opt_level=opt_level, cache=False)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w0, b0 = g.parameter_value("W"), g.parameter_value("b")
    np.testing.assert_allclose(to_numpy(plan(x=x)["y"]), _ref(x, w0, b0), rtol=1e-5, atol=1e-5)
    concrete = plan.specialize(B=5)
    w1 = rng.standard_normal((4, 3)).astype(np.float32)
    plan.parameters["W"][...] = plan.backend.to_device(w1)  # in place, as optimizers write
    np.testing.assert_allclose(to_numpy(plan(x=x)["y"]), _ref(x, w1, b0), rtol=1e-5, atol=1e-5)
    b1 = rng.standard_normal(3).astype(np.float32)
    plan.set_parameters(b=b1)
    np.testing.assert_allclose(to_numpy(plan(x=x)["y"]), _ref(x, w1, b1), rtol=1e-5, atol=1e-5)
    assert plan.specialize(B=5) is concrete  # same kernels: nothing was recompiled
    # the graph keeps the values it was given
    np.testing.assert_array_equal(g.parameter_value("W"), w0)
    # a per-call override leaves the store alone
    np.testing.assert_allclose(
        to_numpy(plan(x=x, W=w0)["y"]), _ref(x, w0, b1), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_array_equal(to_numpy(plan.parameters["W"]), w1)


def test_parameters_are_never_folded_or_merged(rng):
    """Equal parameter values must stay two parameters, and a parameter next to constants is
    not folded: updating one changes only its own contribution."""
    g = tl.EinsumGraph()
    x = g.input("x", (6,))
    v = rng.standard_normal(6).astype(np.float32)
    a = g.parameter("a", v)
    b = g.parameter("b", v)
    c = g.constant(np.full(6, 2.0, np.float32))
    g.output(x * (a * c) + g.exp(b * c), name="y")
    plan = tl.compile(g, backend="numpy", opt_level=2, cache=False)
    kinds = [n.kind for n in plan.optimized_graph.nodes]
    assert ops.CONSTANT not in [
        plan.optimized_graph.node(i).kind for i in plan.optimized_graph.inputs.values()
    ]
    assert {"a", "b"} <= set(plan.optimized_graph.inputs) and kinds.count(ops.INPUT) == 3
    xv = rng.standard_normal(6).astype(np.float32)
    a1 = rng.standard_normal(6).astype(np.float32)
    plan.set_parameters(a=a1)
    want = xv * (a1 * 2.0) + np.exp(v * 2.0)
    np.testing.assert_allclose(plan(x=xv)["y"], want, rtol=1e-5)


def test_compiles_of_one_graph_share_kernels_not_parameters(rng):
    g = _linear(rng)
    p1 = tl.compile(g, backend="numpy")
    p2 = tl.compile(g, backend="numpy")
    assert p1 is not p2 and p1.specialize(B=2) is p2.specialize(B=2)
    p1.parameters["b"][...] = 100.0
    x = rng.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(
        p2(x=x)["y"], _ref(x, g.parameter_value("W"), g.parameter_value("b")), rtol=1e-5, atol=1e-5
    )
    # another graph of the same structure and other values: the same kernels, its own values
    g2 = tl.EinsumGraph()
    x2 = g2.input("x", ("B", 4))
    w2 = rng.standard_normal((4, 3)).astype(np.float32)
    b2 = rng.standard_normal(3).astype(np.float32)
    g2.output(
        g2.tanh(g2.einsum("bi,ij->bj", x2, g2.parameter("W", w2)) + g2.parameter("b", b2)), name="y"
    )
    p3 = tl.compile(g2, backend="numpy")
    np.testing.assert_allclose(p3(x=x)["y"], _ref(x, w2, b2), rtol=1e-5, atol=1e-5)


def test_set_parameters_checks_everything_before_writing(rng):
    g = _linear(rng)
    plan = tl.compile(g, backend="numpy", cache=False)
    before = {k: np.array(v) for k, v in plan.parameters.items()}
    good = np.ones(3, np.float32)
    with pytest.raises(tl.InputError, match="unknown parameter 'w'.*'W', 'b'"):
        plan.set_parameters(b=good, w=np.ones((4, 3), np.float32))
    with pytest.raises(tl.ShapeError, match=r"parameter 'W'.*\(3, 4\).*\(4, 3\)"):
        plan.set_parameters(b=good, W=np.ones((3, 4), np.float32))
    with pytest.raises(tl.DTypeError, match="parameter 'W'.*float64.*float32"):
        plan.set_parameters({"b": good, "W": np.ones((4, 3))})
    with pytest.raises(tl.InputError, match="parameter 'b'.*got list"):
        plan.set_parameters(b=[1.0, 2.0, 3.0])
    with pytest.raises(tl.InputError, match="dict"):
        plan.set_parameters([("b", good)])
    for k, v in plan.parameters.items():
        np.testing.assert_array_equal(v, before[k])  # nothing was half-changed
    with pytest.raises(tl.ShapeError, match="parameter 'W'"):
        plan(x=np.ones((2, 4), np.float32), W=np.ones((4, 4), np.float32))
    with pytest.raises(tl.InputError, match="unknown input"):
        plan(x=np.ones((2, 4), np.float32), V=np.ones((4, 4), np.float32))


def test_parameter_builder_errors():
    g = tl.EinsumGraph()
    g.input("x", (3,))
    with pytest.raises(tl.GraphError, match="identifier"):
        g.parameter("not a name", np.ones(3))
    with pytest.raises(tl.GraphError, match="'x' already exists"):
        g.parameter("x", np.ones(3))
    with pytest.raises(tl.DTypeError, match="parameter 'k'.*int64.*floating"):
        g.parameter("k", np.arange(3))
    with pytest.raises(tl.DTypeError, match="parameter 's'.*cannot store"):
        g.parameter("s", np.array(["a"]), dtype="float32")
    with pytest.raises(tl.GraphError, match="add_node cannot make a parameter"):
        g.add_node(ops.PARAMETER, None, [])
    with pytest.raises(tl.GraphError, match="no parameter named 'q'"):
        g.parameter_value("q")
    assert not g.parameters and len(g) == 1
    p = g.parameter("p", [1.0, 2.0], dtype="float32")
    assert p.dtype == "float32" and not g.parameter_value("p").flags.writeable


def test_failed_build_removes_a_parameter_it_made(rng):
    g = tl.EinsumGraph()
    w = g.parameter("w", rng.standard_normal((3, 3)))
    with pytest.raises(tl.ShapeError):
        g.einsum("ij,jk->ik", w, rng.standard_normal((4, 2)))
    assert list(g.parameters) == ["w"] and len(g) == 1


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_save_load_and_dumps_keep_parameters(tmp_path, rng, dtype):
    g = tl.EinsumGraph()
    x = g.input("x", (2, 3), dtype)
    w = g.parameter("w", rng.standard_normal((3, 3)).astype(dtype))
    g.output(g.einsum("ij,jk->ik", x, w), name="y")
    g.save(tmp_path / "m.json")
    for back in (tl.EinsumGraph.load(tmp_path / "m.json"), serialize.loads(serialize.dumps(g))):
        assert list(back.parameters) == ["w"] and back.node("w").kind == ops.PARAMETER
        got = back.parameter_value("w")
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, g.parameter_value("w"))


def test_trained_values_are_saved_with_graph_with_parameters(tmp_path, rng):
    g = _linear(rng)
    plan = tl.compile(g, backend="numpy", cache=False)
    w1 = rng.standard_normal((4, 3)).astype(np.float32)
    plan.set_parameters(W=w1)
    plan.graph_with_parameters().save(tmp_path / "trained.json")
    back = tl.EinsumGraph.load(tmp_path / "trained.json")
    np.testing.assert_array_equal(back.parameter_value("W"), w1)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(tl.compile(back, backend="numpy")(x=x)["y"], plan(x=x)["y"])


def test_bad_parameter_records_are_refused(tmp_path, rng):
    g = _linear(rng)
    doc, arrays = serialize.to_dict(g)
    wid = g.parameters["W"]
    bad = {k: v for k, v in arrays.items() if k != f"c{wid}"}
    with pytest.raises(tl.SerializationError, match="parameter 'W' has no array"):
        serialize.from_dict(doc, bad)
    ints = dict(arrays)
    ints[f"c{wid}"] = np.zeros((4, 3), np.int32)
    rec = next(r for r in doc["nodes"] if r["id"] == wid)
    rec["dtype"] = "int32"
    with pytest.raises(tl.SerializationError, match="parameter 'W'.*floating"):
        serialize.from_dict(doc, ints)
    rec["dtype"] = "float32"
    rec["inputs"] = [0]
    with pytest.raises(tl.SerializationError, match="parameter node takes no inputs"):
        serialize.from_dict(doc, arrays)


def test_reference_interpreter_reads_parameters(rng):
    g = _linear(rng, np.float64)
    x = rng.standard_normal((2, 4))
    got = evaluate(g, {"x": x})["y"]
    np.testing.assert_allclose(got, _ref(x, g.parameter_value("W"), g.parameter_value("b")))


def test_dask_workers_run_the_current_parameters(rng):
    """A process cluster: the plan reaches the workers as data with the values it holds when
    the run starts, and again with new values after an update."""
    distributed = pytest.importorskip("distributed")
    g = _linear(rng)
    plan = tl.compile(g, backend="numpy", cache=False)
    x = rng.standard_normal((40, 4)).astype(np.float32)
    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        plan.set_parameters(W=rng.standard_normal((4, 3)).astype(np.float32))
        got = tl.run_batched(plan, {"x": x}, 16, client=client, progress=False)
        np.testing.assert_allclose(got["y"], plan(x=x)["y"], rtol=1e-6)
        plan.parameters["b"][...] += 1.0
        got = tl.run_batched(plan, {"x": x}, 16, client=client, progress=False)
        np.testing.assert_allclose(got["y"], plan(x=x)["y"], rtol=1e-6)


def test_grad_takes_parameter_names(rng):
    """tl.grad differentiates with respect to parameters; checked by central differences."""
    g = tl.EinsumGraph()
    x = g.input("x", (3, 4), "float64")
    w = g.parameter("w", rng.standard_normal((4, 2)))
    g.output(g.sum(g.tanh(g.einsum("ij,jk->ik", x, w)) ** 2), name="loss")
    tg = tl.grad(g, of="loss", wrt=["w"])
    assert "grad_w" in tg.outputs and list(tg.parameters) == ["w"]
    plan = tl.compile(tg, backend="numpy", cache=False)
    xv = rng.standard_normal((3, 4))
    got = plan(x=xv)["grad_w"]
    w0 = g.parameter_value("w")
    num = np.zeros_like(w0)
    for idx in np.ndindex(*w0.shape):
        d = np.zeros_like(w0)
        d[idx] = 1e-6
        num[idx] = (plan(x=xv, w=w0 + d)["loss"] - plan(x=xv, w=w0 - d)["loss"]) / 2e-6
    np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-8)


def test_constants_as_parameters(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (2, 3))
    w = g.constant(rng.standard_normal((3, 3)).astype(np.float32), name="w")
    k = g.constant(np.arange(3), name="k")
    g.output(g.einsum("ij,jk->ik", x, w), name="y")
    p = g.constants_as_parameters(["w"])
    assert list(p.parameters) == ["w"] and p.node("w").kind == ops.PARAMETER
    assert not g.parameters and g.node("w").kind == ops.CONSTANT  # the original is unchanged
    np.testing.assert_array_equal(p.parameter_value("w"), g.constants[w.id])
    with pytest.raises(tl.GraphError, match="'x' is not a constant.*input"):
        g.constants_as_parameters(["x"])
    with pytest.raises(tl.DTypeError, match="'k' has dtype int64"):
        g.constants_as_parameters(["k"])
    with pytest.raises(tl.GraphError, match="no node named 'nope'"):
        g.constants_as_parameters(["nope"])
    assert k.name == "k"


def test_testing_harness_checks_graphs_with_parameters(rng):
    from tensorlogic.testing import assert_backends_agree, assert_grads_agree

    g = tl.EinsumGraph()
    x = g.input("x", (3, 4))
    w = g.parameter("w", rng.standard_normal((4, 2)).astype(np.float32))
    y = g.tanh(g.einsum("ij,jk->ik", x, w))
    g.output(g.sum(y * y), name="loss")
    assert_backends_agree(g, opt_levels=(0, 2))
    assert_grads_agree(g, of="loss", wrt=["w"], opt_levels=(0, 2))
