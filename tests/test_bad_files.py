"""Hostile files: graph JSON, constants archives, inputs and outputs on disk.

Each case asserts the error class, a message naming the problem, and that nothing changed: the
files on disk are as they were, and a good graph still loads and computes afterwards.
"""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.cli import main as cli_main
from tensorlogic.ir import safe_io, serialize

W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


def _graph() -> tl.EinsumGraph:
    g = tl.EinsumGraph()
    x = g.input("x", (2, 3))
    h = g.einsum("bi,ij->bj", x, g.constant(W, name="w"), name="h")
    g.output(g.relu(g.sum(h, axis=(1,), keepdims=True) + h, name="r"), "y")
    return g


def _expected(x: np.ndarray) -> np.ndarray:
    h = x.astype(np.float64) @ W.astype(np.float64)
    return np.maximum(h.sum(axis=1, keepdims=True) + h, 0)


def _still_loads(tmp_path) -> None:
    """The loader keeps no state: a good file right after loads and computes correctly."""
    _graph().save(tmp_path / "good.json")
    g = tl.EinsumGraph.load(tmp_path / "good.json")
    out = tl.compile(g, backend="numpy")(x=X)["y"]
    np.testing.assert_allclose(out, _expected(X), rtol=1e-5, atol=1e-6)


def _doc() -> dict:
    return serialize.to_dict(_graph())[0]


def _node(doc: dict, name: str) -> dict:
    return next(n for n in doc["nodes"] if n["name"] == name)


def _edit(fn):
    doc = _doc()
    fn(doc)
    return doc


def _set_arg(name, key, value):
    return lambda: _edit(lambda d: _node(d, name)["args"].__setitem__(key, value))


def _set(name, key, value):
    return lambda: _edit(lambda d: _node(d, name).__setitem__(key, value))


# ------------------------------------------------------------------ strict JSON field types
# (id, document maker, phrases): every field of every node kind, with the wrong JSON type
TYPED_CASES = [
    (
        "keepdims-string",
        _set_arg("sum_3", "keepdims", "false"),
        ["nodes[3]", "'keepdims'", "true or false"],
    ),
    ("keepdims-int", _set_arg("sum_3", "keepdims", 0), ["'keepdims'", "true or false"]),
    ("axes-float", _set_arg("sum_3", "axes", [1.0]), ["'axes'", "list of integers"]),
    ("axes-bool", _set_arg("sum_3", "axes", [True]), ["'axes'", "list of integers"]),
    ("axes-not-list", _set_arg("sum_3", "axes", 1), ["'axes'", "list of integers"]),
    ("spec-number", _set_arg("h", "spec", 5), ["nodes[2]", "'spec'", "string"]),
    ("op-on-input", _set("x", "op", "exp"), ["nodes[0]", "input node takes no 'op'"]),
    ("op-on-einsum", _set("h", "op", "sum"), ["nodes[2]", "einsum node takes no 'op'"]),
    ("op-missing-unary", _set("r", "op", None), ["nodes[5]", "needs an 'op'"]),
    ("op-not-string", _set("r", "op", 3), ["nodes[5]", "needs an 'op'"]),
    ("name-not-string", _set("r", "name", ["r"]), ["nodes[5]", "'name'"]),
    ("inputs-not-list", _set("r", "inputs", 4), ["nodes[5]", "'inputs'"]),
    ("inputs-bool", _set("r", "inputs", [True]), ["nodes[5]", "'inputs'"]),
    (
        "arity-unary",
        lambda: _edit(lambda d: _node(d, "r").update(inputs=[0, 0])),
        ["nodes[5]", "takes 1 input(s), got 2"],
    ),
    (
        "arity-binary",
        lambda: _edit(lambda d: _node(d, "add_4").update(inputs=[2])),
        ["nodes[4]", "takes 2 input(s), got 1"],
    ),
    ("input-with-inputs", _set("x", "inputs", []), []),  # valid: no inputs (sanity: loads)
    ("dim-float", _set("x", "shape", [2.0, 3]), ["nodes[0]", "invalid dimension 2.0"]),
    ("dim-bool", _set("x", "shape", [True, 3]), ["nodes[0]", "invalid dimension True"]),
    ("dim-list", _set("x", "shape", [[2], 3]), ["nodes[0]", "invalid dimension [2]"]),
    ("dtype-unknown", _set("x", "dtype", "float99"), ["nodes[0]", "float99"]),
    ("version-string", lambda: _edit(lambda d: d.update(version="1")), ["'version'"]),
    ("version-bool", lambda: _edit(lambda d: d.update(version=True)), ["'version'"]),
    ("format-list", lambda: _edit(lambda d: d.update(format=["tensorlogic-graph"])), ["'format'"]),
    (
        "inputs-missing-one",
        lambda: _edit(lambda d: d.update(inputs={})),
        ["'inputs' does not list every input"],
    ),
    (
        "output-id-string",
        lambda: _edit(lambda d: d["outputs"].update(y="5")),
        ["output 'y'", "unknown node"],
    ),
    ("args-list", _set("h", "args", ["spec"]), ["nodes[2]", "'args' must be an object"]),
]


def _transpose_doc(perm):
    g = tl.EinsumGraph()
    g.output(g.transpose(g.input("x", (2, 3)), (1, 0), name="t"), "y")
    doc = serialize.to_dict(g)[0]
    _node(doc, "t")["args"]["perm"] = perm
    return doc


def _reshape_doc(shape):
    g = tl.EinsumGraph()
    g.output(g.reshape(g.input("x", (2, 3)), (6,), name="r"), "y")
    doc = serialize.to_dict(g)[0]
    _node(doc, "r")["args"]["shape"] = shape
    return doc


def _rowop_doc(key, value):
    g = tl.EinsumGraph()
    g.output(g.layer_norm(g.input("x", (2, 3)), name="n"), "y")
    doc = serialize.to_dict(g)[0]
    _node(doc, "n")["args"][key] = value
    return doc


def _cast_doc(dtype):
    g = tl.EinsumGraph()
    g.output(g.cast(g.input("x", (2, 3)), "float64", name="c"), "y")
    doc = serialize.to_dict(g)[0]
    _node(doc, "c")["args"]["dtype"] = dtype
    return doc


TYPED_CASES += [
    ("perm-bools", lambda: _transpose_doc([True, False]), ["'perm'", "list of integers"]),
    ("perm-floats", lambda: _transpose_doc([1.9, 0.2]), ["'perm'", "list of integers"]),
    ("reshape-float", lambda: _reshape_doc([6.7]), ["'shape'", "integers or symbol names"]),
    ("reshape-bool", lambda: _reshape_doc([True, 6]), ["'shape'"]),
    ("rowop-axis-string", lambda: _rowop_doc("axis", "1"), ["'axis'", "integer"]),
    ("rowop-eps-string", lambda: _rowop_doc("eps", "0.1"), ["'eps'", "number"]),
    ("rowop-eps-bool", lambda: _rowop_doc("eps", True), ["'eps'", "number"]),
    ("cast-dtype-number", lambda: _cast_doc(64), ["'dtype'", "string"]),
    ("cast-dtype-null", lambda: _cast_doc(None), ["'dtype'", "string"]),
]


@pytest.mark.parametrize(
    "make,phrases", [c[1:] for c in TYPED_CASES], ids=[c[0] for c in TYPED_CASES]
)
def test_graph_field_types_are_strict(tmp_path, make, phrases):
    doc = make()
    path = tmp_path / "model.json"
    _graph().save(path)
    path.write_text(json.dumps(doc))
    if not phrases:
        tl.EinsumGraph.load(path)  # the unedited form of the case loads
        return
    with pytest.raises(tl.SerializationError) as info:
        tl.EinsumGraph.load(path)
    msg = str(info.value)
    assert "model.json" in msg
    for p in phrases:
        assert p in msg, f"message {msg!r} does not mention {p!r}"
    _still_loads(tmp_path)


# ------------------------------------------------------------------ raw exceptions never leak


def test_huge_integer_literal(tmp_path):
    # Python refuses int literals beyond 4300 digits with a ValueError of its own
    path = tmp_path / "big.json"
    path.write_text('{"format": "tensorlogic-graph", "version": ' + "9" * 5000 + "}")
    with pytest.raises(tl.SerializationError, match="'big.json'.*not valid JSON"):
        tl.EinsumGraph.load(path)
    _still_loads(tmp_path)


def test_memory_error_while_parsing(tmp_path, monkeypatch):
    _graph().save(tmp_path / "m.json")

    def boom(*a, **k):
        raise MemoryError

    monkeypatch.setattr(serialize.json, "loads", boom)
    with pytest.raises(tl.SerializationError, match="'m.json'.*does not fit in memory"):
        tl.EinsumGraph.load(tmp_path / "m.json")


def test_deep_nesting_inside_args(tmp_path):
    doc = _doc()
    _node(doc, "h")["args"]["spec"] = "DEEP"
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(doc).replace('"DEEP"', "[" * 100_000 + "]" * 100_000))
    with pytest.raises(tl.SerializationError, match="'deep.json'.*nested too deeply"):
        tl.EinsumGraph.load(path)


def test_corrupted_constants_archive(tmp_path):
    _graph().save(tmp_path / "m.json")
    data = bytearray((tmp_path / "m.npz").read_bytes())
    data[len(data) // 2 : len(data) // 2 + 8] = b"\xff" * 8
    (tmp_path / "m.npz").write_bytes(bytes(data))
    before = (tmp_path / "m.npz").read_bytes()
    with pytest.raises(tl.SerializationError, match="'m.npz'"):
        tl.EinsumGraph.load(tmp_path / "m.json")
    assert (tmp_path / "m.npz").read_bytes() == before
    _still_loads(tmp_path)


def test_archive_not_a_zip(tmp_path):
    _graph().save(tmp_path / "m.json")
    (tmp_path / "m.npz").write_bytes(b"PK\x03\x04 but nothing else")
    with pytest.raises(tl.SerializationError, match="'m.npz'.*not an .npz archive"):
        tl.EinsumGraph.load(tmp_path / "m.json")


def test_archive_is_a_directory(tmp_path):
    _graph().save(tmp_path / "m.json")
    (tmp_path / "m.npz").unlink()
    (tmp_path / "m.npz").mkdir()
    with pytest.raises(tl.SerializationError, match="'m.npz'.*is a directory"):
        tl.EinsumGraph.load(tmp_path / "m.json")


def test_graph_path_is_a_directory(tmp_path):
    (tmp_path / "d.json").mkdir()
    with pytest.raises(tl.SerializationError, match="'d.json'.*is a directory"):
        tl.EinsumGraph.load(tmp_path / "d.json")


# ------------------------------------------------------------------ only regular files


def _with_timeout(fn, seconds=10):
    """Run fn on a thread; fail (rather than hang the suite) if it blocks."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "reading blocked"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize("which", ["json", "npz"])
def test_fifo_is_refused_without_blocking(tmp_path, which):
    _graph().save(tmp_path / "m.json")
    target = tmp_path / f"m.{which}"
    target.unlink()
    os.mkfifo(target)
    with pytest.raises(tl.SerializationError, match=f"'m.{which}'.*is a FIFO; expected a regular"):
        _with_timeout(lambda: tl.EinsumGraph.load(tmp_path / "m.json"))


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_device_symlink_is_refused(tmp_path, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    (tmp_path / "m.json").symlink_to(device)
    with pytest.raises(tl.SerializationError, match="'m.json'.*is a device; expected a regular"):
        _with_timeout(lambda: tl.EinsumGraph.load(tmp_path / "m.json"))
    _still_loads(tmp_path)


def test_device_as_inputs_on_the_command_line(tmp_path, capsys):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    _graph().save(tmp_path / "m.json")
    (tmp_path / "in.npz").symlink_to("/dev/zero")
    rc = _with_timeout(
        lambda: cli_main(
            [
                "run",
                str(tmp_path / "m.json"),
                "--inputs",
                str(tmp_path / "in.npz"),
                "--backend",
                "numpy",
            ]
        )
    )
    assert rc == 2
    assert "is a device" in capsys.readouterr().err


# ------------------------------------------------------------------ zip bombs and budgets


def _bomb_member(name: str, nbytes: int) -> tuple[str, bytes]:
    """A deflated .npy member of ``nbytes`` zero bytes (compresses about 1000:1)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<f4", "fortran_order": False, "shape": (nbytes // 4,)}
    )
    return name, buf.getvalue() + bytes(nbytes)


def _write_zip(path, members, compression=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, data in members:
            z.writestr(f"{name}.npy", data)


def test_members_the_graph_never_names_are_not_inflated(tmp_path, monkeypatch):
    g = _graph()
    g.save(tmp_path / "m.json")
    arrays = safe_io.read_npz(tmp_path / "m.npz")
    members = [(k, _npy(v)) for k, v in arrays.items()] + [_bomb_member("junk", 64 << 20)]
    _write_zip(tmp_path / "m.npz", members)
    read: list[str] = []
    real = safe_io.NpzReader.read
    monkeypatch.setattr(safe_io.NpzReader, "read", lambda self, k: read.append(k) or real(self, k))
    g2 = tl.EinsumGraph.load(tmp_path / "m.json")
    assert "junk" not in read and read == ["c1"]
    out = tl.compile(g2, backend="numpy")(x=X)["y"]
    np.testing.assert_allclose(out, _expected(X), rtol=1e-5, atol=1e-6)


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    return buf.getvalue()


def test_named_member_over_the_memory_budget_is_refused_before_inflation(tmp_path):
    g = tl.EinsumGraph()
    x = g.input("x", (1 << 22,))
    g.output(x + g.constant(np.ones(1 << 22, np.float32), name="big"), "y")
    g.save(tmp_path / "m.json")
    with pytest.raises(tl.SerializationError) as info:
        serialize.load(tmp_path / "m.json", memory_limit=1 << 20)
    msg = str(info.value)
    assert "'m.npz'" in msg and "'c1'" in msg and "memory budget of 1048576 bytes" in msg
    assert serialize.load(tmp_path / "m.json", memory_limit=64 << 20).constants


def test_header_that_lies_about_the_size(tmp_path):
    _graph().save(tmp_path / "m.json")
    # the .npy header claims 10^6 floats, the member holds 12
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<f4", "fortran_order": False, "shape": (10**6,)}
    )
    _write_zip(tmp_path / "m.npz", [("c1", buf.getvalue() + W.tobytes())])
    with pytest.raises(tl.SerializationError, match="'c1'.*header declares 4000000 bytes"):
        tl.EinsumGraph.load(tmp_path / "m.json")


def test_budget_counts_every_member_read(tmp_path):
    arrays = {f"a{k}": np.ones(1 << 16, np.float32) for k in range(4)}  # 256 KiB each
    safe_io.write_npz(tmp_path / "in.npz", arrays)
    with pytest.raises(tl.SerializationError, match="already read.*memory budget"):
        serialize.load_npz(tmp_path / "in.npz", memory_limit=700_000)
    assert len(serialize.load_npz(tmp_path / "in.npz", memory_limit=2 << 20)) == 4


# ------------------------------------------------------------------ constants: exact dtypes

BAD_CONSTANT_DATA = [
    ("float64-for-float32", np.ones((3, 4), np.float64), "stored dtype float64"),
    ("complex", np.ones((3, 4), np.complex64), "stored dtype complex64"),
    ("bytes", np.array([[b"ab"] * 4] * 3), "stored dtype |S2"),
    ("datetime", np.zeros((3, 4), "datetime64[s]"), "stored dtype datetime64[s]"),
    ("structured", np.zeros((3, 4), [("a", "<f4")]), "records"),
    ("int32", np.ones((3, 4), np.int32), "stored dtype int32"),
]


@pytest.mark.parametrize(
    "arr,phrase", [c[1:] for c in BAD_CONSTANT_DATA], ids=[c[0] for c in BAD_CONSTANT_DATA]
)
def test_constant_stored_dtype_must_match_the_declared_one(tmp_path, arr, phrase):
    _graph().save(tmp_path / "m.json")
    _write_zip(tmp_path / "m.npz", [("c1", _npy(arr))], zipfile.ZIP_STORED)
    with pytest.raises(tl.SerializationError) as info:
        tl.EinsumGraph.load(tmp_path / "m.json")
    assert phrase in str(info.value)
    _still_loads(tmp_path)


def test_declared_dtype_must_be_supported(tmp_path):
    doc = _doc()
    _node(doc, "w")["dtype"] = "object"
    _graph().save(tmp_path / "m.json")
    (tmp_path / "m.json").write_text(json.dumps(doc))
    with pytest.raises(tl.SerializationError, match="nodes\\[1\\].*'object'"):
        tl.EinsumGraph.load(tmp_path / "m.json")


ROUND_TRIP = {
    "float16": [1e-7, 3.14159, -2.5, 6e4],
    "float32": [1e-7, 3.14159, -2.5, 1e30],
    "float64": [1e-7, 3.14159, -2.5, 1e300],  # must not become inf on the way
    "int32": [0, -7, 2**31 - 1, -(2**31)],
    "int64": [0, -7, 2**62, -(2**63)],
    "bool": [True, False, True, True],
    "complex128": [1 + 2j, -3j, 1e300, 0],
}


@pytest.mark.parametrize("dtype", [d for d in ROUND_TRIP if d in tl.dtypes.SUPPORTED])
def test_constants_round_trip_exactly(tmp_path, dtype):
    vals = np.array(ROUND_TRIP[dtype], dtype)
    g = tl.EinsumGraph()
    x = g.input("x", (4,), dtype)
    g.output(g.where(x, x, g.constant(vals, name="k")), "y")
    g.save(tmp_path / "m.json")
    g2 = tl.EinsumGraph.load(tmp_path / "m.json")
    stored = g2.constants[g2.node("k").id]
    assert stored.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(stored, vals)
    if vals.dtype.itemsize == 1:
        return
    # big-endian storage of the same values is read as the same numbers
    _write_zip(
        tmp_path / "m.npz",
        [("c1", _npy(vals.astype(vals.dtype.newbyteorder(">"))))],
        zipfile.ZIP_STORED,
    )
    g3 = tl.EinsumGraph.load(tmp_path / "m.json")
    np.testing.assert_array_equal(g3.constants[g3.node("k").id], vals)


# ------------------------------------------------------------------ saving


def test_save_to_an_npz_path_is_refused(tmp_path):
    with pytest.raises(tl.SerializationError, match="'model.npz'.*ending in .json"):
        _graph().save(tmp_path / "model.npz")
    assert not (tmp_path / "model.npz").exists()


def test_save_without_constants_keeps_an_unrelated_archive(tmp_path):
    np.savez(tmp_path / "data.npz", mine=np.arange(3))
    g = tl.EinsumGraph()
    g.output(g.exp(g.input("x", (3,))), "y")
    g.save(tmp_path / "data.json")
    np.testing.assert_array_equal(np.load(tmp_path / "data.npz")["mine"], np.arange(3))
    assert tl.EinsumGraph.load(tmp_path / "data.json").outputs


def test_save_with_constants_never_overwrites_a_foreign_archive(tmp_path):
    np.savez(tmp_path / "data.npz", mine=np.arange(3))
    before = (tmp_path / "data.npz").read_bytes()
    with pytest.raises(tl.SerializationError, match="'data.npz'.*not written by"):
        _graph().save(tmp_path / "data.json")
    assert (tmp_path / "data.npz").read_bytes() == before
    assert not (tmp_path / "data.json").exists()
    # its own archive is replaced on the next save
    _graph().save(tmp_path / "model.json")
    _graph().save(tmp_path / "model.json")
    assert tl.EinsumGraph.load(tmp_path / "model.json").constants


def test_failed_save_leaves_the_old_files(tmp_path, monkeypatch):
    _graph().save(tmp_path / "m.json")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken(f, arr, allow_pickle=False):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np.lib.format, "write_array", broken)
    with pytest.raises(tl.SerializationError, match="No space left"):
        _graph().save(tmp_path / "m.json")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# ------------------------------------------------------------------ command-line outputs


def _cli_graph(tmp_path, outputs: list[str]):
    g = tl.EinsumGraph()
    x = g.input("x", (2, 3))
    for k, name in enumerate(outputs):
        g.output(g.exp(x) * float(k + 1), name)
    g.save(tmp_path / "g.json")
    np.savez(tmp_path / "in.npz", x=X)


@pytest.mark.parametrize("name", ["allow_pickle", "file", "args", "kwds"])
def test_cli_output_named_like_a_savez_keyword(tmp_path, name, capsys):
    _cli_graph(tmp_path, [name, "other"])
    rc = cli_main(
        [
            "run",
            str(tmp_path / "g.json"),
            "--inputs",
            str(tmp_path / "in.npz"),
            "--out",
            str(tmp_path / "o.npz"),
            "--backend",
            "numpy",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    with np.load(tmp_path / "o.npz") as z:
        assert sorted(z.files) == sorted([name, "other"])
        np.testing.assert_allclose(z[name], np.exp(X), rtol=1e-6)


def test_cli_failing_run_keeps_an_existing_out_file(tmp_path, capsys):
    _cli_graph(tmp_path, ["y"])
    np.savez(tmp_path / "o.npz", precious=np.arange(4))
    before = (tmp_path / "o.npz").read_bytes()
    np.savez(tmp_path / "bad.npz", x=np.ones((5, 5), np.float32))
    rc = cli_main(
        [
            "run",
            str(tmp_path / "g.json"),
            "--inputs",
            str(tmp_path / "bad.npz"),
            "--out",
            str(tmp_path / "o.npz"),
            "--backend",
            "numpy",
        ]
    )
    assert rc == 2 and "input 'x'" in capsys.readouterr().err
    assert (tmp_path / "o.npz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bad.npz",
        "g.json",
        "g.npz",
        "in.npz",
        "o.npz",
    ]


def test_cli_out_without_extension_reports_the_real_name(tmp_path, capsys):
    _cli_graph(tmp_path, ["y"])
    rc = cli_main(
        [
            "run",
            str(tmp_path / "g.json"),
            "--inputs",
            str(tmp_path / "in.npz"),
            "--out",
            str(tmp_path / "result"),
            "--backend",
            "numpy",
        ]
    )
    assert rc == 0
    real = tmp_path / "result.npz"
    assert f"wrote {real}" in capsys.readouterr().out
    with np.load(real) as z:
        np.testing.assert_allclose(z["y"], np.exp(X), rtol=1e-6)


def test_cli_out_is_a_directory(tmp_path, capsys):
    _cli_graph(tmp_path, ["y"])
    (tmp_path / "o.npz").mkdir()
    rc = cli_main(
        [
            "run",
            str(tmp_path / "g.json"),
            "--inputs",
            str(tmp_path / "in.npz"),
            "--out",
            str(tmp_path / "o.npz"),
            "--backend",
            "numpy",
        ]
    )
    assert rc == 2 and "is a directory" in capsys.readouterr().err


def test_cli_long_chain_graph_runs(tmp_path, capsys):
    # 1,500 nodes through `tensorlogic run` (numba: see tests/backends/test_numba_fused.py for
    # the bound on each fused kernel)
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8))
    h = x
    for k in range(1500):
        h = g.tanh(h) if k % 3 == 0 else h * 0.9 if k % 3 == 1 else h + x
    g.output(h, "y")
    g.save(tmp_path / "chain.json")
    np.savez(tmp_path / "in.npz", x=np.ones((4, 8), np.float32))
    rc = cli_main(
        [
            "run",
            str(tmp_path / "chain.json"),
            "--inputs",
            str(tmp_path / "in.npz"),
            "--backend",
            "numpy",
        ]
    )
    assert rc == 0, capsys.readouterr().err


def test_failed_json_write_keeps_the_old_archive_too(tmp_path, monkeypatch):
    g_old = _graph()
    g_old.save(tmp_path / "m.json")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = safe_io.atomic_write

    class Full:
        def write(self, data):
            raise OSError(28, "No space left on device")

    def failing(path, where=""):
        if "graph file" in where:
            import contextlib

            @contextlib.contextmanager
            def cm():
                with real(path, where):
                    yield Full()

            return cm()
        return real(path, where)

    monkeypatch.setattr(safe_io, "atomic_write", failing)
    g_new = tl.EinsumGraph()
    x = g_new.input("x", (2, 3))
    g_new.output(x * g_new.constant(np.full((2, 3), 7, np.float32), name="w"), "y")
    with pytest.raises(tl.SerializationError, match="No space left"):
        g_new.save(tmp_path / "m.json")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_save_replaces_an_archive_of_constants_written_before_the_marker(tmp_path):
    g = _graph()
    g.save(tmp_path / "m.json")
    np.savez(tmp_path / "m.npz", c1=W)  # the format without the marker member
    g.save(tmp_path / "m.json")
    with np.load(tmp_path / "m.npz") as z:
        assert "__tensorlogic_constants__" in z.files
