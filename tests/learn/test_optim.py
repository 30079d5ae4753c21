"""tl.optim: SGD and Adam against float64 numpy references of PyTorch's update formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import to_numpy

import tensorlogic as tl
from tensorlogic.optim.kernels import Program, UpdateKernel


def _plan(backend, rng, dtype):
    g = tl.EinsumGraph()
    x = g.input("x", (2, 3), dtype)
    w = g.parameter("w", rng.standard_normal((3, 5)).astype(dtype))
    b = g.parameter("b", rng.standard_normal(5).astype(dtype))
    g.output(g.einsum("ij,jk->ik", x, w) + b, name="y")
    return tl.compile(g, backend=backend, cache=False)


# ---------------------------------------------------------------- references (torch's formulas)
def sgd_ref(p, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    p, buf = p.astype(np.float64), None
    for g in grads:
        d = g.astype(np.float64)
        if weight_decay:
            d = d + weight_decay * p
        if momentum:
            buf = d.copy() if buf is None else momentum * buf + (1 - dampening) * d
            d = d + momentum * buf if nesterov else buf
        p = p - lr * d
    return p


def adam_ref(p, grads, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
    p = p.astype(np.float64)
    m, v = np.zeros_like(p), np.zeros_like(p)
    b1, b2 = betas
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64)
        if decoupled:
            p = p * (1 - lr * weight_decay)
        elif weight_decay:
            g = g + weight_decay * p
        m = m + (1 - b1) * (g - m)
        v = b2 * v + (1 - b2) * g * g
        step = lr / (1 - b1**t)
        denom = np.sqrt(v) / math.sqrt(1 - b2**t) + eps
        p = p - step * m / denom
    return p


CASES = [
    ("sgd", dict(lr=0.1), {}),
    ("sgd", dict(lr=0.05, weight_decay=0.1), {}),
    ("sgd", dict(lr=0.05, momentum=0.9), {}),
    ("sgd", dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01), {}),
    ("sgd", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.02), {}),
    ("adam", dict(lr=0.01), {}),
    ("adam", dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), {}),
    ("adam", dict(lr=0.02, weight_decay=0.1, decoupled=True), {}),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind,kw,_", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_updates_match_the_reference(backend, dtype, kind, kw, _, rng):
    plan = _plan(backend, rng, dtype)
    p0 = {k: to_numpy(v).copy() for k, v in plan.parameters.items()}
    ids = {k: id(v) for k, v in plan.parameters.items()}
    opt = tl.optim.SGD(**kw) if kind == "sgd" else tl.optim.Adam(**kw)
    grads = {
        k: [rng.standard_normal(v.shape).astype(dtype) for _ in range(5)] for k, v in p0.items()
    }
    for t in range(5):
        opt.step(plan, {f"grad_{k}": plan.backend.to_device(g[t]) for k, g in grads.items()})
    ref = sgd_ref if kind == "sgd" else adam_ref
    tol = 2e-6 if dtype == "float32" else 1e-12
    for k in p0:
        want = ref(p0[k], grads[k], **kw)
        np.testing.assert_allclose(to_numpy(plan.parameters[k]), want, rtol=tol, atol=tol)
        assert id(plan.parameters[k]) == ids[k]  # written in place
    assert opt.steps == 5


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kw", [c[1] for c in CASES if c[0] == "adam"])
def test_adam_on_large_and_strided_parameters(backend, dtype, kw, rng):
    """Parameters over the one-pass kernels' parallel size and not a multiple of their block,
    and gradients that are not contiguous (the three-kernel path), match the reference."""
    g = tl.EinsumGraph()
    x = g.input("x", (2, 301), dtype)
    w = g.parameter("w", rng.standard_normal((301, 257)).astype(dtype))
    g.output(g.einsum("ij,jk->ik", x, w), name="y")
    plan = tl.compile(g, backend=backend, cache=False)
    p0 = to_numpy(plan.parameters["w"]).copy()
    opt = tl.optim.Adam(**kw)
    grads = [rng.standard_normal((257, 301)).astype(dtype).T for _ in range(3)]
    for t, gr in enumerate(grads):
        # the first two contiguous, the last a transposed view
        gr = np.ascontiguousarray(gr) if t < 2 else gr
        opt.step(plan, {"w": plan.backend.to_device(gr)})
    # float32: among 77k elements a few have g + weight_decay * p cancel (or a tiny second
    # moment), where the float32 update differs from the float64 reference by up to ~0.1% of
    # the update's size (lr per step), as it does with the three-kernel update
    atol = 3 * kw["lr"] * 2e-3 if dtype == "float32" else 1e-12
    want = adam_ref(p0, grads, **kw)
    np.testing.assert_allclose(
        to_numpy(plan.parameters["w"]), want, rtol=2e-6 if dtype == "float32" else 1e-12, atol=atol
    )


def test_learning_rate_changes_between_steps_without_new_kernels(rng):
    plan = _plan("numpy", rng, "float64")
    p0 = np.array(plan.parameters["w"])
    opt = tl.optim.SGD(lr=0.1, momentum=0.5)
    g1, g2 = rng.standard_normal((2, 3, 5))
    opt.step(plan, {"w": g1})
    opt.lr = 0.01
    opt.step(plan, {"w": g2})
    buf = 0.5 * g1 + g2
    want = p0 - 0.1 * g1 - 0.01 * buf
    np.testing.assert_allclose(plan.parameters["w"], want, rtol=1e-12)
    np.testing.assert_array_equal(plan.parameters["b"], plan.graph.parameter_value("b"))


@pytest.mark.parametrize(
    "make",
    [lambda: tl.optim.Adam(lr=0.01, weight_decay=0.1), lambda: tl.optim.SGD(lr=0.1, momentum=0.9)],
)
def test_state_dict_resumes_exactly(make, rng):
    grads = [
        {
            "w": rng.standard_normal((3, 5)).astype(np.float32),
            "b": rng.standard_normal(5).astype(np.float32),
        }
        for _ in range(6)
    ]
    a = _plan("numpy", rng, "float32")
    b = tl.compile(a.graph, backend="numpy", cache=False)
    opt_a = make()
    for g in grads:
        opt_a.step(a, g)
    opt_b = make()
    for g in grads[:3]:
        opt_b.step(b, g)
    state, params = opt_b.state_dict(), {k: np.array(v) for k, v in b.parameters.items()}
    c = tl.compile(a.graph, backend="numpy", cache=False)
    c.set_parameters(params)
    opt_c = make()
    opt_c.load_state_dict(state, c)
    for g in grads[3:]:
        opt_c.step(c, g)
    for k in a.parameters:
        np.testing.assert_array_equal(c.parameters[k], a.parameters[k])


def test_bad_optimizer_input(rng):
    plan = _plan("numpy", rng, "float32")
    for make, match in [
        (lambda: tl.optim.SGD(lr=0), "lr must be"),
        (lambda: tl.optim.SGD(lr=0.1, momentum=-1), "momentum"),
        (lambda: tl.optim.SGD(lr=0.1, nesterov=True), "nesterov"),
        (lambda: tl.optim.Adam(betas=(0.9, 1.0)), r"betas\[1\]"),
        (lambda: tl.optim.Adam(betas=0.9), "pair"),
        (lambda: tl.optim.Adam(lr="big"), "lr must be"),
    ]:
        with pytest.raises(tl.InputError, match=match):
            make()
    opt = tl.optim.Adam()
    w = np.array(plan.parameters["w"])
    with pytest.raises(tl.ShapeError, match="gradient of parameter 'w'.*expected"):
        opt.step(plan, {"b": np.ones(5, np.float32), "w": np.ones((5, 3), np.float32)})
    with pytest.raises(tl.DTypeError, match="gradient of parameter 'w'.*float64"):
        opt.step(plan, {"grad_w": np.ones((3, 5))})
    with pytest.raises(tl.InputError, match="no gradient for any parameter"):
        opt.step(plan, {"loss": np.ones(())})
    with pytest.raises(tl.InputError, match="CompiledPlan"):
        opt.step(plan.graph, {"w": w})
    np.testing.assert_array_equal(plan.parameters["w"], w)  # nothing changed
    assert opt.steps == 0 and not opt.state
    with pytest.raises(tl.InputError, match="state of a Adam, got SGD"):
        opt.load_state_dict(tl.optim.SGD(lr=1).state_dict(), plan)
    bad = {"type": "Adam", "steps": 1, "tensors": {"exp_avg/w": np.ones((2, 2), np.float32)}}
    with pytest.raises(tl.ShapeError, match="exp_avg/w"):
        opt.load_state_dict(bad, plan)


def test_update_kernel_is_one_fused_step_written_in_place(backend, rng):
    pr = Program()
    pr.op("add", pr.input(0), pr.op("mul", pr.input(1), pr.input(2)))
    be = tl.get_backend(backend)
    k = UpdateKernel(pr, (4, 7), "float32", 3, (2,), be)
    x = rng.standard_normal((4, 7)).astype(np.float32)
    y = rng.standard_normal((4, 7)).astype(np.float32)
    want = x + y * np.float32(0.5)
    xd = be.to_device(x)
    k.run(xd, be.to_device(y), be.to_device(np.asarray(0.5, np.float32)))
    np.testing.assert_allclose(to_numpy(xd), want, rtol=1e-6)
    if backend == "numpy":
        assert k.in_place
