"""Saving and loading graphs: exact round trips, and clear errors for malformed files."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.ir import serialize


def _model(rng):
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 5))
    w = g.constant(rng.standard_normal((5, 3)).astype("float32"), name="w")
    h = g.softmax(g.einsum("bi,ij->bj", x, w) * 0.5, -1)
    g.output(g.sum(h, 1, keepdims=True), name="s")
    g.output(g.reshape(h, ("B", 3, 1)), name="h")
    return g


def test_round_trip_is_exact(tmp_path, rng):
    g = _model(rng)
    path = tmp_path / "model.json"
    g.save(path)
    assert (tmp_path / "model.npz").exists()
    g2 = tl.EinsumGraph.load(path)
    assert g2.fingerprint() == g.fingerprint()
    x = rng.standard_normal((4, 5)).astype("float32")
    a = tl.compile(g, backend="numpy")(x=x)
    b = tl.compile(g2, backend="numpy")(x=x)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_dumps_loads(rng):
    g = _model(rng)
    assert serialize.loads(serialize.dumps(g)).fingerprint() == g.fingerprint()


def _doc(rng):
    doc, arrays = serialize.to_dict(_model(rng))
    return doc, arrays


@pytest.mark.parametrize(
    "mutate,fragment",
    [
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.update(extra=1), "unknown top-level"),
        (lambda d: d["nodes"][0].update(shape=[10**9, 10**9]), "elements"),
        (lambda d: d["nodes"][0].update(shape="big"), "shape"),
        (lambda d: d["nodes"][0].update(dtype=7), "dtype"),
        (lambda d: d["nodes"][2].update(kind="python_eval"), "unknown node kind"),
        (lambda d: d["nodes"][2].update(inputs=[99]), "inputs"),
        (
            lambda d: d["nodes"][2].update(args={"spec": "ij,jk->ik", "code": "x"}),
            "unknown argument",
        ),
        (lambda d: d["nodes"][2].update(args={"spec": "bi,ij->bz"}), "does not appear"),
        (lambda d: d["nodes"][2].update(surprise=True), "unknown field"),
        (lambda d: d.update(outputs={}), "no outputs"),
        (lambda d: d.update(outputs={"s": 12345}), "unknown node"),
        (lambda d: d.update(nodes={"a": 1}), "'nodes' must be a list"),
    ],
)
def test_malformed_documents(mutate, fragment, rng):
    doc, arrays = _doc(rng)
    mutate(doc)
    with pytest.raises(tl.SerializationError) as err:
        serialize.from_dict(doc, arrays)
    assert fragment in str(err.value)


def test_malformed_files(tmp_path, rng):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(tl.SerializationError, match="not valid JSON"):
        tl.EinsumGraph.load(bad)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(tl.SerializationError):
        tl.EinsumGraph.load(deep)
    with pytest.raises(tl.SerializationError, match="cannot read"):
        tl.EinsumGraph.load(tmp_path / "missing.json")
    # a constant whose array is missing from the .npz
    g = _model(rng)
    path = tmp_path / "m.json"
    g.save(path)
    np.savez(tmp_path / "m.npz", other=np.ones(2))
    with pytest.raises(tl.SerializationError, match="no array"):
        tl.EinsumGraph.load(path)
    # a pickled object array in the .npz is refused, not executed
    np.savez(tmp_path / "m.npz", c1=np.array([object()], dtype=object))
    with pytest.raises(tl.SerializationError):
        tl.EinsumGraph.load(path)


def test_saved_json_is_plain(tmp_path, rng):
    path = tmp_path / "g.json"
    _model(rng).save(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "tensorlogic-graph" and isinstance(doc["nodes"], list)
