"""Memory budget: plans that would not fit raise MemoryBudgetError before allocating anything."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.backends.numpy.backend import NumpyBackend


class CountingBackend(NumpyBackend):
    """The numpy backend with a fixed amount of free memory, counting what it allocates."""

    name = "budget_test"
    free = 10**12

    def __init__(self):
        self.allocs = 0
        self.moved = 0

    def alloc_bytes(self, n):  # noqa: D102
        self.allocs += 1
        return super().alloc_bytes(n)

    def to_device(self, x):  # noqa: D102
        self.moved += 1
        return x

    def free_memory(self):  # noqa: D102
        return self.free


@pytest.fixture
def counting_backend(monkeypatch):
    """Registered only for the test, so other tests that loop over backends never see it."""
    from tensorlogic.backends import base

    be = CountingBackend()
    monkeypatch.setitem(base._factories, "budget_test", lambda: be)
    yield be
    base._instances.pop("budget_test", None)


def _graph(batch=64, width=256):
    rng = np.random.default_rng(0)
    g = tl.EinsumGraph()
    x = g.input("x", (batch, width))
    h = x
    for _ in range(3):
        h = g.relu(
            g.einsum(
                "bi,ij->bj", h, g.constant(rng.standard_normal((width, width)).astype(np.float32))
            )
        )
    g.output(h, name="y")
    return g


def test_memory_limit_raises_with_planned_bytes(counting_backend):
    g = _graph()
    need = tl.compile(g, backend="numpy", cache=False).concrete.planned_bytes
    with pytest.raises(tl.MemoryBudgetError) as err:
        tl.compile(g, backend="budget_test", memory_limit=need - 1, cache=False)
    msg = str(err.value)
    assert f"plan needs {need} bytes" in msg
    assert f"memory_limit is {need - 1} bytes" in msg
    assert err.value.context["planned_bytes"] == need
    assert counting_backend.allocs == 0 and counting_backend.moved == 0
    plan = tl.compile(g, backend="budget_test", memory_limit=need, cache=False)
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    assert plan(x=x)["y"].shape == (64, 256)


def test_planned_bytes_count_the_planned_peak_not_naive():
    g = _graph()
    plan = tl.compile(g, backend="numpy", cache=False)
    cp = plan.concrete
    outputs = 64 * 256 * 4
    assert cp.planned_bytes == cp.memory.peak_bytes + outputs
    assert cp.memory.peak_bytes < cp.memory.naive_bytes
    # a limit between planned and naive needs fits only thanks to the plan
    limit = cp.memory.naive_bytes + outputs - 1
    assert tl.compile(g, backend="numpy", memory_limit=limit, cache=False)
    with pytest.raises(tl.MemoryBudgetError):
        tl.compile(g, backend="numpy", memory_limit=limit, reuse_memory=False, cache=False)


def test_free_memory_of_the_device_is_the_default_limit(counting_backend):
    counting_backend.free = 1000
    with pytest.raises(tl.MemoryBudgetError, match="free memory of the budget_test device is 1000"):
        tl.compile(_graph(), backend="budget_test", cache=False)
    assert counting_backend.allocs == 0
    # an explicit limit replaces the device's free memory
    tl.compile(_graph(), backend="budget_test", memory_limit=10**9, cache=False)


def test_symbolic_plan_checks_each_binding_before_running(counting_backend):
    g = _graph(batch="B")
    plan = tl.compile(g, backend="budget_test", memory_limit=2_000_000, cache=False)
    rng = np.random.default_rng(2)
    assert plan(x=rng.standard_normal((8, 256)).astype(np.float32))["y"].shape == (8, 256)
    allocs = counting_backend.allocs
    with pytest.raises(tl.MemoryBudgetError) as err:
        plan(x=rng.standard_normal((4096, 256)).astype(np.float32))
    need = int(re.search(r"plan needs (\d+) bytes", str(err.value)).group(1))
    assert need > 2_000_000
    assert counting_backend.allocs == allocs
    assert plan(x=rng.standard_normal((8, 256)).astype(np.float32))["y"].shape == (8, 256)


@pytest.mark.parametrize("bad", [0, -5, 1.5, "1GB"])
def test_memory_limit_must_be_positive_bytes(bad):
    with pytest.raises(tl.GraphError, match="memory_limit"):
        tl.compile(_graph(), backend="numpy", memory_limit=bad, cache=False)


@pytest.mark.parametrize("flag", ["pool", "reuse_memory"])
def test_memory_flags_must_be_bool(flag):
    with pytest.raises(tl.GraphError, match=flag):
        tl.compile(_graph(), backend="numpy", cache=False, **{flag: "yes"})


def test_check_budget_on_compiled_plan():
    plan = tl.compile(_graph(), backend="numpy", cache=False)
    plan.check_budget(None)
    plan.check_budget(plan.concrete.planned_bytes)
    with pytest.raises(tl.MemoryBudgetError, match="the memory limit is 10 bytes"):
        plan.check_budget(10)
