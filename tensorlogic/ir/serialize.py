"""Graph serialization: JSON for structure, .npz beside it for constants.

Loading never executes code (plain ``json`` and ``np.load(allow_pickle=False)``), accepts only
known fields and types, bounds every size, and rebuilds the graph through ``add_node`` so every
shape is re-inferred and checked.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .. import dtypes
from ..errors import SerializationError, TensorLogicError
from . import ops
from .graph import EinsumGraph

FORMAT = "tensorlogic-graph"
VERSION = 1
MAX_FILE_BYTES = 64 << 20
MAX_NODES = 200_000
MAX_RANK = 32
MAX_ELEMENTS = 1 << 34  # per declared tensor; a larger shape is rejected as implausible
_NODE_FIELDS = {"id", "kind", "op", "inputs", "shape", "dtype", "name", "args"}
_TOP_FIELDS = {"format", "version", "nodes", "inputs", "outputs"}
_ARG_FIELDS = {
    ops.EINSUM: {"spec"}, ops.REDUCE: {"axes", "keepdims"}, ops.ROWOP: {"axis", "eps"},
    ops.TRANSPOSE: {"perm"}, ops.RESHAPE: {"shape"}, ops.CAST: {"dtype"},
}

# arguments a node of the kind may leave out (layer_norm's eps is checked by shape inference)
_OPTIONAL_ARGS = {"keepdims", "eps"}


def to_dict(g: EinsumGraph) -> tuple[dict, dict[str, np.ndarray]]:
    """The graph as a JSON-able dict plus its constants keyed ``c<id>``."""
    nodes = []
    for n in g.nodes:
        if n.kind == ops.FUSED:
            raise SerializationError(
                f"node {n.name!r} is a fused node made by the "
                f"optimizer; save the graph before optimizing it"
            )
        nodes.append({
            "id": n.id, "kind": n.kind, "op": n.op, "inputs": list(n.inputs),
            "shape": list(n.shape), "dtype": n.dtype, "name": n.name,
            "args": json.loads(json.dumps(_plain(n.args))),
        })
    doc = {"format": FORMAT, "version": VERSION, "nodes": nodes,
           "inputs": dict(g.inputs), "outputs": dict(g.outputs)}
    return doc, {f"c{i}": a for i, a in g.constants.items()}


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _fail(msg: str, where: str) -> SerializationError:
    return SerializationError(f"{where}: {msg}")


def _expect(cond: bool, msg: str, where: str) -> None:
    if not cond:
        raise _fail(msg, where)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def from_dict(doc: Any, arrays: Mapping[str, np.ndarray], where: str = "graph") -> EinsumGraph:
    """Rebuild a graph from ``to_dict`` output, validating every field."""
    _expect(
        isinstance(doc, dict),
        f"expected a JSON object at top level, got {type(doc).__name__}",
        where,
    )
    unknown = set(doc) - _TOP_FIELDS
    _expect(not unknown, f"unknown top-level field(s) {sorted(unknown)}", where)
    _expect(doc.get("format") == FORMAT, f"'format' must be {FORMAT!r}", where)
    _expect(doc.get("version") == VERSION, f"unsupported 'version' {doc.get('version')!r}", where)
    nodes = doc.get("nodes")
    _expect(isinstance(nodes, list), "'nodes' must be a list", where)
    _expect(len(nodes) <= MAX_NODES, f"{len(nodes)} nodes exceed the limit of {MAX_NODES}", where)
    for key in ("inputs", "outputs"):
        _expect(isinstance(doc.get(key), dict), f"'{key}' must be an object", where)
    g = EinsumGraph()
    id_map: dict[int, int] = {}
    for k, rec in enumerate(nodes):
        w = f"{where}: nodes[{k}]"
        _expect(isinstance(rec, dict), "expected an object", w)
        unknown = set(rec) - _NODE_FIELDS
        _expect(not unknown, f"unknown field(s) {sorted(unknown)}", w)
        missing = _NODE_FIELDS - set(rec) - {"op", "args"}
        _expect(not missing, f"missing field(s) {sorted(missing)}", w)
        kind, op, name = rec["kind"], rec.get("op"), rec["name"]
        _expect(isinstance(kind, str) and kind in ops.NODE_KINDS and kind != ops.FUSED,
                f"unknown node kind {kind!r}", w)
        _expect(op is None or isinstance(op, str), "'op' must be a string or null", w)
        _expect(isinstance(name, str) and 0 < len(name) <= 256, "'name' must be a short string", w)
        _expect(_is_int(rec["id"]) and rec["id"] not in id_map, "'id' must be a new integer", w)
        inputs = rec["inputs"]
        _expect(isinstance(inputs, list) and all(_is_int(i) and i in id_map for i in inputs),
                "'inputs' must list ids of earlier nodes", w)
        shape = rec["shape"]
        _expect(
            isinstance(shape, list) and len(shape) <= MAX_RANK,
            f"'shape' must be a list of at most {MAX_RANK} dims",
            w,
        )
        for d in shape:
            _expect((_is_int(d) and 0 <= d) or (isinstance(d, str) and d.isidentifier()),
                    f"invalid dimension {d!r}", w)
        n_elem = math.prod(d for d in shape if _is_int(d))
        _expect(n_elem <= MAX_ELEMENTS, f"declared shape {shape} has {n_elem} elements, over the "
                f"limit of {MAX_ELEMENTS}", w)
        _expect(isinstance(rec["dtype"], str), "'dtype' must be a string", w)
        args = rec.get("args") or {}
        _expect(isinstance(args, dict), "'args' must be an object", w)
        allowed = _ARG_FIELDS.get(kind, set())
        _expect(
            set(args) <= allowed, f"unknown argument(s) {sorted(set(args) - allowed)} for {kind}", w
        )
        _expect(
            set(args) >= (allowed - _OPTIONAL_ARGS),
            f"missing argument(s) {sorted(allowed - set(args))} for {kind}",
            w,
        )
        try:
            if kind == ops.INPUT:
                t = g.input(name, shape, rec["dtype"])
            elif kind == ops.CONSTANT:
                key = f"c{rec['id']}"
                _expect(key in arrays, f"constant {name!r} has no array {key!r} in the .npz", w)
                arr = arrays[key]
                if arr.dtype.kind == "V" and arr.dtype.itemsize == 2 and rec["dtype"] == "bfloat16":
                    arr = arr.view(dtypes.bfloat16)  # .npz keeps bfloat16 as raw 2-byte records
                _expect(
                    list(arr.shape) == shape,
                    f"constant {name!r}: array shape {arr.shape} != declared {shape}",
                    w,
                )
                _expect(
                    arr.dtype.name == rec["dtype"],
                    f"constant {name!r}: array dtype {arr.dtype.name} != declared {rec['dtype']}",
                    w,
                )
                t = g.constant(arr, name=name, dtype=rec["dtype"])
            else:
                if kind in (ops.UNARY, ops.BINARY, ops.REDUCE, ops.ROWOP):
                    _expect(isinstance(op, str), f"{kind} node needs an 'op'", w)
                nid = g.add_node(kind, op, [id_map[i] for i in inputs], args, name=name)
                t = g.tensor(nid)
        except SerializationError:
            raise
        except TensorLogicError as exc:
            raise SerializationError(f"{w}: {exc}") from exc
        except (TypeError, ValueError, KeyError) as exc:
            raise SerializationError(f"{w}: malformed node ({type(exc).__name__}: {exc})") from exc
        node = t.node
        _expect(list(node.shape) == shape or kind in (ops.INPUT,),
                f"declared shape {shape} but inputs give {list(node.shape)}", w)
        _expect(
            node.dtype == rec["dtype"],
            f"declared dtype {rec['dtype']!r} but inputs give {node.dtype!r}",
            w,
        )
        id_map[rec["id"]] = t.id
    for name, i in doc["inputs"].items():
        _expect(_is_int(i) and i in id_map and g.node(id_map[i]).name == name,
                f"input {name!r} does not match an input node", where)
    _expect(bool(doc["outputs"]), "the graph declares no outputs", where)
    for name, i in doc["outputs"].items():
        _expect(isinstance(name, str) and _is_int(i) and i in id_map,
                f"output {name!r} refers to an unknown node {i!r}", where)
        g.outputs[name] = id_map[i]
    return g


def save(g: EinsumGraph, path: str | Path) -> None:
    """Write ``path`` (JSON) and, if the graph has constants, ``path`` with suffix .npz."""
    path = Path(path)
    doc, arrays = to_dict(g)
    path.write_text(json.dumps(doc, indent=1))
    npz = path.with_suffix(".npz")
    if arrays:
        np.savez(npz, **arrays)
    elif npz.exists():
        npz.unlink()


def load(path: str | Path) -> EinsumGraph:
    """Read a graph written by ``save``; raise SerializationError on anything malformed."""
    path = Path(path)
    where = f"graph file {path.name!r}"
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise SerializationError(f"{where}: cannot read ({exc.strerror})") from exc
    _expect(size <= MAX_FILE_BYTES, f"{size} bytes exceed the limit of {MAX_FILE_BYTES}", where)
    try:
        doc = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SerializationError(f"{where}: not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise SerializationError(f"{where}: JSON nested too deeply") from exc
    arrays: dict[str, np.ndarray] = {}
    npz = path.with_suffix(".npz")
    if npz.exists():
        arrays = load_npz(npz, where)
    return from_dict(doc, arrays, where)


def load_npz(path: str | Path, where: str = "") -> dict[str, np.ndarray]:
    """Read an .npz of arrays (any IR dtype) without pickle."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, KeyError) as exc:
        name = Path(path).name if isinstance(path, (str, Path)) else "an in-memory archive"
        raise SerializationError(
            f"{where or name}: cannot read arrays from {name!r} ({exc})"
        ) from exc


def dumps(g: EinsumGraph) -> bytes:
    """The graph as one bytes blob (JSON + npz), e.g. to ship to another process."""
    doc, arrays = to_dict(g)
    buf = io.BytesIO()
    np.savez(buf, __graph__=np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8), **arrays)
    return buf.getvalue()


def loads(blob: bytes) -> EinsumGraph:
    """Inverse of ``dumps``."""
    arrays = load_npz(io.BytesIO(blob), "graph blob")
    if "__graph__" not in arrays:
        raise SerializationError("graph blob: no graph record inside")
    try:
        doc = json.loads(arrays.pop("__graph__").tobytes().decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SerializationError(f"graph blob: the graph record is not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise SerializationError("graph blob: JSON nested too deeply") from exc
    return from_dict(doc, arrays, "graph blob")
