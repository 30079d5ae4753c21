"""Graph serialization: JSON for structure, .npz beside it for constants.

Loading never executes code (plain ``json`` and ``np.load(allow_pickle=False)``), accepts only
known fields and types, bounds every size, and rebuilds the graph through ``add_node`` so every
shape is re-inferred and checked.
"""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .. import dtypes
from ..errors import SerializationError, TensorLogicError
from . import ops, safe_io
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
    ops.EINSUM: {"spec"},
    ops.REDUCE: {"axes", "keepdims"},
    ops.ROWOP: {"axis", "eps"},
    ops.ROWGRAD: {"axis", "eps"},
    ops.TRANSPOSE: {"perm"},
    ops.RESHAPE: {"shape"},
    ops.CAST: {"dtype"},
    ops.ATTENTION: {"scale", "causal", "layout"},
}

# arguments a node of the kind may leave out (layer_norm's eps is checked by shape inference)
_OPTIONAL_ARGS = {"keepdims", "eps", "layout"}


def to_dict(g: EinsumGraph) -> tuple[dict, dict[str, np.ndarray]]:
    """The graph as a JSON-able dict plus its constants keyed ``c<id>``."""
    nodes = []
    for n in g.nodes:
        if n.kind == ops.FUSED:
            raise SerializationError(
                f"node {n.name!r} is a fused node made by the "
                f"optimizer; save the graph before optimizing it"
            )
        nodes.append(
            {
                "id": n.id,
                "kind": n.kind,
                "op": n.op,
                "inputs": list(n.inputs),
                "shape": list(n.shape),
                "dtype": n.dtype,
                "name": n.name,
                "args": json.loads(json.dumps(_plain(n.args))),
            }
        )
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "nodes": nodes,
        "inputs": dict(g.inputs),
        "outputs": dict(g.outputs),
    }
    # parameters travel with the values the graph holds (``plan.graph_with_parameters()`` for
    # trained ones), under the same ``c<id>`` names as constants
    return doc, {f"c{i}": a for i, a in {**g.constants, **g.parameter_values}.items()}


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


_OP_KINDS = (*ops.ELEMENTWISE_KINDS, ops.REDUCE, ops.ROWOP, ops.ROWGRAD)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_args(kind: str, args: dict, w: str) -> None:
    """Each argument's JSON type, exactly: no truthy strings, no floats where ints belong."""

    def int_list(key: str) -> None:
        v = args[key]
        _expect(
            isinstance(v, list) and all(_is_int(a) for a in v),
            f"argument {key!r} must be a list of integers, got {v!r}",
            w,
        )

    if kind == ops.EINSUM:
        _expect(isinstance(args["spec"], str), "argument 'spec' must be a string", w)
    elif kind == ops.REDUCE:
        int_list("axes")
        _expect(
            isinstance(args.get("keepdims", False), bool),
            f"argument 'keepdims' must be true or false, got {args.get('keepdims')!r}",
            w,
        )
    elif kind in (ops.ROWOP, ops.ROWGRAD):
        _expect(
            _is_int(args["axis"]), f"argument 'axis' must be an integer, got {args['axis']!r}", w
        )
        if "eps" in args:
            _expect(
                _is_number(args["eps"]), f"argument 'eps' must be a number, got {args['eps']!r}", w
            )
    elif kind == ops.TRANSPOSE:
        int_list("perm")
    elif kind == ops.ATTENTION and "layout" in args:
        int_list("layout")
    elif kind == ops.RESHAPE:
        v = args["shape"]
        _expect(
            isinstance(v, list)
            and len(v) <= MAX_RANK
            and all(_is_int(d) or (isinstance(d, str) and d.isidentifier()) for d in v),
            f"argument 'shape' must be a list of at most {MAX_RANK} integers or symbol names, "
            f"got {v!r}",
            w,
        )
    elif kind == ops.CAST:
        _expect(
            isinstance(args["dtype"], str),
            f"argument 'dtype' must be a string, got {args['dtype']!r}",
            w,
        )


def constant_keys(doc: Any) -> list[str]:
    """The npz member names of the constants a graph document declares (nothing else is read)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        return []
    return [
        f"c{rec['id']}"
        for rec in doc["nodes"][:MAX_NODES]
        if isinstance(rec, dict)
        and rec.get("kind") in (ops.CONSTANT, ops.PARAMETER)
        and _is_int(rec.get("id"))
    ]


def from_dict(doc: Any, arrays: Mapping[str, np.ndarray], where: str = "graph") -> EinsumGraph:
    """Rebuild a graph from ``to_dict`` output, validating every field."""
    try:
        return _from_dict(doc, arrays, where)
    except SerializationError:
        raise
    except TensorLogicError as exc:
        raise SerializationError(f"{where}: {exc}") from exc
    except RecursionError as exc:
        raise SerializationError(f"{where}: nested too deeply") from exc
    except MemoryError as exc:
        raise SerializationError(f"{where}: does not fit in memory") from exc
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        # a safety net: every field is checked above, but a malformed document must never leak
        # a raw exception
        raise SerializationError(f"{where}: malformed graph ({type(exc).__name__}: {exc})") from exc


def _from_dict(doc: Any, arrays: Mapping[str, np.ndarray], where: str) -> EinsumGraph:
    _expect(
        isinstance(doc, dict),
        f"expected a JSON object at top level, got {type(doc).__name__}",
        where,
    )
    unknown = set(doc) - _TOP_FIELDS
    _expect(not unknown, f"unknown top-level field(s) {sorted(map(str, unknown))}", where)
    _expect(
        isinstance(doc.get("format"), str) and doc["format"] == FORMAT,
        f"'format' must be {FORMAT!r}",
        where,
    )
    _expect(
        _is_int(doc.get("version")) and doc["version"] == VERSION,
        f"unsupported 'version' {doc.get('version')!r}",
        where,
    )
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
        _expect(
            isinstance(kind, str) and kind in ops.NODE_KINDS and kind != ops.FUSED,
            f"unknown node kind {kind!r}",
            w,
        )
        if op is None:
            op = ops.DEFAULT_OP.get(kind)
        if kind in _OP_KINDS:
            _expect(isinstance(op, str), f"a {kind} node needs an 'op' string, got {op!r}", w)
        else:
            _expect(op is None, f"a {kind} node takes no 'op', got {op!r}", w)
        _expect(isinstance(name, str) and 0 < len(name) <= 256, "'name' must be a short string", w)
        _expect(_is_int(rec["id"]) and rec["id"] not in id_map, "'id' must be a new integer", w)
        inputs = rec["inputs"]
        _expect(
            isinstance(inputs, list) and all(_is_int(i) and i in id_map for i in inputs),
            "'inputs' must list ids of earlier nodes",
            w,
        )
        shape = rec["shape"]
        _expect(
            isinstance(shape, list) and len(shape) <= MAX_RANK,
            f"'shape' must be a list of at most {MAX_RANK} dims",
            w,
        )
        for d in shape:
            _expect(
                (_is_int(d) and 0 <= d) or (isinstance(d, str) and d.isidentifier()),
                f"invalid dimension {d!r}",
                w,
            )
        n_elem = math.prod(d for d in shape if _is_int(d))
        _expect(
            n_elem <= MAX_ELEMENTS,
            f"declared shape {shape} has {n_elem} elements, over the limit of {MAX_ELEMENTS}",
            w,
        )
        _expect(isinstance(rec["dtype"], str), "'dtype' must be a string", w)
        args = rec.get("args")
        args = {} if args is None else args
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
        _check_args(kind, args, w)
        try:
            if kind == ops.INPUT:
                _expect(not inputs, "an input node takes no inputs", w)
                t = g.input(name, shape, rec["dtype"])
            elif kind in (ops.CONSTANT, ops.PARAMETER):
                _expect(not inputs, f"a {kind} node takes no inputs", w)
                arr, declared = _stored_array(rec, arrays, shape, w)
                t = (
                    g.constant(arr, name=name, dtype=declared)
                    if kind == ops.CONSTANT
                    else g.parameter(name, arr, dtype=declared)
                )
            else:
                nid = g.add_node(kind, op, [id_map[i] for i in inputs], args, name=name)
                t = g.tensor(nid)
        except SerializationError:
            raise
        except TensorLogicError as exc:
            raise SerializationError(f"{w}: {exc}") from exc
        node = t.node
        _expect(
            list(node.shape) == shape or kind in (ops.INPUT,),
            f"declared shape {shape} but inputs give {list(node.shape)}",
            w,
        )
        _expect(
            node.dtype == rec["dtype"],
            f"declared dtype {rec['dtype']!r} but inputs give {node.dtype!r}",
            w,
        )
        id_map[rec["id"]] = t.id
    for name, i in doc["inputs"].items():
        _expect(
            _is_int(i) and i in id_map and g.node(id_map[i]).name == name,
            f"input {name!r} does not match an input node",
            where,
        )
    _expect(len(doc["inputs"]) == len(g.inputs), "'inputs' does not list every input node", where)
    _expect(bool(doc["outputs"]), "the graph declares no outputs", where)
    for name, i in doc["outputs"].items():
        _expect(
            isinstance(name, str) and _is_int(i) and i in id_map,
            f"output {name!r} refers to an unknown node {i!r}",
            where,
        )
        g.outputs[name] = id_map[i]
    return g


def _stored_array(
    rec: dict, arrays: Mapping[str, np.ndarray], shape: list, w: str
) -> tuple[np.ndarray, str]:
    """The array of a constant or parameter record, checked against its declared shape and
    dtype (an exact round trip: a stored dtype other than the declared one is refused)."""
    kind, name = rec["kind"], rec["name"]
    key = f"c{rec['id']}"
    _expect(key in arrays, f"{kind} {name!r} has no array {key!r} in the .npz", w)
    arr = arrays[key]
    if arr.dtype.kind == "V" and arr.dtype.itemsize == 2 and rec["dtype"] == "bfloat16":
        arr = arr.view(dtypes.bfloat16)  # .npz keeps bfloat16 as raw 2-byte records
    _expect(
        list(arr.shape) == shape, f"{kind} {name!r}: array shape {arr.shape} != declared {shape}", w
    )
    declared = dtypes.normalize(rec["dtype"], f"{kind} {name!r}: ")
    _expect(
        arr.dtype == np.dtype(declared),
        f"{kind} {name!r}: stored dtype {arr.dtype} differs from the declared {declared!r}",
        w,
    )
    return arr, declared


# marks an .npz written by ``save``, so that ``save`` never overwrites an unrelated archive
_MARKER = "__tensorlogic_constants__"


def _as_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise SerializationError(
            f"a graph file path must be a str or path, got {type(path).__name__}"
        )
    return Path(path)


def _constants_path(path: Path) -> Path:
    npz = path.with_suffix(".npz")
    if npz == path:
        raise SerializationError(
            f"graph file {path.name!r}: a graph is saved as JSON with its constants in an .npz "
            "beside it; give a path ending in .json, not .npz"
        )
    return npz


def save(g: EinsumGraph, path: str | Path) -> None:
    """Write ``path`` (JSON) and, if the graph has constants, ``path`` with suffix .npz.

    Both files are written atomically. An existing .npz beside ``path`` is replaced only if an
    earlier ``save`` wrote it; a graph without constants leaves any .npz alone.
    """
    path = _as_path(path)
    npz = _constants_path(path)
    doc, arrays = to_dict(g)
    text = json.dumps(doc, indent=1).encode()
    json_where = f"graph file {path.name!r}"
    if not arrays:
        with safe_io.atomic_write(path, json_where) as f:
            f.write(text)
        return
    npz_where = f"constants file {npz.name!r}"
    if npz.exists():
        _expect(
            _written_by_save(npz),
            "exists and was not written by EinsumGraph.save; "
            "refusing to overwrite it (move it or save the graph under another name)",
            npz_where,
        )
    # both files are complete before either replaces its old version (the JSON first)
    with safe_io.atomic_write(npz, npz_where) as fz:
        safe_io.write_npz_to(
            fz, {_MARKER: np.frombuffer(FORMAT.encode(), np.uint8), **arrays}, npz_where
        )
        with safe_io.atomic_write(path, json_where) as f:
            f.write(text)


def _written_by_save(npz: Path) -> bool:
    """Whether ``save`` wrote this archive: it holds our marker, or (an archive written before
    the marker existed) only constants named c<id>."""
    try:
        with safe_io.NpzReader(npz, budget=1 << 20) as z:
            names = z.names
    except SerializationError:
        return False
    return _MARKER in names or (
        bool(names) and all(n[:1] == "c" and n[1:].isdigit() for n in names)
    )


def _parse_json(data: bytes, where: str) -> Any:
    try:
        return json.loads(data)
    except RecursionError as exc:
        raise SerializationError(f"{where}: JSON nested too deeply") from exc
    except MemoryError as exc:
        raise SerializationError(f"{where}: JSON does not fit in memory") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        # ValueError also covers Python's limit on digits in an integer literal
        raise SerializationError(f"{where}: not valid JSON ({exc})") from exc


def load(path: str | Path, memory_limit: int | None = None) -> EinsumGraph:
    """Read a graph written by ``save``; raise SerializationError on anything malformed.

    Only the constants the graph declares are read from the .npz, each checked against
    ``memory_limit`` (default: half the free host memory) before it is inflated.
    """
    path = _as_path(path)
    where = f"graph file {path.name!r}"
    doc = _parse_json(safe_io.read_bounded(path, MAX_FILE_BYTES, where), where)
    arrays: dict[str, np.ndarray] = {}
    keys = constant_keys(doc)
    npz = path.with_suffix(".npz")
    if keys and npz != path and npz.exists():
        arrays = safe_io.read_npz(
            npz, keys, f"{where}: constants file {npz.name!r}", memory_limit, MAX_ELEMENTS
        )
    return from_dict(doc, arrays, where)


def load_npz(
    path: str | Path | bytes, where: str = "", memory_limit: int | None = None
) -> dict[str, np.ndarray]:
    """Read every array of an .npz without pickle, bounded by ``memory_limit`` (see ``load``)."""
    return safe_io.read_npz(path, None, where, memory_limit)


def dumps(g: EinsumGraph) -> bytes:
    """The graph as one bytes blob (JSON + npz), e.g. to ship to another process."""
    doc, arrays = to_dict(g)
    buf = io.BytesIO()
    np.savez(buf, __graph__=np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8), **arrays)
    return buf.getvalue()


def loads(blob: bytes, memory_limit: int | None = None) -> EinsumGraph:
    """Inverse of ``dumps``."""
    if not isinstance(blob, (bytes, bytearray)):
        raise SerializationError(f"graph blob: expected bytes, got {type(blob).__name__}")
    with safe_io.NpzReader(bytes(blob), "graph blob", memory_limit, MAX_ELEMENTS) as z:
        if "__graph__" not in z:
            raise SerializationError("graph blob: no graph record inside")
        record = z.read("__graph__")
        if record.dtype != np.uint8 or record.ndim != 1 or record.size > MAX_FILE_BYTES:
            raise SerializationError("graph blob: the graph record is not a bounded byte string")
        doc = _parse_json(record.tobytes(), "graph blob: the graph record")
        arrays = {k: z.read(k) for k in constant_keys(doc) if k in z}
    return from_dict(doc, arrays, "graph blob")
