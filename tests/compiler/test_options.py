"""Compile options: one validated registry, normalized cache keys, other backends' options."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.options import OPTIONS, CompileOptions, Option, flag, register_option


def _graph():
    g = tl.EinsumGraph()
    x = g.input("x", shape=(3, 4), dtype="float32")
    g.output(g.relu(x * 2.0 - 1.0), name="y")
    return g


@pytest.mark.parametrize("name", ["opt_levle", "fastmath", "fast_maths", "cuda_graphs", "nope"])
def test_unknown_option_names_it_and_the_accepted_ones(name):
    with pytest.raises(tl.GraphError) as err:
        tl.compile(_graph(), backend="numpy", **{name: True})
    msg = str(err.value)
    assert repr(name) in msg and "accepted options are" in msg
    assert "'fast_math'" in msg and "'memory_limit'" in msg


def test_typo_suggests_the_close_option():
    with pytest.raises(tl.GraphError, match="did you mean 'fast_math'"):
        tl.compile(_graph(), backend="numpy", fastmath=False)


@pytest.mark.parametrize(
    "name,value",
    [
        ("fast_math", "no"),
        ("fast_math", "False"),
        ("fast_math", 0),
        ("fast_math", 1),
        ("pool", "yes"),
        ("reuse_memory", None),
        ("assume_finite", 1.0),
        ("pdl", "true"),
        ("cuda_graph", 1),
        ("cuda_graph", "yes"),
        ("codegen", "PTX"),
        ("codegen", None),
        ("memory_limit", 0),
        ("memory_limit", -5),
        ("memory_limit", True),
        ("memory_limit", 1.5e9),
        ("path_memory_limit", "1GB"),
        ("parallel_threshold", -1),
        ("parallel_threshold", 2.0),
    ],
)
def test_wrong_kinds_are_refused_with_what_is_accepted(name, value):
    with pytest.raises(tl.GraphError) as err:
        tl.compile(_graph(), backend="numpy", cache=False, **{name: value})
    msg = str(err.value)
    assert name in msg and OPTIONS[name].expected in msg and repr(value) in msg


def test_bad_option_leaves_the_cache_untouched():
    tl.clear_cache()
    g = _graph()
    with pytest.raises(tl.GraphError):
        tl.compile(g, backend="numpy", fast_math="no")
    plan = tl.compile(g, backend="numpy")
    assert tl.compile(g, backend="numpy") is plan


def test_explicit_defaults_share_the_cache_key():
    tl.clear_cache()
    g = _graph()
    plan = tl.compile(g, backend="numpy")
    assert tl.compile(g, backend="numpy", pool=True, reuse_memory=True, memory_limit=None) is plan
    assert tl.compile(g, backend="numpy", pool=False) is not plan
    # numpy integers normalize to ints: same key as the Python int
    a = tl.compile(g, backend="numpy", memory_limit=10**6)
    assert tl.compile(g, backend="numpy", memory_limit=np.int64(10**6)) is a


def test_options_of_another_backend_are_ignored_and_shown(rng):
    g = _graph()
    plan = tl.compile(g, backend="numpy", codegen="cuda", cuda_graph=False, fast_math=False)
    assert set(plan.options.ignored) == {"codegen", "cuda_graph", "fast_math"}
    text = str(plan)
    assert "options ignored by numpy" in text
    assert "codegen='cuda' (for cupy)" in text and "fast_math=False (for numba)" in text
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(plan(x=x)["y"], np.maximum(x * 2 - 1, 0), rtol=1e-6)
    # an ignored option still has to be well-formed
    with pytest.raises(tl.GraphError, match="codegen"):
        tl.compile(g, backend="numpy", codegen="sass")


def test_backend_specific_options_apply_to_their_backend():
    g = _graph()
    plan = tl.compile(g, backend="numba", fast_math=False, parallel_threshold=0, cache=False)
    assert plan.options.ignored == ()
    assert plan.options["fast_math"] is False and plan.options["parallel_threshold"] == 0
    assert "ignored" not in str(plan)
    assert "fast" not in plan.steps[-1].info  # the kernel really was built without fast math


def test_compile_options_are_read_only_and_complete():
    opts = CompileOptions.resolve({"pool": False}, "numpy")
    assert opts["pool"] is False and opts["reuse_memory"] is True
    assert opts.given == {"pool": False}
    assert "fast_math" not in opts  # not a numpy option
    assert opts["fast_math"] is True  # reads as its default
    with pytest.raises(AttributeError):
        opts.given = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        opts["pool"] = True  # type: ignore[index]
    assert CompileOptions.resolve({"pool": True}, "numpy") == CompileOptions.resolve({}, "numpy")


def test_a_new_option_is_one_registration():
    opt = register_option(
        Option("test_only_flag", flag, "True or False", False, "test", ("numba",))
    )
    try:
        assert CompileOptions.resolve({"test_only_flag": True}, "numba")["test_only_flag"] is True
        assert CompileOptions.resolve({"test_only_flag": True}, "numpy").ignored == (
            "test_only_flag",
        )
        with pytest.raises(tl.GraphError, match="already registered"):
            register_option(opt)
    finally:
        del OPTIONS["test_only_flag"]


@pytest.mark.parametrize(
    "kw", [{"opt_level": 4}, {"opt_level": True}, {"opt_level": "2"}, {"cache": "no"}]
)
def test_compile_arguments_are_checked(kw):
    with pytest.raises(tl.GraphError):
        tl.compile(_graph(), backend="numpy", **kw)
