"""Host arrays as plan inputs: numpy subclasses whose meaning an ndarray view would lose.

``np.matrix`` keeps every result 2-D and redefines ``*``; a masked array's mask would be ignored
by every kernel. Neither is converted silently: both are refused with the explicit conversion to
use. Other subclasses (``np.memmap``, ...) are plain data and are read through an ndarray view.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError


def plain_host_array(x: Any, name: str) -> Any:
    """``x`` as a plain ``np.ndarray`` (when it is a numpy array), or InputError."""
    if not isinstance(x, np.ndarray) or type(x) is np.ndarray:
        return x
    if isinstance(x, np.ma.MaskedArray):
        raise InputError(
            f"input {name!r}: a masked array; its mask would be ignored. Pass "
            f"x.filled(value) for masked entries, or np.asarray(x) to drop the mask"
        )
    if isinstance(x, np.matrix):
        raise InputError(
            f"input {name!r}: np.matrix is not supported (it changes shapes and "
            f"the meaning of *); pass np.asarray(x)"
        )
    return x.view(np.ndarray)


def check_out_array(arr: Any, name: str, native: type) -> None:
    """An ``out=`` array must be exactly the backend's array type and writable."""
    if type(arr) is not native:
        raise InputError(
            f"out[{name!r}]: expected a {native.__module__}.{native.__name__}, got "
            f"{type(arr).__module__}.{type(arr).__name__}"
        )
    flags = getattr(arr, "flags", None)
    if flags is not None and not getattr(flags, "writeable", True):
        raise InputError(f"out[{name!r}]: the array is read-only")


def memory_span(arr: Any) -> tuple[int, int] | None:
    """[first, last) byte addresses an array may touch (host or CUDA), or None if unknown."""
    iface = getattr(arr, "__cuda_array_interface__", None)
    if iface is None:
        iface = getattr(arr, "__array_interface__", None)
    if not iface or iface.get("data") is None:
        return None
    ptr = iface["data"][0]
    shape = iface["shape"]
    if any(d == 0 for d in shape):
        return None  # touches nothing
    itemsize = np.dtype(iface["typestr"]).itemsize
    strides = iface.get("strides") or _c_strides(shape, itemsize)
    lo = ptr + sum(s * (d - 1) for s, d in zip(strides, shape) if s < 0)
    hi = ptr + sum(s * (d - 1) for s, d in zip(strides, shape) if s > 0) + itemsize
    return lo, hi


def _c_strides(shape: tuple, itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def check_out_overlap(out: dict[str, Any], inputs: dict[str, Any]) -> None:
    """Refuse ``out=`` arrays that overlap an input or another output: kernels read inputs after
    writing outputs (and outputs are written one after the other), so aliasing gives silently
    wrong results."""
    for a in (*inputs.values(), *out.values()):
        if type(a) is not np.ndarray:
            break
    else:
        _check_host_overlap(out, inputs)
        return
    spans = [(f"input {n!r}", memory_span(a)) for n, a in inputs.items()]
    seen: dict[int, str] = {}
    for name, arr in out.items():
        if id(arr) in seen:  # the same array for two outputs
            raise InputError(
                f"out[{name!r}] is the same array as out[{seen[id(arr)]!r}]; give "
                "each output its own array"
            )
        seen[id(arr)] = name
        span = memory_span(arr)
        if span is None:
            continue
        for what, other in spans:
            if other is not None and span[0] < other[1] and other[0] < span[1]:
                raise InputError(
                    f"out[{name!r}] overlaps the memory of {what}; results would be "
                    "silently wrong. Give it its own array"
                )
        spans.append((f"out[{name!r}]", span))


def _check_host_overlap(out: dict[str, Any], inputs: dict[str, Any]) -> None:
    """``check_out_overlap`` for numpy arrays: numpy's own bounds test (``may_share_memory``,
    the same [first, last) spans, in C) costs ~1 us a pair, where reading the spans through
    ``__array_interface__`` cost ~15 us an array, most of a small plan's call."""
    share = np.may_share_memory
    done: list[Any] = []
    for name, arr in out.items():
        for other in inputs.values():
            if share(arr, other):
                _refuse_overlap(name, arr, out, inputs)
        for other in done:
            if other is arr or share(arr, other):
                _refuse_overlap(name, arr, out, inputs)
        done.append(arr)


def _refuse_overlap(name: str, arr: Any, out: dict[str, Any], inputs: dict[str, Any]) -> None:
    """Raise the InputError naming what ``out[name]`` overlaps (found again here, so the test
    loop builds no names: on a small plan's call that costs more than the tests)."""
    earlier = {}
    for n, a in out.items():
        if n == name:
            break
        earlier[n] = a
    for n, a in earlier.items():
        if a is arr:
            raise InputError(
                f"out[{name!r}] is the same array as out[{n!r}]; give each output its own array"
            )
    named = [(f"input {n!r}", a) for n, a in inputs.items()]
    named += [(f"out[{n!r}]", a) for n, a in earlier.items()]
    for what, other in named:
        if np.may_share_memory(arr, other):
            raise InputError(
                f"out[{name!r}] overlaps the memory of {what}; results would be "
                "silently wrong. Give it its own array"
            )


def strided_copy_bytes(x: Any) -> int:
    """Bytes of the C-contiguous copy a backend makes of a strided or unaligned input."""
    flags = getattr(x, "flags", None)
    if flags is None or (flags.c_contiguous and getattr(flags, "aligned", True)):
        return 0
    return int(x.size) * x.dtype.itemsize
