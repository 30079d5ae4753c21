"""A catalogue of bad inputs: each must raise the right TensorLogicError subclass, with a message
that names the problem and its place, and leave the graph, the plan and the library usable.

Every case runs against a fresh small graph ``x(2,3) @ w(3,4) -> relu -> y``; after the error the
test checks that the graph is unchanged (same nodes, still valid) and that compiling and calling
it (or the plan the case used) still gives the right answer.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.ir import serialize
from conftest import run_in_threads

W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


class Ctx:
    """The graph under test, its plan, and a second plan with a symbolic batch dimension."""

    def __init__(self) -> None:
        g = tl.EinsumGraph()
        self.x = g.input("x", (2, 3), "float32")
        self.w = g.constant(W, name="w")
        self.h = g.einsum("bi,ij->bj", self.x, self.w, name="h")
        self.y = g.relu(self.h, name="r")
        g.output(self.y, "y")
        self.g = g
        self.plan = tl.compile(g, backend="numpy", opt_level=0)
        gs = tl.EinsumGraph()
        xs = gs.input("x", ("B", 3), "float32")
        gs.output(gs.relu(gs.einsum("bi,ij->bj", xs, gs.constant(W, name="w"))), "y")
        self.gs = gs
        self.splan = tl.compile(gs, backend="numpy", opt_level=0)


def _expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x.astype(np.float64) @ W.astype(np.float64), 0)


def _snapshot(g: tl.EinsumGraph):
    return (
        [(n.id, n.kind, n.op, n.inputs, n.shape, n.dtype, n.name) for n in g.nodes],
        dict(g.inputs),
        dict(g.outputs),
    )


def _still_usable(ctx: Ctx, before) -> None:
    assert _snapshot(ctx.g) == before, "a failed operation changed the graph"
    ctx.g.validate()
    np.testing.assert_allclose(ctx.plan(x=X)["y"], _expected(X), rtol=1e-5, atol=1e-6)
    fresh = tl.compile(ctx.g, backend="numpy", opt_level=0, cache=False)
    np.testing.assert_allclose(fresh(x=X)["y"], _expected(X), rtol=1e-5, atol=1e-6)
    xb = np.ones((5, 3), np.float32)
    np.testing.assert_allclose(ctx.splan(x=xb)["y"], _expected(xb), rtol=1e-5, atol=1e-6)


def _other_graph_tensor():
    return tl.EinsumGraph().input("z", (2, 3))


def _cycle(c: Ctx):
    # rewire the input of 'h' to its own user 'r' through the low-level API, then compile
    g = c.g.copy()
    h = g.node("h")
    g.replace_node(h.id, dataclasses.replace(h, inputs=(g.node("r").id, h.inputs[1])))
    tl.compile(g, backend="numpy")


def _with_limit(c: Ctx, limit: int):
    tl.compile(c.g, backend="numpy", opt_level=0, memory_limit=limit, cache=False)


def _budget_symbolic(c: Ctx):
    plan = tl.compile(c.gs, backend="numpy", opt_level=0, memory_limit=4096, cache=False)
    plan(x=np.ones((2, 3), np.float32))  # fits
    try:
        plan(x=np.ones((10_000, 3), np.float32))  # 160 kB of output does not
    finally:
        np.testing.assert_allclose(plan(x=X)["y"], _expected(X), rtol=1e-5, atol=1e-6)


def _nan_input(c: Ctx, value: float):
    bad = X.copy()
    bad[1, 2] = value
    c.plan(x=bad, check_finite=True)


# (id, action, error class, substrings the message must contain)
CASES = [
    # ------------------------------------------------------------ malformed einsum specs
    (
        "spec-unknown-char",
        lambda c: c.g.einsum("b1,1j->bj", c.x, c.w),
        tl.SpecError,
        ["invalid index character '1'", "b1,1j->bj"],
    ),
    # non-ASCII characters are opt_einsum's extended symbols; surrogates are no characters
    (
        "spec-surrogate-char",
        lambda c: c.g.einsum("b\ud800,\ud800j->bj", c.x, c.w),
        tl.SpecError,
        ["invalid index character '\\ud800'"],
    ),
    (
        "spec-interleaved-bad-sublist",
        lambda c: c.g.einsum(c.x, [0, "k"], c.w, [1, 2]),
        tl.SpecError,
        ["sublist of operand 0", "entry 1 is 'k'"],
    ),
    (
        "spec-rank-mismatch",
        lambda c: c.g.einsum("bik,ij->bj", c.x, c.w),
        tl.SpecError,
        ["'bik'", "3 indices", "operand 0 has rank 2"],
    ),
    (
        "spec-ellipsis-too-many",
        lambda c: c.g.einsum("...abc,ij->ij", c.x, c.w),
        tl.SpecError,
        ["names 3 indices", "rank 2"],
    ),
    (
        "spec-output-not-in-inputs",
        lambda c: c.g.einsum("bi,ij->bz", c.x, c.w),
        tl.SpecError,
        ["output index 'z'", "does not appear"],
    ),
    (
        "spec-repeated-output",
        lambda c: c.g.einsum("bi,ij->bb", c.x, c.w),
        tl.SpecError,
        ["output index 'b'", "more than once"],
    ),
    (
        "spec-term-count",
        lambda c: c.g.einsum("bi,ij,jk->bk", c.x, c.w),
        tl.SpecError,
        ["3 input term(s)", "2 operand(s)"],
    ),
    ("spec-two-arrows", lambda c: c.g.einsum("bi->ib->bi", c.x), tl.SpecError, ["'->'"]),
    ("spec-lone-dot", lambda c: c.g.einsum("b.i,ij->bj", c.x, c.w), tl.SpecError, ["'.'", "'b.i'"]),
    (
        "spec-comma-in-output",
        lambda c: c.g.einsum("bi,ij->b,j", c.x, c.w),
        tl.SpecError,
        ["output term", "','"],
    ),
    ("spec-not-a-string", lambda c: c.g.einsum(7, c.x), tl.SpecError, ["must be a string"]),
    (
        "einsum-no-operands",
        lambda c: c.g.einsum("ij->ji"),
        tl.GraphError,
        ["needs at least one operand"],
    ),
    # ------------------------------------------------------------ shapes
    (
        "einsum-size-mismatch",
        lambda c: c.g.einsum("bi,bj->ij", c.x, c.w),
        tl.ShapeError,
        ["index 'b'", "(2, 3)", "(3, 4)"],
    ),
    (
        "einsum-diagonal-sizes",
        lambda c: c.g.einsum("ii->i", c.x),
        tl.ShapeError,
        ["repeated index 'i'", "different sizes"],
    ),
    (
        "binary-broadcast",
        lambda c: c.g.add(c.x, c.w, name="bad_add"),
        tl.ShapeError,
        ["'bad_add'", "(2, 3)", "(3, 4)", "cannot be broadcast"],
    ),
    (
        "where-broadcast",
        lambda c: c.g.where(c.x, c.x, c.w, name="bad_where"),
        tl.ShapeError,
        ["'bad_where'", "cannot be broadcast"],
    ),
    (
        "reduce-axis-range",
        lambda c: c.g.sum(c.x, axis=2),
        tl.ShapeError,
        ["axis 2", "out of range", "rank 2", "'x'"],
    ),
    (
        "reduce-axis-repeated",
        lambda c: c.g.sum(c.x, axis=(0, -2)),
        tl.GraphError,
        ["repeated axis"],
    ),
    ("reduce-axis-type", lambda c: c.g.max(c.x, axis=1.5), tl.GraphError, ["axis 1.5"]),
    (
        "softmax-axis",
        lambda c: c.g.softmax(c.x, axis=-3),
        tl.ShapeError,
        ["axis -3", "out of range"],
    ),
    (
        "transpose-perm",
        lambda c: c.g.transpose(c.x, [0, 0], name="bad_t"),
        tl.ShapeError,
        ["'bad_t'", "(0, 0)", "not a permutation"],
    ),
    (
        "reshape-size",
        lambda c: c.g.reshape(c.x, (4, 2), name="bad_r"),
        tl.ShapeError,
        ["'bad_r'", "(2, 3)", "(4, 2)"],
    ),
    (
        "reshape-two-minus-one",
        lambda c: c.g.reshape(c.x, (-1, -1)),
        tl.ShapeError,
        ["more than one -1"],
    ),
    (
        "input-negative-dim",
        lambda c: c.g.input("z", (-1, 2)),
        tl.ShapeError,
        ["input 'z'", "negative dimension -1"],
    ),
    ("input-bad-dim", lambda c: c.g.input("z", (2.5,)), tl.ShapeError, ["input 'z'", "2.5"]),
    # ------------------------------------------------------------ dtypes
    (
        "input-longdouble-dtype",
        lambda c: c.g.input("z", (2,), np.longdouble),
        tl.DTypeError,
        ["input 'z'", np.dtype(np.longdouble).name],
    ),
    (
        "input-unknown-dtype",
        lambda c: c.g.input("z", (2,), "float99"),
        tl.DTypeError,
        ["input 'z'", "float99"],
    ),
    ("cast-object", lambda c: c.g.cast(c.x, object), tl.DTypeError, ["'x'", "object"]),
    (
        "constant-strings",
        lambda c: c.g.constant(np.array(["a", "b"]), name="k"),
        tl.DTypeError,
        ["constant k", "unsupported dtype 'str32'"],
    ),
    # ------------------------------------------------------------ graph structure
    (
        "unknown-unary-op",
        lambda c: c.g.unary("cosh", c.x),
        tl.GraphError,
        ["unknown unary op 'cosh'"],
    ),
    (
        "unknown-binary-op",
        lambda c: c.g.binary("atan2", c.x, c.x),
        tl.GraphError,
        ["unknown binary op 'atan2'"],
    ),
    (
        "unknown-reduction",
        lambda c: c.g.reduce("median", c.x),
        tl.GraphError,
        ["unknown reduction 'median'"],
    ),
    (
        "unknown-node-kind",
        lambda c: c.g.add_node("fft", None, [c.x.id]),
        tl.GraphError,
        ["unknown node kind 'fft'"],
    ),
    (
        "add-node-unknown-op",
        lambda c: c.g.add_node("unary", "system", [c.x.id]),
        tl.GraphError,
        ["unknown unary op 'system'"],
    ),
    (
        "unknown-input-id",
        lambda c: c.g.add_node("unary", "exp", [999]),
        tl.GraphError,
        ["unknown input node id 999"],
    ),
    ("cycle", _cycle, tl.GraphError, ["cycle", "'h'", "'r'"]),
    (
        "foreign-tensor",
        lambda c: c.g.add(c.x, _other_graph_tensor()),
        tl.GraphError,
        ["'z'", "another graph"],
    ),
    ("duplicate-name", lambda c: c.g.exp(c.x, name="h"), tl.GraphError, ["'h'", "already exists"]),
    (
        "duplicate-output",
        lambda c: c.g.output(c.h, "y"),
        tl.GraphError,
        ["output named 'y'", "already exists"],
    ),
    ("non-tensor-operand", lambda c: c.g.add(c.x, "3"), tl.GraphError, ["got str"]),
    (
        "compile-not-a-graph",
        lambda c: tl.compile({"nodes": []}),
        tl.GraphError,
        ["expects an EinsumGraph", "dict"],
    ),
    ("compile-no-outputs", lambda c: tl.compile(tl.EinsumGraph()), tl.GraphError, ["no outputs"]),
    (
        "compile-opt-level",
        lambda c: tl.compile(c.g, opt_level=7),
        tl.GraphError,
        ["opt_level", "7"],
    ),
    (
        "compile-unknown-backend",
        lambda c: tl.compile(c.g, backend="tpu"),
        tl.BackendError,
        ["unknown backend 'tpu'", "numpy"],
    ),
    (
        "compile-bad-limit",
        lambda c: tl.compile(c.g, memory_limit=-5),
        tl.GraphError,
        ["memory_limit", "-5"],
    ),
    # ------------------------------------------------------------ memory budget
    (
        "memory-over-budget",
        lambda c: _with_limit(c, 16),
        tl.MemoryBudgetError,
        ["plan needs", "bytes", "memory_limit is 16 bytes"],
    ),
    (
        "memory-over-budget-symbolic",
        _budget_symbolic,
        tl.MemoryBudgetError,
        ["plan needs", "memory_limit is 4096 bytes"],
    ),
    # ------------------------------------------------------------ plan calls
    ("call-missing-input", lambda c: c.plan(), tl.InputError, ["missing input(s) ['x']"]),
    ("call-extra-input", lambda c: c.plan(x=X, q=X), tl.InputError, ["unknown input(s) ['q']"]),
    ("call-list-input", lambda c: c.plan(x=X.tolist()), tl.InputError, ["input 'x'", "got list"]),
    (
        "call-object-array",
        lambda c: c.plan(x=np.array(X, dtype=object)),
        tl.InputError,
        ["input 'x'", "object", "is not supported"],
    ),
    ("call-string-input", lambda c: c.plan(x="1 2 3"), tl.InputError, ["input 'x'", "got str"]),
    (
        "call-int-array",
        lambda c: c.plan(x=np.ones((2, 3), np.int64)),
        tl.InputError,
        ["input 'x'", "int64"],
    ),
    (
        "call-wrong-dtype",
        lambda c: c.plan(x=X.astype(np.float64)),
        tl.InputError,
        ["input 'x'", "float64", "float32"],
    ),
    (
        "call-wrong-shape",
        lambda c: c.plan(x=np.ones((2, 4), np.float32)),
        tl.InputError,
        ["input 'x'", "(2, 4)", "dimension 1: expected 3, got 4"],
    ),
    (
        "call-wrong-rank",
        lambda c: c.plan(x=np.ones((6,), np.float32)),
        tl.InputError,
        ["input 'x'", "rank 1", "rank 2"],
    ),
    (
        "call-symbolic-rank",
        lambda c: c.splan(x=np.ones((3,), np.float32)),
        tl.InputError,
        ["input 'x'", "rank 1"],
    ),
    ("call-not-a-mapping", lambda c: c.plan([X]), tl.InputError, ["dict", "list"]),
    (
        "call-nan",
        lambda c: _nan_input(c, np.nan),
        tl.InputError,
        ["input 'x'", "NaN or inf", "check_finite"],
    ),
    ("call-inf", lambda c: _nan_input(c, -np.inf), tl.InputError, ["input 'x'", "NaN or inf"]),
    (
        "call-out-shape",
        lambda c: c.plan(x=X, out={"y": np.empty((4, 2), np.float32)}),
        tl.InputError,
        ["out['y']", "(2, 4)"],
    ),
    (
        "call-out-unknown",
        lambda c: c.plan(x=X, out={"z": np.empty((2, 4), np.float32)}),
        tl.InputError,
        ["unknown output 'z'"],
    ),
]


@pytest.mark.parametrize("action,error,phrases", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(action, error, phrases):
    ctx = Ctx()
    before = _snapshot(ctx.g)
    with pytest.raises(error) as info:
        action(ctx)
    msg = str(info.value)
    for p in phrases:
        assert p in msg, f"message {msg!r} does not mention {p!r}"
    assert isinstance(info.value, tl.TensorLogicError)
    _still_usable(ctx, before)


def test_symbol_conflict_between_inputs():
    g = tl.EinsumGraph()
    a = g.input("a", ("B", 2))
    b = g.input("b", ("B", 2))
    g.output(a + b, "s")
    plan = tl.compile(g, backend="numpy")
    with pytest.raises(tl.InputError, match=r"input 'b'.*symbol 'B' is already 3 from input 'a'"):
        plan(a=np.ones((3, 2), np.float32), b=np.ones((4, 2), np.float32))
    out = plan(a=np.ones((4, 2), np.float32), b=np.ones((4, 2), np.float32))["s"]
    np.testing.assert_array_equal(out, 2 * np.ones((4, 2)))


# ---------------------------------------------------------------- graph files


def _doc() -> dict:
    doc, _ = serialize.to_dict(Ctx().g)
    return doc


def _edit(path_fn):
    doc = _doc()
    path_fn(doc)
    return doc


def _node(doc, name):
    return next(n for n in doc["nodes"] if n["name"] == name)


JSON_CASES = [
    ("top-level-list", lambda: [], ["expected a JSON object", "list"]),
    ("wrong-format", lambda: _edit(lambda d: d.update(format="pickle")), ["'format'"]),
    ("wrong-version", lambda: _edit(lambda d: d.update(version=99)), ["'version' 99"]),
    ("nodes-not-list", lambda: _edit(lambda d: d.update(nodes="abc")), ["'nodes' must be a list"]),
    (
        "unknown-top-field",
        lambda: _edit(lambda d: d.update(code="import os")),
        ["unknown top-level field(s) ['code']"],
    ),
    (
        "unknown-node-field",
        lambda: _edit(lambda d: _node(d, "r").update(exec="x")),
        ["nodes[3]", "unknown field(s) ['exec']"],
    ),
    (
        "unknown-arg-field",
        lambda: _edit(lambda d: _node(d, "h")["args"].update(__reduce__=1)),
        ["nodes[2]", "unknown argument(s) ['__reduce__']"],
    ),
    (
        "unknown-kind",
        lambda: _edit(lambda d: _node(d, "r").update(kind="eval")),
        ["nodes[3]", "unknown node kind 'eval'"],
    ),
    (
        "unknown-op",
        lambda: _edit(lambda d: _node(d, "r").update(op="system")),
        ["nodes[3]", "unknown unary op 'system'"],
    ),
    ("id-not-int", lambda: _edit(lambda d: _node(d, "x").update(id="0")), ["nodes[0]", "'id'"]),
    (
        "shape-wrong-type",
        lambda: _edit(lambda d: _node(d, "x").update(shape="2x3")),
        ["nodes[0]", "'shape'"],
    ),
    (
        "negative-dim",
        lambda: _edit(lambda d: _node(d, "x").update(shape=[2, -3])),
        ["nodes[0]", "invalid dimension -3"],
    ),
    (
        "huge-shape",
        lambda: _edit(lambda d: _node(d, "x").update(shape=[10**9, 10**9])),
        ["nodes[0]", "over the limit"],
    ),
    (
        "rank-too-high",
        lambda: _edit(lambda d: _node(d, "x").update(shape=[1] * 40)),
        ["nodes[0]", "at most 32"],
    ),
    (
        "forward-reference",
        lambda: _edit(lambda d: _node(d, "h").update(inputs=[0, 3])),
        ["nodes[2]", "ids of earlier nodes"],
    ),
    (
        "self-reference",
        lambda: _edit(lambda d: _node(d, "r").update(inputs=[3])),
        ["nodes[3]", "ids of earlier nodes"],
    ),
    (
        "declared-shape-lies",
        lambda: _edit(lambda d: _node(d, "h").update(shape=[2, 5])),
        ["nodes[2]", "declared shape [2, 5]"],
    ),
    (
        "bad-spec",
        lambda: _edit(lambda d: _node(d, "h")["args"].update(spec="b1,1j->bj")),
        ["nodes[2]", "invalid index character '1'"],
    ),
    (
        "output-unknown-node",
        lambda: _edit(lambda d: d["outputs"].update(y=77)),
        ["output 'y'", "unknown node 77"],
    ),
    ("no-outputs", lambda: _edit(lambda d: d.update(outputs={})), ["declares no outputs"]),
    (
        "dtype-wrong-type",
        lambda: _edit(lambda d: _node(d, "x").update(dtype=["float32"])),
        ["nodes[0]", "'dtype'"],
    ),
]


@pytest.mark.parametrize(
    "make,phrases", [c[1:] for c in JSON_CASES], ids=[c[0] for c in JSON_CASES]
)
def test_bad_graph_json(tmp_path, make, phrases):
    good = Ctx().g
    good.save(tmp_path / "model.json")  # the constant 'w' goes to model.npz beside it
    (tmp_path / "model.json").write_text(json.dumps(make()))
    with pytest.raises(tl.SerializationError) as info:
        tl.EinsumGraph.load(tmp_path / "model.json")
    msg = str(info.value)
    assert "model.json" in msg
    for p in phrases:
        assert p in msg, f"message {msg!r} does not mention {p!r}"
    # the loader keeps no state: a good file right after loads and computes correctly
    good.save(tmp_path / "good.json")
    g2 = tl.EinsumGraph.load(tmp_path / "good.json")
    out = tl.compile(g2, backend="numpy")(x=X)["y"]
    np.testing.assert_allclose(out, _expected(X), rtol=1e-5, atol=1e-6)


def test_graph_json_deep_nesting(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(tl.SerializationError, match="'deep.json'.*nested too deeply"):
        tl.EinsumGraph.load(p)


def test_graph_json_not_json(tmp_path):
    p = tmp_path / "junk.json"
    p.write_bytes(b"\x80\x04\x95 pickle bytes, not JSON")
    with pytest.raises(tl.SerializationError, match="'junk.json'.*not valid JSON"):
        tl.EinsumGraph.load(p)


def test_graph_json_missing_file(tmp_path):
    with pytest.raises(tl.SerializationError, match="'nope.json'.*cannot read"):
        tl.EinsumGraph.load(tmp_path / "nope.json")


def test_graph_file_size_bound(tmp_path, monkeypatch):
    Ctx().g.save(tmp_path / "m.json")
    monkeypatch.setattr(serialize, "MAX_FILE_BYTES", 100)
    with pytest.raises(tl.SerializationError, match="'m.json'.*exceed the limit of 100"):
        tl.EinsumGraph.load(tmp_path / "m.json")


def test_graph_node_count_bound(tmp_path, monkeypatch):
    Ctx().g.save(tmp_path / "m.json")
    monkeypatch.setattr(serialize, "MAX_NODES", 3)
    with pytest.raises(tl.SerializationError, match="4 nodes exceed the limit of 3"):
        tl.EinsumGraph.load(tmp_path / "m.json")


def test_graph_npz_with_pickled_objects_is_refused(tmp_path):
    Ctx().g.save(tmp_path / "m.json")
    # an object array can only be stored by pickling it; loading must refuse, not unpickle
    np.savez(tmp_path / "m.npz", c1=np.array([{"payload": 1}], dtype=object))
    with pytest.raises(tl.SerializationError, match="'m.npz'"):
        tl.EinsumGraph.load(tmp_path / "m.json")


def test_graph_npz_missing_constant(tmp_path):
    Ctx().g.save(tmp_path / "m.json")
    np.savez(tmp_path / "m.npz", other=np.ones(3))
    with pytest.raises(tl.SerializationError, match=r"nodes\[1\].*constant 'w' has no array 'c1'"):
        tl.EinsumGraph.load(tmp_path / "m.json")


def test_graph_blob_garbage():
    with pytest.raises(tl.SerializationError, match="graph blob"):
        serialize.loads(b"definitely not an npz archive")


# ---------------------------------------------------------------- programs

HAS_LANG = importlib.util.find_spec("tensorlogic.lang") is not None
needs_lang = pytest.mark.skipif(
    not HAS_LANG, reason="the language front end (tensorlogic.lang, tl.parse) is not in this build"
)

GOOD_PROGRAM = (
    'edge("a", "b").\nedge("b", "c").\npath(X, Y) :- edge(X, Y).\n'
    "path(X, Z) :- path(X, Y), edge(Y, Z).\n"
)


def _program_still_works():
    prog = tl.parse(GOOD_PROGRAM)
    assert prog.query("path") == {("a", "b"), ("b", "c"), ("a", "c")}


PROGRAM_CASES = [
    # (text, arrays for run(), phrases the message must contain)
    ("syntax-unclosed-paren", "X: float32[N]\nY[i] = exp(X[i]\n", {}, ["line", "expected"]),
    ("syntax-bad-token", 'edge("a", "b").\npath(X, Y) :- edge(X, Y) $ .\n', {}, ["line 2"]),
    ("syntax-empty-body", 'edge("a", "b").\npath(X, Y) :- .\n', {}, ["line 2"]),
    ("unbound-head-variable", 'edge("a", "b").\np(X, Z) :- edge(X, Y).\n', {}, ["line 2", "Z"]),
    ("arity-mismatch", 'edge("a", "b").\np(X) :- edge(X).\n', {}, ["line 2", "edge"]),
    (
        "cyclic-negation",
        'node("a").\np(X) :- node(X), not q(X).\nq(X) :- node(X), not p(X).\n',
        {},
        ["cannot be stratified", "line"],
    ),
    (
        "cyclic-equations",
        "X: float32[N]\nA[i] = B[i] + X[i]\nB[i] = A[i]\n",
        {"X": np.ones(3, np.float32)},
        ["cycle", "line"],
    ),
    (
        "deep-parentheses",
        "X: float32[N]\nY[i] = " + "(" * 20_000 + "X[i]" + ")" * 20_000 + "\n",
        {"X": np.ones(3, np.float32)},
        ["line 2"],
    ),
    (
        "huge-sum",
        "X: float32[N]\nY[i] = " + " + ".join(["X[i]"] * 5_000) + "\n",
        {"X": np.ones(3, np.float32)},
        ["line 2", "operators"],
    ),
]


@needs_lang
@pytest.mark.parametrize(
    "text,arrays,phrases", [c[1:] for c in PROGRAM_CASES], ids=[c[0] for c in PROGRAM_CASES]
)
def test_bad_program(text, arrays, phrases):
    with pytest.raises(tl.ProgramError) as info:
        tl.parse(text).run(backend="numpy", **arrays)
    msg = str(info.value)
    for p in phrases:
        assert p in msg, f"message {msg!r} does not mention {p!r}"
    _program_still_works()


@needs_lang
def test_deep_rule_chain_evaluates():
    # 3000 rules p0 <- p1 <- ... : deep, but valid; it must evaluate, not overflow the stack
    n = 3000
    lines = [f"p{k}(X) :- p{k + 1}(X)." for k in range(n)] + [f'p{n}("a").']
    prog = tl.parse("\n".join(lines))
    assert prog.query("p0") == {("a",)}
    _program_still_works()


@needs_lang
def test_program_file_syntax_error_names_file(tmp_path):
    p = tmp_path / "broken.tl"
    p.write_text("X: float32[N]\nY[i] = = X[i]\n")
    with pytest.raises(tl.ProgramError, match="line 2"):
        tl.load_program(p)
    _program_still_works()


def test_catalogue_size():
    n = len(CASES) + len(JSON_CASES) + 8 + (len(PROGRAM_CASES) + 2 if HAS_LANG else 0)
    assert n >= 40


# ---------------------------------------------------------------- errors under threads


def test_bad_calls_from_threads_leave_plan_correct():
    ctx = Ctx()
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for _ in range(50):
                try:
                    ctx.plan(x=np.ones((k + 1, 3), np.float32) if k % 2 else X.tolist())
                except tl.InputError:
                    pass
                np.testing.assert_allclose(ctx.plan(x=X)["y"], _expected(X), rtol=1e-5, atol=1e-6)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    run_in_threads(worker, 4)
    assert not errors, errors[0]


def _blob_with_record(record: bytes) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, __graph__=np.frombuffer(record, dtype=np.uint8))
    return buf.getvalue()


@pytest.mark.parametrize(
    "record,phrase",
    [
        (b"{not json", "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (
            b'{"format": "tensorlogic-graph", "version": 1, "nodes": 5, '
            b'"inputs": {}, "outputs": {}}',
            "'nodes' must be a list",
        ),
    ],
)
def test_graph_blob_bad_record(record, phrase):
    with pytest.raises(tl.SerializationError, match=phrase):
        serialize.loads(_blob_with_record(record))
    g = Ctx().g
    out = tl.compile(serialize.loads(serialize.dumps(g)), backend="numpy")(x=X)["y"]
    np.testing.assert_allclose(out, _expected(X), rtol=1e-5, atol=1e-6)
