"""Hostile calls: graph building, add_node, plan calls, batches, backends.

Every case asserts the error class, a message naming the problem, and that no state changed
(the graph's nodes, constants, inputs and outputs; the plan's results afterwards).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.backends import base as backend_base
from tensorlogic.ir import ops
from tensorlogic.ir.fused import FusedBody, FusedOp

rng = np.random.default_rng(18)
X = rng.standard_normal((2, 3)).astype(np.float32)


def _graph():
    g = tl.EinsumGraph()
    x = g.input("x", (2, 3))
    y = g.relu(x, name="r")
    g.output(y, "y")
    return g, x


def _state(g: tl.EinsumGraph):
    return (
        [(n.id, n.kind, n.op, n.inputs, n.shape, n.dtype, n.name, dict(n.args)) for n in g.nodes],
        dict(g.inputs),
        dict(g.outputs),
        sorted(g.constants),
        g.fingerprint(),
    )


def _unchanged(g, before):
    assert _state(g) == before, "a failed call changed the graph"
    g.validate()
    out = tl.compile(g, backend="numpy", cache=False)(x=X)["y"]
    np.testing.assert_allclose(out, np.maximum(X, 0), rtol=1e-6)
    # the next node gets the next id and a fresh default name, as if nothing had happened
    t = g.exp(g.tensor("x"))
    assert t.id == max(n.id for n in g.nodes) and t.name not in {n[6] for n in before[0]}


# ------------------------------------------------------------------ transactional building
# (id, action on (g, x), error class, phrases)
BUILD_CASES = [
    (
        "add-array-wrong-shape",
        lambda g, x: g.add(x, np.ones((7, 7))),
        tl.ShapeError,
        ["cannot be broadcast", "(7, 7)"],
    ),
    (
        "operator-array-wrong-shape",
        lambda g, x: x + np.ones((7, 7), np.float32),
        tl.ShapeError,
        ["cannot be broadcast"],
    ),
    (
        "matmul-array",
        lambda g, x: x @ np.ones((4, 5), np.float32),
        tl.ShapeError,
        ["index 'j'", "(4, 5)"],
    ),
    (
        "einsum-array-operand",
        lambda g, x: g.einsum("ij,jk->ik", x, np.ones((4, 2))),
        tl.ShapeError,
        ["index 'j'"],
    ),
    (
        "where-arrays",
        lambda g, x: g.where(np.ones((5,)), x, np.zeros((2, 3))),
        tl.ShapeError,
        ["cannot be broadcast"],
    ),
    (
        "binary-string-after-array",
        lambda g, x: g.binary("add", np.ones((2, 3)), "s"),
        tl.GraphError,
        ["got str"],
    ),
    (
        "constant-dtype-name-clash",
        lambda g, x: g.add(x, np.ones((7,)), name="r"),
        tl.GraphError,
        ["'r'", "already exists"],
    ),
    (
        "output-of-bad-constant",
        lambda g, x: g.output(np.array(["a"]), "z"),
        tl.DTypeError,
        ["unsupported dtype 'str32'"],
    ),
    (
        "reduce-keepdims-string",
        lambda g, x: g.sum(x, axis=1, keepdims="false"),
        tl.GraphError,
        ["keepdims must be True or False", "'false'"],
    ),
    (
        "reshape-float-dim",
        lambda g, x: g.reshape(x, (6.7,)),
        tl.ShapeError,
        ["invalid reshape dimension 6.7"],
    ),
    (
        "reshape-bool-dim",
        lambda g, x: g.reshape(x, (True, 6)),
        tl.ShapeError,
        ["invalid reshape dimension True"],
    ),
    (
        "reshape-none-dim",
        lambda g, x: g.reshape(x, (None, 6)),
        tl.ShapeError,
        ["invalid reshape dimension None"],
    ),
    (
        "transpose-float-perm",
        lambda g, x: g.transpose(x, [1.9, 0.2]),
        tl.GraphError,
        ["perm", "integers", "1.9"],
    ),
    (
        "transpose-bool-perm",
        lambda g, x: g.transpose(x, [True, False]),
        tl.GraphError,
        ["perm", "integers"],
    ),
    (
        "transpose-string-perm",
        lambda g, x: g.transpose(x, "10"),
        tl.GraphError,
        ["perm", "integers"],
    ),
    ("cast-none", lambda g, x: g.cast(x, None), tl.DTypeError, ["dtype None", "float32"]),
    ("input-dtype-none", lambda g, x: g.input("z", (2,), None), tl.DTypeError, ["dtype None"]),
]


@pytest.mark.parametrize("case", BUILD_CASES, ids=[c[0] for c in BUILD_CASES])
def test_failed_build_call_changes_nothing(case):
    _, action, error, phrases = case
    g, x = _graph()
    before = _state(g)
    with pytest.raises(error) as info:
        action(g, x)
    msg = str(info.value)
    for p in phrases:
        assert p in msg, f"message {msg!r} does not mention {p!r}"
    _unchanged(g, before)


EMPTY_CASES = [
    ("max", (0, 3), 0, "max over axis 0"),
    ("min", (2, 0), None, "min over axis 1"),
    ("softmax", (2, 0), -1, "softmax over axis 1"),
    ("log_softmax", (0, 2), 0, "log_softmax over axis 0"),
]


@pytest.mark.parametrize("op,shape,axis,phrase", EMPTY_CASES, ids=[c[0] for c in EMPTY_CASES])
def test_no_identity_over_an_empty_axis_raises_at_build_time(op, shape, axis, phrase):
    g, _ = _graph()
    e = g.input("e", shape)
    before = _state(g)
    with pytest.raises(tl.ShapeError) as info:
        getattr(g, op)(e, axis=axis)
    assert phrase in str(info.value) and "empty" in str(info.value)
    assert _state(g) == before


def test_builder_methods_on_tensors_are_transactional():
    g, x = _graph()
    before = _state(g)
    for bad in (
        lambda: x * np.ones((3, 3)),
        lambda: np.ones((5, 5), np.float32) - x,
        lambda: x.reshape(4.5, 2),
        lambda: x.transpose(1.0, 0),
    ):
        with pytest.raises(tl.TensorLogicError):
            bad()
        assert _state(g) == before
    _unchanged(g, before)


def test_nested_failure_rolls_back_every_node_of_the_call():
    g, _ = _graph()
    before = _state(g)
    with pytest.raises(tl.ShapeError):
        # where makes two constants for its operands, then fails on the third
        g.where(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), np.ones((4,)))
    assert _state(g) == before


# ------------------------------------------------------------------ add_node is validated
ADD_NODE_CASES = [
    ("binary-one-input", ("binary", "add", lambda x: [x], None), ["takes 2 input(s), got 1"]),
    ("unary-two-inputs", ("unary", "exp", lambda x: [x, x], None), ["takes 1 input(s), got 2"]),
    ("where-two-inputs", ("where", None, lambda x: [x, x], None), ["takes 3 input(s), got 2"]),
    ("einsum-no-inputs", ("einsum", None, lambda x: [], {"spec": "->"}), ["at least one input"]),
    ("unary-no-op", ("unary", None, lambda x: [x], None), ["needs an op name"]),
    ("einsum-with-op", ("einsum", "sum", lambda x: [x], {"spec": "ij->i"}), ["takes no op"]),
    ("reduce-missing-axes", ("reduce", "sum", lambda x: [x], {}), ["missing argument(s) ['axes']"]),
    (
        "reduce-unknown-arg",
        ("reduce", "sum", lambda x: [x], {"axes": [0], "dims": 1}),
        ["unknown argument(s) ['dims']"],
    ),
    (
        "reduce-axes-floats",
        ("reduce", "sum", lambda x: [x], {"axes": [0.0]}),
        ["axes must be a sequence of integers"],
    ),
    (
        "reduce-keepdims-str",
        ("reduce", "max", lambda x: [x], {"axes": [0], "keepdims": "no"}),
        ["keepdims must be True or False"],
    ),
    (
        "unary-with-args",
        ("unary", "exp", lambda x: [x], {"axis": 0}),
        ["unknown argument(s) ['axis']"],
    ),
    (
        "rowop-axis-float",
        ("rowop", "softmax", lambda x: [x], {"axis": 1.0}),
        ["axis must be an integer"],
    ),
    (
        "transpose-perm-bools",
        ("transpose", None, lambda x: [x], {"perm": [True, False]}),
        ["perm must be a sequence of integers"],
    ),
    (
        "reshape-float",
        ("reshape", None, lambda x: [x], {"shape": [6.0]}),
        ["reshape target must be a sequence"],
    ),
    (
        "cast-dtype-object",
        ("cast", None, lambda x: [x], {"dtype": np.float64}),
        ["cast dtype must be a dtype name"],
    ),
    ("fused-no-body", ("fused", None, lambda x: [x], {}), ["missing argument(s) ['body']"]),
    (
        "fused-garbage-body",
        ("fused", None, lambda x: [x], {"body": {"instrs": 5}}),
        ["malformed fused body"],
    ),
    ("input-kind", ("input", None, lambda x: [], None), ["use g.input"]),
    ("constant-kind", ("constant", None, lambda x: [], None), ["use g.constant"]),
    ("inputs-not-ids", ("unary", "exp", lambda x: ["x"], None), ["unknown input node id 'x'"]),
    ("inputs-bool-id", ("unary", "exp", lambda x: [True], None), ["unknown input node id True"]),
    ("args-not-mapping", ("unary", "exp", lambda x: [x], [("a", 1)]), ["args must be a mapping"]),
]


@pytest.mark.parametrize(
    "spec,phrases", [c[1:] for c in ADD_NODE_CASES], ids=[c[0] for c in ADD_NODE_CASES]
)
def test_add_node_checks_its_record(spec, phrases):
    kind, op, inputs, args = spec
    g, x = _graph()
    before = _state(g)
    with pytest.raises(tl.GraphError) as info:
        g.add_node(kind, op, inputs(x.id), args)
    for p in phrases:
        assert p in str(info.value), f"message {info.value!s} does not mention {p!r}"
    _unchanged(g, before)


def test_add_node_given_shape_must_match_inference():
    g, x = _graph()
    before = _state(g)
    with pytest.raises(tl.GraphError, match=r"given shape/dtype \(99,\)/float32 but the inputs"):
        g.add_node("unary", "exp", [x.id], shape=(99,), dtype="float32")
    _unchanged(g, before)


def test_add_node_fused_with_a_valid_body_still_works():
    g = tl.EinsumGraph()
    a = g.input("a", (4,))
    body = FusedBody(
        (FusedOp("exp", (("in", 0),)), FusedOp("mul", (("tmp", 0), ("const", 2.0)))), (4,)
    )
    nid = g.add_node(ops.FUSED, None, [a.id], {"body": body.to_args()}, shape=(4,), dtype="float32")
    g.output(g.tensor(nid), "y")
    v = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(
        tl.compile(g, backend="numpy", opt_level=0)(a=v)["y"], 2 * np.exp(v), rtol=1e-6
    )


# ------------------------------------------------------------------ out= buffers


def _plan(backend="numpy", opt_level=2):
    g = tl.EinsumGraph()
    a = g.input("a", (4, 5))
    b = g.input("b", (4, 5))
    g.output(g.exp(a) + b, "s")
    g.output(g.tanh(a * b), "t")
    return tl.compile(g, backend=backend, opt_level=opt_level)


def _ab():
    return (
        rng.standard_normal((4, 5)).astype(np.float32),
        rng.standard_normal((4, 5)).astype(np.float32),
    )


def _check_plan_still_right(plan):
    a, b = _ab()
    got = plan(a=a, b=b)
    np.testing.assert_allclose(got["s"], np.exp(a) + b, rtol=1e-5)
    np.testing.assert_allclose(got["t"], np.tanh(a * b), rtol=1e-5, atol=1e-6)


def _overlap_out(kind, a, b):
    big = np.empty((8, 5), np.float32)
    one = np.empty((4, 5), np.float32)
    return {
        "out-is-input": lambda: {"s": a},
        "out-view-of-input": lambda: {"s": a.reshape(-1).reshape(4, 5)},
        "two-outs-same-array": lambda: {"s": one, "t": one},
        "two-outs-overlap": lambda: {"s": big[:4], "t": big[3:7]},
        "out-is-the-other-input": lambda: {"t": b},
    }[kind]()


OVERLAP_CASES = [
    "out-is-input",
    "out-view-of-input",
    "two-outs-same-array",
    "two-outs-overlap",
    "out-is-the-other-input",
]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("opt_level", [0, 2])
@pytest.mark.parametrize("kind", OVERLAP_CASES)
def test_out_overlapping_inputs_or_outputs_is_refused(backend, opt_level, kind):
    plan = _plan(backend, opt_level)
    a, b = _ab()
    a0, b0 = a.copy(), b.copy()
    out = _overlap_out(kind, a, b)
    with pytest.raises(tl.InputError, match=r"out\[.*\] (overlaps|is the same array)"):
        plan(a=a, b=b, out=out)
    np.testing.assert_array_equal(a, a0)  # nothing was written
    np.testing.assert_array_equal(b, b0)
    _check_plan_still_right(plan)


def test_out_sharing_a_buffer_with_an_input_is_refused():
    plan = _plan()
    ab = rng.standard_normal((8, 5)).astype(np.float32)
    with pytest.raises(tl.InputError, match=r"out\['s'\] overlaps the memory of input '[ab]'"):
        plan(a=ab[:4], b=ab[4:], out={"s": ab[3:7]})
    # disjoint halves of one buffer are fine
    store = np.empty((8, 5), np.float32)
    a, b = _ab()
    got = plan(a=a, b=b, out={"s": store[:4], "t": store[4:]})
    np.testing.assert_allclose(store[:4], np.exp(a) + b, rtol=1e-5)
    assert got["s"] is store[:4].base or np.shares_memory(got["s"], store)


OUT_TYPE_CASES = [
    ("read-only", lambda: _readonly(), tl.InputError, ["out['s']", "read-only"]),
    ("list", lambda: [[0.0] * 5] * 4, tl.InputError, ["out['s']", "list"]),
    (
        "matrix",
        lambda: np.asmatrix(np.empty((4, 5), np.float32)),
        tl.InputError,
        ["out['s']", "matrix"],
    ),
    (
        "masked",
        lambda: np.ma.masked_array(np.empty((4, 5), np.float32)),
        tl.InputError,
        ["out['s']", "MaskedArray"],
    ),
    ("wrong-dtype", lambda: np.empty((4, 5), np.float64), tl.InputError, ["out['s']", "float32"]),
    ("fortran", lambda: np.empty((4, 5), np.float32, order="F"), tl.InputError, ["C-contiguous"]),
]


def _readonly():
    arr = np.empty((4, 5), np.float32)
    arr.setflags(write=False)
    return arr


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix itself warns
@pytest.mark.parametrize(
    "make,error,phrases", [c[1:] for c in OUT_TYPE_CASES], ids=[c[0] for c in OUT_TYPE_CASES]
)
def test_out_must_be_a_writable_plain_array(make, error, phrases):
    plan = _plan()
    a, b = _ab()
    with pytest.raises(error) as info:
        plan(a=a, b=b, out={"s": make()})
    for p in phrases:
        assert p in str(info.value), f"message {info.value!s} does not mention {p!r}"
    _check_plan_still_right(plan)


def test_out_not_a_mapping():
    plan = _plan()
    a, b = _ab()
    with pytest.raises(tl.InputError, match="out must be a dict.*list"):
        plan(a=a, b=b, out=[np.empty((4, 5), np.float32)])
    _check_plan_still_right(plan)


# ------------------------------------------------------------------ input array subclasses


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_matrix_and_masked_inputs_are_refused(backend):
    plan = _plan(backend)
    a, b = _ab()
    with pytest.raises(tl.InputError, match="input 'a': np.matrix is not supported.*np.asarray"):
        plan(a=np.asmatrix(a), b=b)
    with pytest.raises(tl.InputError, match="input 'b': a masked array; its mask would be ignored"):
        plan(a=a, b=np.ma.masked_array(b, mask=b > 0))
    _check_plan_still_right(plan)


def test_other_ndarray_subclasses_are_read_as_plain_arrays(tmp_path):
    plan = _plan()
    a, b = _ab()
    mm = np.memmap(tmp_path / "a.bin", np.float32, "w+", shape=(4, 5))
    mm[...] = a
    got = plan(a=mm, b=b)
    assert type(got["s"]) is np.ndarray
    np.testing.assert_allclose(got["s"], np.exp(a) + b, rtol=1e-5)


# ------------------------------------------------------------------ empty axes


def _empty_plan(backend, opt_level, op):
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 3))
    if op in ("softmax", "log_softmax"):
        y = getattr(g, op)(g.exp(x), axis=0)
    else:
        y = g.reduce(op, g.exp(x), axis=0)
    g.output(y, "y")
    return tl.compile(g, backend=backend, opt_level=opt_level)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("opt_level", [0, 2])
@pytest.mark.parametrize("op", ["max", "min", "softmax", "log_softmax"])
def test_no_identity_over_an_empty_axis_raises_at_call_time(backend, opt_level, op):
    plan = _empty_plan(backend, opt_level, op)
    with pytest.raises(tl.ShapeError, match=f"{op} over axis 0 of shape \\(0, 3\\).*empty"):
        plan(x=np.ones((0, 3), np.float32))
    v = rng.standard_normal((4, 3)).astype(np.float32)
    ref = tl.compile(plan.graph, backend="numpy", opt_level=0)(x=v)["y"]
    np.testing.assert_allclose(plan(x=v)["y"], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("opt_level", [0, 2])
@pytest.mark.parametrize(
    "op,expected", [("sum", 0.0), ("mean", math.nan), ("prod", 1.0), ("logsumexp", -math.inf)]
)
def test_reductions_over_an_empty_axis_follow_numpy(backend, opt_level, op, expected):
    plan = _empty_plan(backend, opt_level, op)
    got = plan(x=np.ones((0, 3), np.float32))["y"]
    np.testing.assert_array_equal(got, np.full(3, expected, np.float32))


# ------------------------------------------------------------------ memory_limit


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_memory_limit_counts_copies_of_broadcast_inputs(backend):
    g = tl.EinsumGraph()
    x = g.input("x", (1024, 1024))
    g.output(g.sum(g.exp(x) * 2.0, axis=1), "y")
    plan = tl.compile(g, backend=backend, memory_limit=3 << 20)
    row = rng.standard_normal(1024).astype(np.float32)
    wide = np.broadcast_to(row, (1024, 1024))  # 4 KiB standing for 4 MiB
    if backend == "numba":  # its kernels copy strided inputs: that copy counts
        with pytest.raises(tl.MemoryBudgetError, match="input 'x' is not C-contiguous.*4.0 MiB"):
            plan(x=wide)
    else:  # numpy reads the view as it is
        np.testing.assert_allclose(
            plan(x=wide)["y"], np.full(1024, 2 * np.exp(row).sum()), rtol=1e-4
        )
    dense = np.ascontiguousarray(wide[:1].repeat(1024, 0))
    np.testing.assert_allclose(plan(x=dense)["y"], np.full(1024, 2 * np.exp(row).sum()), rtol=1e-4)


# ------------------------------------------------------------------ specialization cache


def test_specialization_cache_is_a_bounded_lru_and_release_memory_drops_it():
    g = tl.EinsumGraph()
    g.output(g.exp(g.input("x", ("B", 3))), "y")
    plan = tl.compile(g, backend="numpy", cache=False)
    limit = plan.max_specializations
    for n in range(1, 3 * limit):
        v = rng.standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_allclose(plan(x=v)["y"], np.exp(v), rtol=1e-6)
        plan(x=np.ones((1, 3), np.float32))  # keep size 1 recently used
        assert len(plan._specs) <= limit
    assert (1,) in plan._specs  # the recently used one survived
    plan.release_memory()
    assert len(plan._specs) == 0
    v = rng.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(plan(x=v)["y"], np.exp(v), rtol=1e-6)


# ------------------------------------------------------------------ backends


def test_raising_backend_factory_does_not_break_available_backends(monkeypatch):
    def factory():
        raise RuntimeError("driver exploded")

    monkeypatch.setitem(backend_base._factories, "exploding", factory)
    assert "numpy" in tl.available_backends()
    assert "exploding" not in tl.available_backends()
    with pytest.raises(tl.BackendError, match="'exploding' failed to start: RuntimeError"):
        tl.compile(_graph()[0], backend="exploding")
    plan = tl.compile(_graph()[0], backend="auto")
    np.testing.assert_allclose(plan(x=X)["y"], np.maximum(X, 0), rtol=1e-6)


# ------------------------------------------------------------------ batches


def _batch_plan():
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 4))
    g.output(g.exp(x) * 2.0, "y")
    return tl.compile(g, backend="numpy")


@pytest.mark.parametrize("workers,prefetch", [(1, 2), (2, 4), (1, 0)])
def test_a_source_that_reuses_one_buffer_gets_every_batch_right(workers, prefetch):
    plan = _batch_plan()
    buf = np.empty((8, 4), np.float32)
    values = rng.standard_normal((20, 8, 4)).astype(np.float32)

    def source():
        for k in range(20):
            buf[...] = values[k]
            yield {"x": buf}

    results = list(
        tl.run_batches(plan, source(), workers=workers, prefetch=prefetch, progress=False)
    )
    assert len(results) == 20
    for r in results:
        np.testing.assert_allclose(r["y"], np.exp(values[r.index]) * 2, rtol=1e-6)


class _BrokenArray:
    @property
    def shape(self):
        raise RuntimeError("shape exploded")


def test_a_batch_whose_shape_raises_follows_on_error():
    plan = _batch_plan()
    batches = [
        {"x": np.ones((2, 4), np.float32)},
        {"x": _BrokenArray()},
        {"x": np.ones((3, 4), np.float32)},
    ]
    res = list(tl.run_batches(plan, batches, on_error="skip", progress=False))
    assert [r.ok for r in res] == [True, False, True]
    assert isinstance(res[1], tl.BatchFailure) and "input 'x'" in str(res[1].error)
    with pytest.raises(tl.BatchError, match="batch 1"):
        list(tl.run_batches(plan, batches, progress=False))


@pytest.mark.parametrize("where", ["output", "input"])
def test_run_batched_refuses_the_batch_dim_twice(where):
    g = tl.EinsumGraph()
    if where == "output":
        a = g.input("a", ("B", 4))
        g.output(g.einsum("bi,ci->bc", a, a), "o")
    else:
        a = g.input("a", ("B", "B"))
        g.output(g.sum(a, axis=1), "o")
    plan = tl.compile(g, backend="numpy")
    with pytest.raises(tl.InputError, match=f"{where} '.*' \\('B', .*'B'.*more than once"):
        tl.run_batched(
            plan, {"a": np.ones((6, 4 if where == "output" else 6), np.float32)}, 2, progress=False
        )


# ------------------------------------------------------------------ programs


def test_failed_program_run_keeps_the_last_relations():
    prog = tl.parse('edge("a", "b").\npath(X, Y) :- edge(X, Y).\nX: float32[N]\nY[i] = exp(X[i])\n')
    prog.run(backend="numpy", X=np.ones(3, np.float32))
    before = prog.query("path")
    with pytest.raises(tl.ProgramError):
        prog.run(backend="numpy", facts={"edge": [("c", "d")]}, X=np.ones((2, 2), np.float32))
    assert prog.query("path") == before == {("a", "b")}


@pytest.mark.parametrize(
    "content,phrase", [(b"\xff\xfe not utf-8", "not UTF-8"), (None, "is a directory")]
)
def test_program_file_errors(tmp_path, content, phrase):
    p = tmp_path / "p.tl"
    if content is None:
        p.mkdir()
    else:
        p.write_bytes(content)
    with pytest.raises(tl.ProgramError, match=phrase):
        tl.load_program(p)


# ------------------------------------------------------------------ constants and names
CONSTANT_CASES = [
    (
        "scalar-overflows-dtype",
        lambda g, x: g.add(x, 1e300),
        tl.DTypeError,
        ["values overflow float32"],
    ),
    (
        "array-overflows-dtype",
        lambda g, x: g.constant(np.array([1e39]), dtype="float32"),
        tl.DTypeError,
        ["values overflow float32"],
    ),
    (
        "complex-to-float",
        lambda g, x: g.constant(np.ones(2, np.complex64), dtype="float32"),
        tl.DTypeError,
        ["complex data cannot be stored as float32"],
    ),
    (
        "strings-to-float",
        lambda g, x: g.constant(np.array(["1.5"]), dtype="float32"),
        tl.DTypeError,
        ["cannot store <U3 data as float32"],
    ),
    (
        "output-name-int",
        lambda g, x: g.output(x, 5),
        tl.GraphError,
        ["output name must be a non-empty string", "5"],
    ),
    (
        "output-name-empty",
        lambda g, x: g.output(x, ""),
        tl.GraphError,
        ["output name must be a non-empty string"],
    ),
    (
        "load-path-none",
        lambda g, x: tl.EinsumGraph.load(None),
        tl.SerializationError,
        ["path must be a str or path", "NoneType"],
    ),
    (
        "save-path-int",
        lambda g, x: g.save(3),
        tl.SerializationError,
        ["path must be a str or path", "int"],
    ),
]


@pytest.mark.parametrize("case", CONSTANT_CASES, ids=[c[0] for c in CONSTANT_CASES])
def test_constants_and_names_are_not_coerced(case):
    _, action, error, phrases = case
    g, x = _graph()
    before = _state(g)
    with pytest.raises(error) as info:
        action(g, x)
    for p in phrases:
        assert p in str(info.value), f"message {info.value!s} does not mention {p!r}"
    _unchanged(g, before)


def test_infinite_constants_stay_allowed():
    g = tl.EinsumGraph()
    x = g.input("x", (2,))
    g.output(g.maximum(x, -np.inf), "y")
    v = rng.standard_normal(2).astype(np.float32)
    np.testing.assert_array_equal(tl.compile(g, backend="numpy")(x=v)["y"], v)


@pytest.mark.parametrize("size", ["3", 2.5, -1, True, None])
def test_specialize_sizes_are_not_coerced(size):
    g = tl.EinsumGraph()
    g.output(g.exp(g.input("x", ("B", 3))), "y")
    plan = tl.compile(g, backend="numpy")
    with pytest.raises(tl.InputError, match="symbolic dimension 'B' must be an int >= 0"):
        plan.specialize(B=size)
    assert plan.specialize(B=np.int64(4)).binding == {"B": 4}


def test_numpy_integers_and_int_arrays_are_accepted_where_ints_are():
    g, x = _graph()
    assert g.sum(x, axis=np.int64(1)).shape == (2,)
    assert g.transpose(x, np.array([1, 0])).shape == (3, 2)
    assert g.reshape(x, np.array([6])).shape == (6,)
    assert g.reduce("max", x, axis=(np.int32(0),)).node.args["axes"] == (0,)
