"""The backend contract: a backend built only from ``Backend``'s documented members runs
everything (every node kind, every opt level, the profiler, out=, threads), and the registry
refuses what breaks the contract."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorlogic as tl
from tensorlogic.backends import Backend, Capabilities, PreparedKernel, unregister_backend
from tensorlogic.errors import InputError
from tensorlogic.ir.evaluate import evaluate_node
from tensorlogic.testing import assert_backends_agree, graph_cases


class MinimalBackend(Backend):
    """Only the required members of the contract; each kernel evaluates its node with numpy."""

    name = "minimal_contract"
    # floats and bool: comparisons give bool (the random graphs use them as masks); its
    # kernels evaluate with numpy, so it runs them
    capabilities = Capabilities(
        options=frozenset({"fast_math"}), dtypes=Capabilities.dtypes | {"bool"}
    )

    def __init__(self) -> None:
        self.prepared = 0

    def prepare(self, step, node, in_nodes, graph):
        self.prepared += 1
        n = len(in_nodes)

        def kernel(inputs, out):
            r = evaluate_node(node, inputs[:n])
            if out is None:  # a view step: no buffer of its own
                return r
            out[...] = r
            return out

        return PreparedKernel(kernel, info="minimal")

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def alloc_bytes(self, n):
        return np.empty(max(int(n), 1), np.uint8)

    def view_bytes(self, raw, shape, dtype):
        return raw[: math.prod(shape) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)

    def copy(self, x, out=None):
        if out is None:
            return np.array(x, copy=True)
        out[...] = x
        return out

    def is_array(self, x):
        return isinstance(x, np.ndarray)

    def check_input(self, x, name):
        if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
            raise InputError(f"input {name!r}: expected a float numpy array")
        return x


@pytest.fixture
def minimal():
    tl.register_backend(MinimalBackend.name, MinimalBackend, replace=True)
    yield MinimalBackend.name
    unregister_backend(MinimalBackend.name)


def _mlp():
    g = tl.EinsumGraph()
    x = g.input("x", (5, 6))
    w = g.constant(np.linspace(-1, 1, 24, dtype=np.float32).reshape(6, 4), name="w")
    h = g.relu(g.einsum("bi,ij->bj", x, w) * 2.0 + 1.0)
    g.output(g.softmax(h, axis=1), name="y")
    g.output(g.sum(h, axis=0), name="s")
    return g


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=graph_cases(max_ops=6), seed=st.integers(0, 2**32 - 1))
def test_conformance_on_random_graphs(case, seed):
    # hypothesis cannot use function-scoped fixtures: register around each example
    tl.register_backend(MinimalBackend.name, MinimalBackend, replace=True)
    try:
        assert_backends_agree(
            case.graph,
            backends=(MinimalBackend.name,),
            opt_levels=(0, 1, 2),
            ranges=case.ranges,
            sizes=case.sizes,
            seed=seed,
        )
    finally:
        unregister_backend(MinimalBackend.name)


def test_plan_features_on_the_minimal_backend(minimal, rng):
    g = _mlp()
    plan = tl.compile(g, backend=minimal, cache=False)
    ref = tl.compile(g, backend="numpy", cache=False)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    want = ref(x=x)
    for k, v in plan(x=x).items():
        np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-6)
    assert plan.backend.prepared == len(plan.steps)
    assert "minimal" in str(plan)
    # out= and check_finite
    buf = np.empty((5, 4), np.float32)
    assert plan(x=x, out={"y": buf})["y"] is buf
    with pytest.raises(tl.InputError, match="NaN"):
        plan(x=np.full((5, 6), np.nan, np.float32), check_finite=True)
    # several threads on one plan
    errors = []

    def worker():
        try:
            for _ in range(10):
                np.testing.assert_allclose(plan(x=x)["y"], want["y"], rtol=1e-5, atol=1e-6)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    # the profiler times its steps on the host clock (no events declared)
    with tl.profile() as prof:
        plan(x=x)
    assert len(prof.steps) == len(plan.steps)


def test_declared_options_are_taken_and_others_ignored(minimal):
    plan = tl.compile(_mlp(), backend=minimal, fast_math=False, codegen="cuda", cache=False)
    assert plan.options["fast_math"] is False
    assert plan.options.ignored == ("codegen",)


def test_unregister_backend(minimal):
    plan = tl.compile(_mlp(), backend=minimal)
    unregister_backend(minimal)
    assert minimal not in tl.backends.registered_backends()
    with pytest.raises(tl.BackendError, match="unknown backend"):
        tl.compile(_mlp(), backend=minimal)
    with pytest.raises(tl.BackendError, match="no backend named"):
        unregister_backend(minimal)
    # registered again: a new instance, so the cached plan of the old one is not handed out
    tl.register_backend(minimal, MinimalBackend)
    again = tl.compile(_mlp(), backend=minimal)
    assert again is not plan and again.backend is not plan.backend
    assert plan(x=np.ones((5, 6), np.float32))["y"].shape == (5, 4)  # the old plan still runs


def test_factory_must_return_a_backend():
    class NotABackend:
        name = "not_a_backend"

    tl.register_backend("not_a_backend", NotABackend)
    try:
        with pytest.raises(tl.BackendError, match="must return a tensorlogic.backends.Backend"):
            tl.compile(_mlp(), backend="not_a_backend")
    finally:
        unregister_backend("not_a_backend")


@pytest.mark.parametrize(
    "result,match",
    [
        (42, "expected a PreparedKernel"),
        ("closure-with-attrs", "as attributes"),
    ],
)
def test_prepare_must_return_a_kernel(result, match):
    class Bad(MinimalBackend):
        name = "bad_prepare"

        def prepare(self, step, node, in_nodes, graph):
            if result == "closure-with-attrs":

                def k(inputs, out):
                    return out

                k.scratch = [((2,), "float32")]
                return k
            return result

    tl.register_backend("bad_prepare", Bad)
    try:
        with pytest.raises(tl.BackendError, match=match):
            tl.compile(_mlp(), backend="bad_prepare", cache=False)
    finally:
        unregister_backend("bad_prepare")


def test_a_plain_callable_kernel_is_wrapped(rng):
    class Plain(MinimalBackend):
        name = "plain_callable"

        def prepare(self, step, node, in_nodes, graph):
            return super().prepare(step, node, in_nodes, graph).fn

    tl.register_backend("plain_callable", Plain)
    try:
        x = rng.standard_normal((5, 6)).astype(np.float32)
        got = tl.compile(_mlp(), backend="plain_callable", cache=False)(x=x)
        want = tl.compile(_mlp(), backend="numpy", cache=False)(x=x)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
    finally:
        unregister_backend("plain_callable")


def test_builtin_backends_declare_their_options():
    from tensorlogic.options import OPTIONS

    for name in tl.available_backends():
        be = tl.get_backend(name)
        declared = {k for k, o in OPTIONS.items() if name in o.backends}
        assert be.capabilities.options == declared, name
        assert isinstance(be, Backend)


def test_prepared_kernel_is_frozen():
    k = PreparedKernel(lambda a, out: out, scratch=(((2,), "float32"),), inplace=(0,))
    with pytest.raises(AttributeError):
        k.scratch = ()  # type: ignore[misc]
    out = np.zeros(2)
    assert k([], out) is out
